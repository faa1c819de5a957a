package main

import (
	"encoding/json"
	"log"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/protobuf/proto"
	"github.com/gomodule/redigo/redis"
	"inference"
	"tiermeshv1"
)

// The ModelConfig parameter holding a model's placement plan (core/direct_plan.py), and
// the header the door reads its models with to be given it (gateway/servicer.py).
const (
	planParameter = "tiermesh.direct"
	planHeader    = "x-tiermesh-placement"
)

// directPlan is where the door may queue a model's jobs itself, without the router: the
// plan the Python gateway decided from the model's config (core/direct_plan.py says when
// a model has one and what each field means).
type directPlan struct {
	Version         string     `json:"version"`
	Variant         string     `json:"variant"`
	Tier            string     `json:"tier"`
	Bounds          []int64    `json:"bounds"`
	Batched         bool       `json:"batched"`
	Streams         [][]string `json:"streams"`
	RateFields      []string   `json:"rate_fields"`
	Workers         string     `json:"workers"`
	Rate            string     `json:"rate"`
	QueueBound      int64      `json:"queue_bound"`
	ModelBound      int64      `json:"model_bound"`
	ModelStreams    []string   `json:"model_streams"`
	EnqueuedPrefix  string     `json:"enqueued_prefix"`
	Guard           string     `json:"guard"`
	Fields          []string   `json:"fields"`
	Script          string     `json:"script"`
	RememberMargin  int64      `json:"remember_margin_ms"`
	RememberForever int64      `json:"remember_no_deadline_ms"`
	Text            *textPlan  `json:"text"` // a text model's tokenizer (nil: no text)

	admission *redis.Script // run by its SHA1, loaded where Redis lacks it
	tokenizer *wordPiece
	queue     atomic.Pointer[admitQueue] // the placer's queue for this plan, once asked
}

// planOf is the model's plan from its config, or nil (none, or one the door cannot read).
func planOf(cfg *inference.ModelConfig) *directPlan {
	p, ok := cfg.Parameters[planParameter]
	if !ok || p.StringValue == "" {
		return nil
	}
	plan := &directPlan{}
	if err := json.Unmarshal([]byte(p.StringValue), plan); err != nil {
		log.Printf("model %s: its placement plan is unreadable (%v); the router places its jobs", cfg.Name, err)
		return nil
	}
	if len(plan.Streams) == 0 || len(plan.Fields) != 3 || len(plan.RateFields) == 0 || plan.Script == "" {
		return nil
	}
	plan.admission = redis.NewScript(-1, plan.Script) // the key count goes with each call
	if plan.Text != nil {
		wp, err := loadWordPiece(plan.Text)
		if err != nil {
			log.Printf("model %s: its tokenizer is unreadable (%v); the router places its jobs", cfg.Name, err)
			return nil
		}
		plan.tokenizer = wp
	}
	return plan
}

// bucketOf is the length bucket of a job, as router/policy.py's job_length and bucket_for:
// its longest dimension over all inputs (the batch dimension left out when the model
// batches), the first bucket whose bound is at least that, the last for anything longer.
func (p *directPlan) bucketOf(job *tiermeshv1.Job) int {
	if len(p.Bounds) == 0 {
		return 0
	}
	skip := 0
	if p.Batched {
		skip = 1
	}
	length, first := int64(1), true
	for _, t := range job.Inputs {
		longest := int64(1)
		if len(t.Shape) > skip {
			longest = t.Shape[skip]
			for _, d := range t.Shape[skip:] {
				if d > longest {
					longest = d
				}
			}
		}
		if first || longest > length {
			length, first = longest, false
		}
	}
	for i, bound := range p.Bounds {
		if bound >= length {
			return i
		}
	}
	return len(p.Bounds) - 1
}

// placer queues jobs with the admission script, as the router does, for models with a
// plan; every job it does not queue (no plan, a version the plan is not for, a rollout
// under way, a refusal, Redis trouble) goes to the router, which decides again.
type placer struct {
	pool   *redis.Pool
	placed atomic.Int64 // jobs queued here
	passed atomic.Int64 // jobs with a plan the router placed after all
	calls  atomic.Int64 // admission script calls made (each for one or more jobs)
	most   int          // jobs one call carries at most
	mu     sync.Mutex
	queues map[string]*admitQueue // by script and entry fields: jobs one call may carry
	// When the last Redis error was logged (unix ns): one line per errorLogEvery at most,
	// not one per job while Redis is away.
	loggedNs atomic.Int64
}

const (
	errorLogEvery = 10 * time.Second
	// Connections to Redis, kept open: one admission call at a time per queue (admit.go),
	// and a plan or two per mesh, so a few are plenty.
	redisConnections = 8
	// The longest a call waits for a free connection before the router places its jobs.
	connectionWait = time.Second
)

func newPlacer(url string, most int) *placer {
	return &placer{most: most, queues: map[string]*admitQueue{}, pool: &redis.Pool{
		MaxIdle:     redisConnections,
		MaxActive:   redisConnections,
		Wait:        true,
		IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) {
			return redis.DialURL(url, redis.DialConnectTimeout(time.Second),
				redis.DialReadTimeout(5*time.Second), redis.DialWriteTimeout(5*time.Second))
		},
	}}
}

