package main

import (
	"math"
	"strconv"

	"inference"
	"tiermeshv1"
)

const prefix = "tiermesh."

// responseOf is the KServe response to a result, with the request's time breakdown and facts
// as the Python gateway sets them (gateway/facts.py): the same names, kinds and values.
func responseOf(r *tiermeshv1.Result, respondedNs int64) *inference.ModelInferResponse {
	resp := &inference.ModelInferResponse{
		ModelName:    r.Model,
		ModelVersion: r.Version,
		Id:           r.ClientRequestId,
		Parameters:   map[string]*inference.InferParameter{},
	}
	for _, t := range r.Outputs {
		resp.Outputs = append(resp.Outputs, &inference.ModelInferResponse_InferOutputTensor{
			Name: t.Name, Datatype: t.Datatype, Shape: t.Shape,
		})
		resp.RawOutputContents = append(resp.RawOutputContents, t.Raw)
	}
	p := resp.Parameters
	tm := r.Timing
	if tm == nil {
		tm = &tiermeshv1.Timing{}
	}
	stage := func(name string, start, end int64) {
		if start != 0 && end != 0 {
			p[prefix+name] = double(float64(end-start) / 1e6)
		}
	}
	stage("preprocess_ms", tm.ReceivedNs, tm.EnqueuedNs)
	stage("queue_ms", tm.EnqueuedNs, tm.DequeuedNs)
	stage("batch_wait_ms", tm.DequeuedNs, tm.BatchStartNs)
	stage("compute_ms", tm.BatchStartNs, tm.BatchEndNs)
	stage("postprocess_ms", tm.BatchEndNs, tm.PostprocessedNs)
	stage("delivery_ms", tm.PostprocessedNs, tm.DeliveredNs)
	stage("total_ms", tm.ReceivedNs, respondedNs)
	p[prefix+"batch_size"] = integer(int64(r.BatchSize))
	p[prefix+"bucket"] = integer(int64(r.Bucket))
	p[prefix+"tier"] = text(r.Tier)
	p[prefix+"worker"] = text(r.Worker)
	if r.Variant != "" {
		p[prefix+"variant"] = text(r.Variant)
	}
	for _, key := range []string{"tokens", "padded_tokens"} {
		if v, ok := r.Annotations[key]; ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				p[prefix+key] = integer(n)
			}
		}
	}
	if v, ok := r.Annotations["truncated"]; ok {
		p[prefix+"truncated"] = boolean(v == "true")
	}
	if r.Annotations["cascaded"] == "true" {
		p[prefix+"cascaded"] = boolean(true)
		confidence, err := strconv.ParseFloat(r.Annotations["edge_confidence"], 64)
		if err != nil {
			confidence = math.NaN()
		}
		p[prefix+"edge_confidence"] = double(confidence)
	}
	return resp
}

func double(v float64) *inference.InferParameter {
	return &inference.InferParameter{ParameterChoice: &inference.InferParameter_DoubleParam{DoubleParam: v}}
}

func integer(v int64) *inference.InferParameter {
	return &inference.InferParameter{ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: v}}
}

func text(v string) *inference.InferParameter {
	return &inference.InferParameter{ParameterChoice: &inference.InferParameter_StringParam{StringParam: v}}
}

func boolean(v bool) *inference.InferParameter {
	return &inference.InferParameter{ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: v}}
}
