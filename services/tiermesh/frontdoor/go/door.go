package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/golang/protobuf/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"inference"
	"tiermeshv1"
)

const (
	modelInfer    = "/inference.GRPCInferenceService/ModelInfer"
	retryAfterKey = "retry-after-ms"
	maxWait       = 24 * time.Hour // nothing waits longer, whatever its timeout says
)

// The request parameters the door reads itself; a request with any other goes to the
// Python gateway.
var ownParameters = map[string]bool{"priority": true, "timeout": true}

var elementSize = map[string]int{
	"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2,
	"INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8,
}

type door struct {
	cfg      config
	models   *models
	router   *routerClient
	pending  *pending
	proxy    *proxy
	delivery string  // this door's Delivery address, on every job
	books    *books  // nil: the calls answered here are not booked at the gateway
	placer   *placer // nil: the router places every job
	limits   *limits // nil: the fixed cap alone

	inFlight atomic.Int64
	metrics  *metrics
}

func contextError(ctx context.Context) error {
	if ctx.Err() == context.DeadlineExceeded {
		return status.Error(codes.DeadlineExceeded, "deadline exceeded while waiting for the result")
	}
	return status.Error(codes.Canceled, "the caller cancelled the request")
}

// handle is every call on the public port.
func (d *door) handle(_ interface{}, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	if method != modelInfer || (d.cfg.tracing && !d.cfg.traceable) {
		return d.passOn(stream, method, nil)
	}
	f := &frame{}
	if err := stream.RecvMsg(f); err != nil {
		return err
	}
	ctx := stream.Context()
	now := time.Now()
	c, ok := d.classOf(ctx, f.data)
	if !ok { // not one the door takes: the Python gateway answers (and says what is wrong)
		return d.passOn(stream, method, f)
	}
	// A call captured at the gateway is booked with its job, refused or not, so its job
	// is built first; any other is admitted or refused from its head alone, its tensors
	// unread.
	var job *tiermeshv1.Job
	deadline := d.deadlineOf(ctx, &c, now)
	sampled := d.books != nil && d.books.sampled()
	if sampled {
		if job = d.jobOf(&c, f.data, now, deadline); job == nil {
			return d.passOn(stream, method, f)
		}
	}
	key := c.key()
	if err := d.admit(stream, &c, key, now, deadline, job); err != nil {
		return err
	}
	if job == nil {
		if job = d.jobOf(&c, f.data, now, deadline); job == nil {
			d.inFlight.Add(-1)
			if d.limits != nil {
				d.limits.forget(key)
			}
			return d.passOn(stream, method, f)
		}
	}
	defer d.inFlight.Add(-1)
	entry := &tiermeshv1.Entry{
		RequestId: job.RequestId, Model: job.Model, Version: job.Version, ReceivedNs: job.Timing.ReceivedNs,
		Trace: c.traced,
	}
	if sampled { // captured at the gateway, job and all
		entry.Job = job
	}
	resp, wait, expired, err := d.infer(ctx, stream, c.model, job, entry)
	if d.limits != nil {
		budget := int64(0)
		if job.DeadlineNs > 0 {
			budget = job.DeadlineNs - job.Timing.GetReceivedNs()
		}
		d.limits.release(key, time.Now().UnixNano(), wait, isLate(wait, budget, expired))
	}
	d.ended(entry, status.Code(err))
	if err != nil {
		return err
	}
	return stream.SendMsg(resp)
}

// passOn hands the call to the Python gateway as it came (f: its request, already read).
func (d *door) passOn(stream grpc.ServerStream, method string, f *frame) error {
	d.metrics.passed.Add(1)
	return d.proxy.pass(stream, method, f)
}

// admit takes a slot for the call, under the door's cap and then under its class's
// adaptive limit, or refuses it with when to come back: the error to return. job is nil
// unless the call is captured (the refusal is then booked with it).
func (d *door) admit(stream grpc.ServerStream, c *class, key limitKey, now, deadline time.Time, job *tiermeshv1.Job) error {
	var err error
	var retry int64
	if d.inFlight.Add(1) > d.cfg.maxInFlight {
		retry = d.cfg.retryAfterMs
		err = status.Errorf(codes.ResourceExhausted, "too many requests in flight at this gateway (%d)", d.cfg.maxInFlight)
	} else if d.limits != nil {
		budget := deadline.Sub(now).Nanoseconds()
		if retry = d.limits.acquire(key, now.UnixNano(), budget); retry > 0 {
			err = status.Errorf(codes.ResourceExhausted, "model '%s' has as many priority %d requests in flight as it drains in time (%d); retry later",
				c.model.name, c.priority, d.limits.current(key, budget))
		}
	}
	if err == nil {
		return nil
	}
	d.inFlight.Add(-1)
	entry := &tiermeshv1.Entry{Model: c.model.name, Version: c.head.version, ReceivedNs: now.UnixNano(), Trace: c.traced, Job: job}
	if job != nil {
		entry.RequestId = job.RequestId
	} else if c.traced != nil { // its span names it
		entry.RequestId = requestID()
	}
	d.ended(entry, codes.ResourceExhausted)
	stream.SetTrailer(metadata.Pairs(retryAfterKey, strconv.FormatInt(retry, 10)))
	return err
}

