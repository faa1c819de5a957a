package main

import (
	"context"
	"log"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"inference"
)

// refreshEvery is how often the door reads the Python gateway's repository index: a model
// loaded, unloaded or left without workers there is served (or passed through) here within
// that long. A model's metadata and config are read again when its versions change, and all
// of them every fullReadEvery refreshes (a config changed in place).
const (
	refreshEvery  = 2 * time.Second
	fullReadEvery = 15
)

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
	indexed         indexed
	servable        bool        // not generative (decoupled), no response cache
	plan            *directPlan // nil: the router places every job of the model
}

// takeable: the door serves the model's requests itself (ready, and servable).
func (m *model) takeable() bool {
	return m.indexed.ready && m.servable
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

// indexed is what the repository index says of one model.
type indexed struct {
	versions string // its versions as listed, in order
	ready    bool   // every version ready
}

func newModels(conn *grpc.ClientConn) *models {
	m := &models{client: inference.NewGRPCInferenceServiceClient(conn)}
	m.known.Store(map[string]*model{})
	return m
}

func (m *models) get(name string) *model {
	return m.known.Load().(map[string]*model)[name]
}

// keepFresh reads the index every `every`, after the first read (refresh, before serving).
func (m *models) keepFresh(every time.Duration) {
	for turn := 1; ; turn++ {
		time.Sleep(every)
		m.refresh(turn%fullReadEvery == 0)
	}
}

// refresh reads the index once (every model's metadata and config when `full`).
func (m *models) refresh(full bool) {
	if known, err := m.read(full); err == nil {
		m.known.Store(known)
	} else {
		log.Printf("reading the models from the Python gateway: %v", err)
	}
}

// read is the models as the index says now; a model whose versions did not change keeps
// what was read of it before unless `full`.
func (m *models) read(full bool) (map[string]*model, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	index, err := m.client.RepositoryIndex(ctx, &inference.RepositoryIndexRequest{})
	if err != nil {
		return nil, err
	}
	// A model is taken here only while every version the index lists for it is ready.
	entries := map[string]*indexed{}
	for _, entry := range index.Models {
		e, seen := entries[entry.Name]
		if !seen {
			e = &indexed{ready: true}
			entries[entry.Name] = e
		}
		e.versions += entry.Version + ","
		e.ready = e.ready && entry.State == "READY"
	}
	before := m.known.Load().(map[string]*model)
	known := map[string]*model{}
	for name, e := range entries {
		if old, ok := before[name]; ok && !full && old.indexed.versions == e.versions {
			again := *old
			again.indexed = *e
			known[name] = &again
			continue
		}
		meta, err := m.client.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: name})
		if err != nil {
			return nil, err
		}
		cfg, err := m.client.ModelConfig(metadata.AppendToOutgoingContext(ctx, planHeader, "1"),
			&inference.ModelConfigRequest{Name: name})
		if err != nil {
			return nil, err
		}
		known[name] = modelOf(*e, meta, cfg.Config)
	}
	return known, nil
}

func modelOf(e indexed, meta *inference.ModelMetadataResponse, cfg *inference.ModelConfig) *model {
	m := &model{
		indexed:      e,
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
	m.servable = !decoupled && !cached
	m.plan = planOf(cfg)
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
