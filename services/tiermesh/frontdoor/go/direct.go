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
	Bounds          []int64    `json:"bounds"`
	Batched         bool       `json:"batched"`
	Tiers           []tierPlan `json:"tiers"` // lightest first; one for a model without tiers
	RateFields      []string   `json:"rate_fields"`
	QueueBound      int64      `json:"queue_bound"`
	ModelBound      int64      `json:"model_bound"`
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
	live      atomic.Pointer[liveness]   // the tiers with live workers, as last read
	reading   atomic.Bool                // a caller is reading them again
}

// tierPlan is where a job placed on one tier goes.
type tierPlan struct {
	Name         string     `json:"name"`
	MaxCost      int64      `json:"max_cost"` // the most a job costs for this tier to be its preferred (0: any)
	Variant      string     `json:"variant"`
	Streams      [][]string `json:"streams"` // by priority level, then length bucket
	Workers      string     `json:"workers"`
	Rate         string     `json:"rate"`
	ModelStreams []string   `json:"model_streams"`
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
	if !plan.complete() {
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

// complete: the plan names everything a placement needs, every tier the same levels.
func (p *directPlan) complete() bool {
	if len(p.Tiers) == 0 || len(p.Fields) != 3 || len(p.RateFields) == 0 || p.Script == "" {
		return false
	}
	for _, t := range p.Tiers {
		if len(t.Streams) != len(p.Tiers[0].Streams) || len(t.Streams) == 0 || t.Workers == "" {
			return false
		}
	}
	return true
}

// lengthOf is the length a job is bucketed by, as router/policy.py's job_length: its
// longest dimension over all inputs, the batch dimension left out when the model batches.
func (p *directPlan) lengthOf(job *tiermeshv1.Job) int64 {
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
	return length
}

// bucketOf is the length bucket of a job of that length, as router/policy.py's
// bucket_for: the first bucket whose bound is at least the length, the last for anything
// longer.
func (p *directPlan) bucketOf(length int64) int {
	for i, bound := range p.Bounds {
		if bound >= length {
			return i
		}
	}
	if len(p.Bounds) == 0 {
		return 0
	}
	return len(p.Bounds) - 1
}

// costOf is what a job of that length costs for the tier choice, as router/policy.py's
// job_cost: its rows (the first input's first dimension) times its length.
func costOf(job *tiermeshv1.Job, length int64) int64 {
	rows := int64(1)
	if len(job.Inputs) > 0 && len(job.Inputs[0].Shape) > 0 {
		rows = job.Inputs[0].Shape[0]
	}
	return rows * length
}

// chooseTier is router/tiers.py's choose_tier for a job of `cost` where every tier's
// backlog would meet its deadline: the preferred tier (the lightest whose max_cost admits
// the cost, the last for the rest) when it has live workers, else the first tier that has
// (light work spills to heavier tiers, heavy work to lighter ones only when the last is
// dead); -1 when none has. The admission script then refuses the job as late where the
// tier's backlog cannot drain in time, and the router, which reads every backlog, decides.
func chooseTier(tiers []tierPlan, cost int64, alive []bool) int {
	preferred := len(tiers) - 1
	for i := 0; i < len(tiers)-1; i++ {
		if tiers[i].MaxCost == 0 || cost <= tiers[i].MaxCost {
			preferred = i
			break
		}
	}
	if alive[preferred] {
		return preferred
	}
	for i := range tiers {
		if alive[i] {
			return i
		}
	}
	return -1
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
	options, err := redisTLS(url)
	if err != nil {
		log.Fatalf("frontdoor: cannot start: TIERMESH_REDIS_URL: %v", err)
	}
	options = append(options, redis.DialConnectTimeout(time.Second),
		redis.DialReadTimeout(5*time.Second), redis.DialWriteTimeout(5*time.Second))
	return &placer{most: most, queues: map[string]*admitQueue{}, pool: &redis.Pool{
		MaxIdle:     redisConnections,
		MaxActive:   redisConnections,
		Wait:        true,
		IdleTimeout: time.Minute,
		Dial: func() (redis.Conn, error) {
			return redis.DialURL(url, options...)
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
	if level < 1 || level > len(p.Tiers[0].Streams) {
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
	length := p.lengthOf(job)
	bucket := p.bucketOf(length)
	on := 0
	if len(p.Tiers) > 1 {
		alive, err := pl.alive(p)
		if err != nil {
			pl.failed(m, err)
			return nil
		}
		if on = chooseTier(p.Tiers, costOf(job, length), alive); on < 0 {
			pl.passed.Add(1) // no live tier as last read: the router reads again, and words it
			return nil
		}
	}
	tier := &p.Tiers[on]
	if bucket >= len(tier.Streams[level-1]) || bucket >= len(p.RateFields) {
		return nil
	}
	stream := tier.Streams[level-1][bucket]
	now := time.Now().UnixNano()
	leftMs := int64(-1)
	remember := p.RememberForever
	if job.DeadlineNs > 0 {
		if job.DeadlineNs <= now {
			pl.passed.Add(1) // the router refuses it, as one whose deadline passed before it was queued
			return nil
		}
		leftMs = (job.DeadlineNs - now) / int64(time.Millisecond)
		remember = leftMs + p.RememberMargin
	}
	// What the router sets on a job it queues (routing.py _admit, policy.py choose_stream),
	// written into the entry and then put back: the router places the job as it came.
	version, variant, tierWas, bucketWas := job.Version, job.Variant, job.Tier, job.Bucket
	routed, enqueued := job.Timing.RoutedNs, job.Timing.EnqueuedNs
	job.Version, job.Variant, job.Tier, job.Bucket = p.Version, tier.Variant, tier.Name, uint32(bucket)
	job.Timing.RoutedNs, job.Timing.EnqueuedNs = now, now
	entry, err := proto.Marshal(job)
	job.Version, job.Variant, job.Tier, job.Bucket = version, variant, tierWas, bucketWas
	job.Timing.RoutedNs, job.Timing.EnqueuedNs = routed, enqueued
	if err != nil {
		return nil
	}
	item := &admitItem{
		stream: stream, workers: tier.Workers, rate: tier.Rate, enqueued: p.EnqueuedPrefix + job.RequestId,
		guard: p.Guard, modelStreams: tier.ModelStreams,
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

// liveness is which of a plan's tiers had live workers (a heartbeat not expired) when
// the door last read them.
type liveness struct {
	readNs int64
	alive  []bool
}

// liveFor is how long the door chooses tiers by one reading of their workers: a tier that
// lost its last worker since is refused `noworker` by the admission script (the router
// then chooses among the others), and one that gained its first is left out as long.
const liveFor = 250 * time.Millisecond

// alive is which of the plan's tiers have live workers: the last reading while it is
// younger than liveFor, else read again (by one caller; the others keep the last reading
// meanwhile). The router reads the same (router/tier_state.py) for every batch.
func (pl *placer) alive(p *directPlan) ([]bool, error) {
	last := p.live.Load()
	now := time.Now()
	if last != nil && (now.UnixNano()-last.readNs < int64(liveFor) || !p.reading.CompareAndSwap(false, true)) {
		return last.alive, nil
	}
	defer p.reading.Store(false)
	conn, err := connection(pl.pool)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	nowMs := now.UnixMilli()
	for _, t := range p.Tiers {
		if err := conn.Send("ZCOUNT", t.Workers, nowMs, "+inf"); err != nil {
			return nil, err
		}
	}
	if err := conn.Flush(); err != nil {
		return nil, err
	}
	alive := make([]bool, len(p.Tiers))
	for i := range p.Tiers {
		n, err := redis.Int64(conn.Receive())
		if err != nil {
			return nil, err
		}
		alive[i] = n > 0
	}
	p.live.Store(&liveness{readNs: now.UnixNano(), alive: alive})
	return alive, nil
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