// ended counts a call the door answered or refused, and books it at the Python gateway.
func (d *door) ended(entry *tiermeshv1.Entry, code codes.Code) {
	d.metrics.ended(entry.Model, code)
	if d.books == nil {
		return
	}
	entry.Code = int32(code)
	if entry.EndedNs == 0 {
		entry.EndedNs = time.Now().UnixNano()
	}
	d.books.call(entry)
}

// infer routes the job and waits for its result; what it learns on the way goes in entry
// (where the job was placed, its result, whether the caller left while it was queued).
// wait: its queue wait (queueWaitNs), or all its time when it expired unanswered
// (expired); -1 when the call says nothing of the queue (limit.go).
func (d *door) infer(ctx context.Context, stream grpc.ServerStream, m *model, job *tiermeshv1.Job, entry *tiermeshv1.Entry) (resp proto.Message, wait int64, expired bool, err error) {
	wait = -1
	deadline := time.Unix(0, job.DeadlineNs)
	results := d.pending.register(job.RequestId)
	defer d.pending.discard(job.RequestId)
	began := time.Now().UnixNano()
	var reply *tiermeshv1.RouteReply
	placedHere := false
	if d.placer != nil {
		reply = d.placer.place(m, job)
		placedHere = reply != nil
	}
	if reply == nil {
		reply, err = d.router.route(ctx, job, deadline)
	}
	if t := entry.Trace; t != nil && err == nil {
		t.Stream, t.EntryId, t.RouteBeganNs, t.RouteEndedNs = reply.Stream, reply.EntryId, began, time.Now().UnixNano()
		t.PlacedHere = placedHere
	}
	if err != nil {
		if ctx.Err() != nil { // the job may be queued already: its workers are told
			d.callerLeft(entry, deadline)
		}
		return nil, wait, expired, err
	}
	if reply.Code != 0 {
		if advice, ok := reply.XRetryAfterMs.(*tiermeshv1.RouteReply_RetryAfterMs); ok {
			stream.SetTrailer(metadata.Pairs(retryAfterKey, strconv.FormatInt(advice.RetryAfterMs, 10)))
		}
		return nil, wait, expired, status.Error(codes.Code(reply.Code), reply.Message)
	}
	d.metrics.accepted.Add(1)
	entry.Routed, entry.RoutedVersion, entry.ShadowRequestId = true, reply.Version, reply.ShadowRequestId
	if reply.ShadowRequestId != "" && d.books != nil {
		d.books.mirrored(&tiermeshv1.Mirrored{ShadowRequestId: reply.ShadowRequestId, Model: job.Model, DeadlineNs: job.DeadlineNs})
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case result := <-results:
		d.metrics.resolved.Add(1)
		received := job.Timing.GetReceivedNs()
		if t := result.Timing; t.GetBatchStartNs() > 0 && t.GetEnqueuedNs() > 0 {
			wait = queueWaitNs(t)
		} else if codes.Code(result.Code) == codes.DeadlineExceeded { // expired in its queue
			wait, expired = time.Now().UnixNano()-received, true
		}
		entry.Result = bookedResult(result, reply.ShadowRequestId != "", entry.Job != nil || entry.Trace != nil)
		if result.Code != 0 {
			return nil, wait, expired, status.Error(codes.Code(result.Code), result.Message)
		}
		entry.EndedNs = time.Now().UnixNano()
		return responseOf(result, entry.EndedNs), wait, expired, nil
	case <-timer.C:
		wait, expired = time.Now().UnixNano()-job.Timing.GetReceivedNs(), true
		return nil, wait, expired, status.Error(codes.DeadlineExceeded, "deadline exceeded while waiting for the result")
	case <-ctx.Done():
		d.callerLeft(entry, deadline)
		return nil, wait, expired, contextError(ctx)
	}
}

