package main

import (
	"context"
	"log"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"inference"
)

// REFRESH is how often the door reads the Python gateway's models again: a model loaded,
// unloaded or changed there is served (or passed through) here within that long.
const REFRESH = 2 * time.Second

type tensorSpec struct {
	name     string
	datatype string
	dims     []int64
}

// model is what the door needs to take a request for one model itself.
type model struct {
	name            string
	versions        map[string]bool
	inputs          []tensorSpec
	outputs         map[string]bool
	maxBatchSize    int64
	priorityLevels  uint64
	defaultPriority uint64
	maxTextBytes    int64 // 0: not a text model
	maxSequence     int64 // 0: no bound
	// Served here: ready, not generative (decoupled), no response cache.
	takeable bool
}

func (m *model) input(name string) *tensorSpec {
	for i := range m.inputs {
		if m.inputs[i].name == name {
			return &m.inputs[i]
		}
	}
	return nil
}

type models struct {
	client inference.GRPCInferenceServiceClient
	known  atomic.Value // map[string]*model
}

func newModels(conn *grpc.ClientConn) *models {
	m := &models{client: inference.NewGRPCInferenceServiceClient(conn)}
	m.known.Store(map[string]*model{})
	return m
}

func (m *models) get(name string) *model {
	return m.known.Load().(map[string]*model)[name]
}

func (m *models) keepFresh(every time.Duration) {
	for {
		if known, err := m.read(); err == nil {
			m.known.Store(known)
		} else {
			log.Printf("reading the models from the Python gateway: %v", err)
		}
		time.Sleep(every)
	}
}

func (m *models) read() (map[string]*model, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	index, err := m.client.RepositoryIndex(ctx, &inference.RepositoryIndexRequest{})
	if err != nil {
		return nil, err
	}
	// A model is taken here only while every version the index lists for it is ready.
	ready := map[string]bool{}
	for _, entry := range index.Models {
		r, seen := ready[entry.Name]
		ready[entry.Name] = (r || !seen) && entry.State == "READY"
	}
	known := map[string]*model{}
	for _, entry := range index.Models {
		if _, seen := known[entry.Name]; seen {
			continue
		}
		meta, err := m.client.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: entry.Name})
		if err != nil {
			return nil, err
		}
		cfg, err := m.client.ModelConfig(ctx, &inference.ModelConfigRequest{Name: entry.Name})
		if err != nil {
			return nil, err
		}
		known[entry.Name] = modelOf(ready[entry.Name], meta, cfg.Config)
	}
	return known, nil
}

func modelOf(ready bool, meta *inference.ModelMetadataResponse, cfg *inference.ModelConfig) *model {
	m := &model{
		name:         cfg.Name,
		versions:     map[string]bool{},
		outputs:      map[string]bool{},
		maxBatchSize: int64(cfg.MaxBatchSize),
	}
	for _, v := range meta.Versions {
		m.versions[v] = true
	}
	for _, in := range meta.Inputs {
		dims := in.Shape
		if m.maxBatchSize > 0 && len(dims) > 0 {
			dims = dims[1:]
		}
		m.inputs = append(m.inputs, tensorSpec{in.Name, in.Datatype, dims})
	}
	for _, out := range meta.Outputs {
		m.outputs[out.Name] = true
	}
	if b := cfg.GetDynamicBatching(); b != nil {
		m.priorityLevels = b.PriorityLevels
		m.defaultPriority = b.DefaultPriorityLevel
	}
	m.maxTextBytes = parameterInt(cfg, "max_text_bytes")
	m.maxSequence = parameterInt(cfg, "max_sequence")
	decoupled := cfg.ModelTransactionPolicy != nil && cfg.ModelTransactionPolicy.Decoupled
	cached := cfg.ResponseCache != nil && cfg.ResponseCache.Enable
	m.takeable = ready && !decoupled && !cached
	return m
}

func parameterInt(cfg *inference.ModelConfig, key string) int64 {
	p, ok := cfg.Parameters[key]
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(p.StringValue, 10, 64)
	if err != nil {
		return 0
	}
	return n
}