// place queues the job on its stream and returns the reply the router would have given,
// or nil when the router is to place it. The job is left as it came.
func (pl *placer) place(m *model, job *tiermeshv1.Job) *tiermeshv1.RouteReply {
	p := m.plan
	if p == nil || job.Timing == nil || (job.Version != "" && job.Version != p.Version) {
		return nil
	}
	level := int(job.Priority)
	if level < 1 || level > len(p.Streams) {
		return nil
	}
	// A text model's job as the router's input processing leaves it (router/inputs.py): its
	// text as token ids and mask, `truncated` told; put back as it came after the entry.
	inputs, annotations := job.Inputs, job.Annotations
	if p.tokenizer != nil {
		if !p.tokenize(job) { // a text the router's tokenizer is for
			pl.passed.Add(1)
			return nil
		}
		defer func() { job.Inputs, job.Annotations = inputs, annotations }()
	}
	bucket := p.bucketOf(job)
	if bucket >= len(p.Streams[level-1]) || bucket >= len(p.RateFields) {
		return nil
	}
	stream := p.Streams[level-1][bucket]
	if job.DeadlineNs > 0 && job.DeadlineNs <= time.Now().UnixNano() {
		return nil // the router refuses it, as one whose deadline passed before it was queued
	}
	now := time.Now().UnixNano()
	leftMs := int64(-1)
	remember := p.RememberForever
	if job.DeadlineNs > 0 {
		if job.DeadlineNs <= now {
			pl.passed.Add(1)
			return nil
		}
		leftMs = (job.DeadlineNs - now) / int64(time.Millisecond)
		remember = leftMs + p.RememberMargin
	}
	// What the router sets on a job it queues (routing.py _admit, policy.py choose_stream),
	// written into the entry and then put back: the router places the job as it came.
	version, variant, tier, bucketWas := job.Version, job.Variant, job.Tier, job.Bucket
	routed, enqueued := job.Timing.RoutedNs, job.Timing.EnqueuedNs
	job.Version, job.Variant, job.Tier, job.Bucket = p.Version, p.Variant, p.Tier, uint32(bucket)
	job.Timing.RoutedNs, job.Timing.EnqueuedNs = now, now
	entry, err := proto.Marshal(job)
	job.Version, job.Variant, job.Tier, job.Bucket = version, variant, tier, bucketWas
	job.Timing.RoutedNs, job.Timing.EnqueuedNs = routed, enqueued
	if err != nil {
		return nil
	}
	item := &admitItem{
		stream: stream, workers: p.Workers, rate: p.Rate, enqueued: p.EnqueuedPrefix + job.RequestId,
		guard: p.Guard, modelStreams: p.ModelStreams,
		values: []interface{}{p.QueueBound, p.ModelBound, p.RateFields[bucket], leftMs, remember, entry,
			job.TraceContext["traceparent"], job.TraceContext["tracestate"]},
	}
	pl.queue(p).admit(item)
	if item.err != nil {
		pl.failed(m, item.err)
		return nil
	}
	if item.outcome != "ok" && item.outcome != "dup" {
		// A refusal or a rollout: the router decides, and words what the caller hears.
		pl.passed.Add(1)
		return nil
	}
	pl.placed.Add(1)
	return &tiermeshv1.RouteReply{RequestId: job.RequestId, Stream: stream, EntryId: item.detail, Version: p.Version}
}

// queue is the admission queue of the plan's script and entry fields (shared by every plan
// with the same ones: one call may carry jobs of several models), kept on the plan after
// its first job.
func (pl *placer) queue(p *directPlan) *admitQueue {
	if q := p.queue.Load(); q != nil {
		return q
	}
	key := p.Script + "\x00" + p.Fields[0] + "\x00" + p.Fields[1] + "\x00" + p.Fields[2]
	pl.mu.Lock()
	defer pl.mu.Unlock()
	q, ok := pl.queues[key]
	if !ok {
		q = &admitQueue{pool: pl.pool, script: p.admission, fields: p.Fields, calls: &pl.calls, most: pl.most}
		pl.queues[key] = q
	}
	p.queue.Store(q)
	return q
}

// failed: Redis could not be asked; the router places the job. Logged once per
// errorLogEvery at most, not once a job while Redis is away.
func (pl *placer) failed(m *model, err error) {
	pl.passed.Add(1)
	now := time.Now().UnixNano()
	last := pl.loggedNs.Load()
	if now-last >= int64(errorLogEvery) && pl.loggedNs.CompareAndSwap(last, now) {
		log.Printf("placing a job of %s: %v; the router places it (and all until Redis answers)", m.name, err)
	}
}

// describe is the door's stop line's word on it.
func (pl *placer) describe() string {
	return "placed here " + strconv.FormatInt(pl.placed.Load(), 10) + " (in " +
		strconv.FormatInt(pl.calls.Load(), 10) + " admission calls), by the router after all " +
		strconv.FormatInt(pl.passed.Load(), 10)
}

// tokenize sets the job's inputs and annotations to those the router's input processing
// gives it; false (the job untouched) when the door does not tokenize its text.
func (p *directPlan) tokenize(job *tiermeshv1.Job) bool {
	t := p.Text
	if len(job.Inputs) != 1 || job.Inputs[0].Name != t.Input || job.Inputs[0].Datatype != "BYTES" {
		return false
	}
	rows := int64(1)
	for _, n := range job.Inputs[0].Shape {
		rows *= n
	}
	if rows < 1 {
		return false
	}
	ids, mask, length, truncated, ok := p.tokenizer.tokenized(job.Inputs[0].Raw, rows)
	if !ok {
		return false
	}
	shape := []int64{rows, length}
	annotations := make(map[string]string, len(job.Annotations)+1)
	for k, v := range job.Annotations {
		annotations[k] = v
	}
	annotations[t.Truncated] = strconv.FormatBool(truncated)
	job.Inputs = []*tiermeshv1.Tensor{
		{Name: t.IdsName, Datatype: "INT64", Shape: shape, Raw: ids},
		{Name: t.MaskName, Datatype: "INT64", Shape: shape, Raw: mask},
	}
	job.Annotations = annotations
	return true
}