// callerLeft: the workers are to skip the job if they have not computed it yet.
func (d *door) callerLeft(entry *tiermeshv1.Entry, deadline time.Time) {
	entry.CallerLeft = true
	entry.MsLeft = time.Until(deadline).Milliseconds()
}

// bookedResult is what the gateway's books read of a result: everything but the output
// bytes, which only a mirrored call's result keeps (they are compared with the canary's),
// and the annotations, which only a sampled or traced call's keeps (the capture and the
// span's facts read its tokens).
func bookedResult(r *tiermeshv1.Result, mirrored, sampled bool) *tiermeshv1.Result {
	if mirrored {
		return r
	}
	out := &tiermeshv1.Result{
		RequestId: r.RequestId, ClientRequestId: r.ClientRequestId, Model: r.Model, Version: r.Version,
		Code: r.Code, Message: r.Message, Timing: r.Timing, Tier: r.Tier, Priority: r.Priority,
		Bucket: r.Bucket, BatchSize: r.BatchSize, Variant: r.Variant, Worker: r.Worker,
		BatchTraceparent: r.BatchTraceparent, Direct: r.Direct,
	}
	for _, t := range r.Outputs {
		out.Outputs = append(out.Outputs, &tiermeshv1.Tensor{Name: t.Name, Datatype: t.Datatype, Shape: t.Shape})
	}
	if sampled {
		out.Annotations = r.Annotations
	}
	return out
}

func requestID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		binary.LittleEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
	}
	b[6] = (b[6] & 0x0f) | 0x40 // a version-4 UUID, as the Python gateway's uuid4().hex
	b[8] = (b[8] & 0x3f) | 0x80
	return hex.EncodeToString(b[:])
}

// class is what the door reads of a call before it admits it: the model it takes the
// call for, its head, its priority and timeout, and its span ids when it is traced.
type class struct {
	model     *model
	head      head
	priority  int64
	timeoutUs int64
	traced    *tiermeshv1.Trace
	carrier   map[string]string
}

func (c *class) key() limitKey { return limitKey{c.model.name, int32(c.priority)} }

// deadlineOf is the call's deadline, as the Python gateway's effective_deadline_ns: the
// earliest of the gRPC deadline and the timeout parameter, the default timeout with
// neither, never past maxWait.
func (d *door) deadlineOf(ctx context.Context, c *class, now time.Time) time.Time {
	deadline := now.Add(maxWait)
	if dl, has := ctx.Deadline(); has && dl.Before(deadline) {
		deadline = dl
	}
	if c.timeoutUs > 0 {
		if t := now.Add(time.Duration(c.timeoutUs) * time.Microsecond); t.Before(deadline) {
			deadline = t
		}
	} else if _, has := ctx.Deadline(); !has {
		if t := now.Add(d.cfg.defaultTimeout); t.Before(deadline) {
			deadline = t
		}
	}
	return deadline
}

// classOf is the class of a call the door takes itself, read from its head; ok is false
// for one it passes on: any doubt (an unknown model or version, a parameter it does not
// read, a priority out of range, a traceparent it cannot read) goes to the Python
// gateway, which decides and words it.
func (d *door) classOf(ctx context.Context, data []byte) (class, bool) {
	h, ok := headOf(data)
	if !ok {
		return class{}, false
	}
	m := d.models.get(h.model)
	if m == nil || !m.takeable() || !(h.version == "" || m.versions[h.version]) {
		return class{}, false
	}
	md, _ := metadata.FromIncomingContext(ctx)
	traced, carrier, ok := d.traceOf(md)
	if !ok {
		return class{}, false
	}
	priority, timeoutUs, ok := ownParametersOf(h.params)
	if !ok {
		return class{}, false
	}
	if priority == 0 {
		priority = int64(m.defaultPriority)
	} else if priority < 1 || uint64(priority) > m.priorityLevels {
		return class{}, false
	}
	if traced != nil {
		traced.ClientRequestId = h.id
	}
	return class{model: m, head: h, priority: priority, timeoutUs: timeoutUs, traced: traced, carrier: carrier}, true
}

// jobOf is the job of a call of class c (the whole request parsed at last), or nil for one
// the door passes on after all: typed contents, a tensor or output the Python gateway
// would refuse (it decides and words it).
func (d *door) jobOf(c *class, data []byte, now, deadline time.Time) *tiermeshv1.Job {
	req := &inference.ModelInferRequest{}
	if proto.Unmarshal(data, req) != nil {
		return nil
	}
	m := c.model
	inputs, ok := validInputs(m, req)
	if !ok {
		return nil
	}
	var requested []string
	for _, out := range req.Outputs {
		if !m.outputs[out.Name] || len(out.Parameters) > 0 {
			return nil
		}
		requested = append(requested, out.Name)
	}
	return &tiermeshv1.Job{
		RequestId:        requestID(),
		ClientRequestId:  req.Id,
		Model:            m.name,
		Version:          req.ModelVersion,
		Priority:         uint32(c.priority),
		DeadlineNs:       deadline.UnixNano(),
		Gateway:          d.delivery,
		Inputs:           inputs,
		RequestedOutputs: requested,
		Timing:           &tiermeshv1.Timing{ReceivedNs: now.UnixNano()},
		TraceContext:     c.carrier,
	}
}

// ownParametersOf reads priority and timeout; ok is false for any other parameter or a
// value of the wrong kind.
func ownParametersOf(params map[string]*inference.InferParameter) (priority, timeoutUs int64, ok bool) {
	for key, p := range params {
		if !ownParameters[key] {
			return 0, 0, false
		}
		var n int64
		switch v := p.ParameterChoice.(type) {
		case *inference.InferParameter_Int64Param:
			n = v.Int64Param
		case *inference.InferParameter_Uint64Param:
			if v.Uint64Param > 1<<62 {
				return 0, 0, false
			}
			n = int64(v.Uint64Param)
		default:
			return 0, 0, false
		}
		if n < 0 {
			return 0, 0, false
		}
		if key == "priority" {
			priority = n
		} else {
			timeoutUs = n
		}
	}
	return priority, timeoutUs, true
}

// validInputs are the request's tensors when every check of the Python gateway's
// validation (gateway/requests.py) passes.
func validInputs(m *model, req *inference.ModelInferRequest) ([]*tiermeshv1.Tensor, bool) {
	if len(req.Inputs) != len(m.inputs) || len(req.RawInputContents) != len(req.Inputs) {
		return nil, false
	}
	seen := map[string]bool{}
	batch := int64(-1)
	tensors := make([]*tiermeshv1.Tensor, 0, len(req.Inputs))
	for i, t := range req.Inputs {
		spec := m.input(t.Name)
		if spec == nil || seen[t.Name] || t.Datatype != spec.datatype || len(t.Parameters) > 0 || t.Contents != nil {
			return nil, false
		}
		seen[t.Name] = true
		dims := t.Shape
		for _, n := range dims {
			if n < 1 {
				return nil, false
			}
		}
		if m.maxBatchSize > 0 {
			if len(dims) != len(spec.dims)+1 || dims[0] > m.maxBatchSize {
				return nil, false
			}
			if batch >= 0 && dims[0] != batch {
				return nil, false
			}
			batch = dims[0]
			dims = dims[1:]
		} else if len(dims) != len(spec.dims) {
			return nil, false
		}
		for j, want := range spec.dims {
			if want != -1 && dims[j] != want {
				return nil, false
			}
			if want == -1 && m.maxSequence > 0 && dims[j] > m.maxSequence {
				return nil, false
			}
		}
		count := int64(1)
		for _, n := range t.Shape {
			count *= n
			if count > 1<<40 {
				return nil, false
			}
		}
		raw := req.RawInputContents[i]
		if t.Datatype == "BYTES" {
			if !validBytes(raw, count, m.maxTextBytes) {
				return nil, false
			}
		} else if size, known := elementSize[t.Datatype]; !known || int64(len(raw)) != count*int64(size) {
			return nil, false
		}
		tensors = append(tensors, &tiermeshv1.Tensor{Name: t.Name, Datatype: t.Datatype, Shape: t.Shape, Raw: raw})
	}
	return tensors, true
}

// validBytes: exactly `count` length-prefixed UTF-8 elements (KServe v2 BYTES framing),
// each at most maxLen bytes (0: no bound).
func validBytes(raw []byte, count, maxLen int64) bool {
	for i := int64(0); i < count; i++ {
		if len(raw) < 4 {
			return false
		}
		n := int64(binary.LittleEndian.Uint32(raw))
		raw = raw[4:]
		if int64(len(raw)) < n || (maxLen > 0 && n > maxLen) || !utf8.Valid(raw[:n]) {
			return false
		}
		raw = raw[n:]
	}
	return len(raw) == 0
}
