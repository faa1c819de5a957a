package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"

	"tiermeshv1"
)

// Adaptive in-flight limits per (model, priority): the Python gateway's rules
// (gateway/adaptive_limit.py, which explains them) with the same constants, so a class is
// limited alike whichever door takes its calls. tests/integration/test_door_limits.py runs
// one event script through both and compares every decision.
const (
	limitIntervalNs = 100_000_000
	limitInitial    = 256
	limitMinimum    = 4
	limitGrowth     = 0.1
	limitMaxShrink  = 0.5
	lateShare       = 0.25 // a queue wait past this share of the deadline budget is late
	minRetryMs      = 1
	maxRetryMs      = 1000
	rateSmoothing   = 0.5
	drainSmoothing  = 0.1
)

type limitKey struct {
	model    string
	priority int32
}

type limitClass struct {
	limit     float64
	startNs   int64
	inFlight  int64
	peak      int64
	refused   int64
	finished  int64
	minWaitNs int64 // -1: none this interval
	ratePerS  float64
	ended     int64
	late      int64   // released this interval late (isLate)
	slowStart bool    // idle since it last shrank: it doubles where it would grow
	drainPerS float64 // releases a second while held back or late (0: not yet)
	lineNs    int64   // when the last refused caller was told to come back
}

type limits struct {
	mu            sync.Mutex
	maximum       int64
	targetWaitNs  int64
	fallbackRetry int64
	classes       map[limitKey]*limitClass
}

func newLimits(maximum int64, targetWaitMs float64, fallbackRetryMs int64) *limits {
	return &limits{
		maximum: maximum, targetWaitNs: int64(targetWaitMs * 1e6), fallbackRetry: fallbackRetryMs,
		classes: map[limitKey]*limitClass{},
	}
}

// acquire: 0 admitted (release it once); otherwise refused, and the retry-after in ms.
// budgetNs: the request's deadline budget (received -> deadline; 0: none).
func (l *limits) acquire(key limitKey, nowNs, budgetNs int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.class(key, nowNs)
	allowed := l.allowed(c, budgetNs)
	if c.inFlight >= allowed {
		c.refused++
		return l.retryMs(c, allowed, nowNs)
	}
	c.inFlight++
	if c.inFlight > c.peak {
		c.peak = c.inFlight
	}
	return 0
}

// release: an admitted request ended; waitNs < 0 when it says nothing of the queue;
// late: it expired unanswered (waitNs is then all its time) or waited long (isLate).
func (l *limits) release(key limitKey, nowNs, waitNs int64, late bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.class(key, nowNs)
	if c.inFlight > 0 {
		c.inFlight--
	}
	c.ended++
	if late {
		c.late++
	}
	if waitNs < 0 {
		return
	}
	c.finished++
	if c.minWaitNs < 0 || waitNs < c.minWaitNs {
		c.minWaitNs = waitNs
	}
}

// forget gives back a slot taken for a call the door then passed on (its body was not one
// it takes): no signal, not an end.
func (l *limits) forget(key limitKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.classes[key]; ok && c.inFlight > 0 {
		c.inFlight--
	}
}

// limitState is one class as the metrics show it.
type limitState struct {
	key       limitKey
	limit     int64
	drainPerS float64
	inFlight  int64
}

// states is every class, in (model, priority) order, as gateway/adaptive_limit.py's
// classes().
func (l *limits) states() []limitState {
	l.mu.Lock()
	out := make([]limitState, 0, len(l.classes))
	for k, c := range l.classes {
		out = append(out, limitState{k, l.limitOf(c), c.drainPerS, c.inFlight})
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].key, out[j].key
		return a.model < b.model || (a.model == b.model && a.priority < b.priority)
	})
	return out
}

// current is how many of the class may be in flight, for a request with budgetNs.
func (l *limits) current(key limitKey, budgetNs int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.classes[key]; ok {
		return l.allowed(c, budgetNs)
	}
	return minInt(limitInitial, l.maximum)
}

func (l *limits) limitOf(c *limitClass) int64 {
	return maxInt(limitMinimum, minInt(l.maximum, int64(math.Floor(c.limit))))
}

// allowed is the limit, or the drain cap for a request with budgetNs where that is lower.
func (l *limits) allowed(c *limitClass, budgetNs int64) int64 {
	return minInt(l.limitOf(c), drainCap(c.drainPerS, budgetNs))
}

// retryMs is gateway/adaptive_limit.py's _retry_ms: once the excess in flight drained, and
// one drain gap after the caller refused before it was told to come back.
func (l *limits) retryMs(c *limitClass, allowed, nowNs int64) int64 {
	if c.ratePerS <= 0 {
		return l.fallbackRetry
	}
	gapNs := 1e9 / c.ratePerS
	waitNs := float64(c.inFlight-allowed+1) * gapNs
	if behind := float64(c.lineNs-nowNs) + gapNs; behind > waitNs {
		waitNs = behind
	}
	if most := float64(maxRetryMs) * 1e6; waitNs > most {
		waitNs = most
	}
	c.lineNs = nowNs + int64(waitNs)
	ms := int64(math.Ceil(waitNs / 1e6))
	return maxInt(minRetryMs, minInt(maxRetryMs, ms))
}

func (l *limits) class(key limitKey, nowNs int64) *limitClass {
	c, ok := l.classes[key]
	if !ok {
		c = &limitClass{limit: float64(minInt(limitInitial, l.maximum)), startNs: nowNs, minWaitNs: -1}
		l.classes[key] = c
	} else if nowNs-c.startNs >= limitIntervalNs {
		l.adjust(c, nowNs)
	}
	return c
}

func (l *limits) adjust(c *limitClass, nowNs int64) {
	elapsedS := float64(nowNs-c.startNs) / 1e9
	rate := float64(c.ended) / elapsedS
	if c.inFlight == 0 && nowNs-c.startNs >= 2*limitIntervalNs {
		// Nothing in flight since at least an interval ago: idle, its queue drained.
		c.slowStart = true
	} else {
		limit := nextLimit(c.limit, c.minWaitNs, c.finished > 0, c.refused > 0 || c.peak >= l.limitOf(c) || c.late > 0, l.targetWaitNs, c.slowStart)
		c.slowStart = c.slowStart && limit >= c.limit
		c.limit = limit
		if c.refused > 0 || c.late > 0 { // held back or late: the rate is its capacity
			c.drainPerS = smoothed(c.drainPerS, rate, drainSmoothing)
		}
	}
	c.limit = math.Max(limitMinimum, math.Min(float64(l.maximum), c.limit))
	if c.ended > 0 {
		c.ratePerS = smoothed(c.ratePerS, rate, rateSmoothing)
	}
	c.startNs = nowNs
	c.peak = c.inFlight
	c.refused, c.finished, c.ended, c.late = 0, 0, 0, 0
	c.minWaitNs = -1
}

// smoothed is an EWMA step; the first measure (old 0) is taken as it is.
func smoothed(old, measure, weight float64) float64 {
	if old <= 0 {
		return measure
	}
	return (1-weight)*old + weight*measure
}

// drainCap is gateway/adaptive_limit.py's drain_cap: how many of a class may be in flight
// for a request with budgetNs to be answered in lateShare of it at the drain rate.
func drainCap(drainPerS float64, budgetNs int64) int64 {
	if budgetNs <= 0 || drainPerS <= 0 {
		return 1 << 62
	}
	return maxInt(limitMinimum, int64(math.Floor(drainPerS*lateShare*float64(budgetNs)/1e9)))
}

// isLate is gateway/adaptive_limit.py's is_late: it expired, or its queue wait took more
// than lateShare of its deadline budget (received -> deadline; 0: none).
func isLate(waitNs, budgetNs int64, expired bool) bool {
	return expired || (waitNs >= 0 && budgetNs > 0 && float64(waitNs) > lateShare*float64(budgetNs))
}

// queueWaitNs is an answered request's signal, as gateway/adaptive_limit.py's
// queue_wait_ns: enqueued -> its batch's start, less its batch's compute, at least 0.
func queueWaitNs(t *tiermeshv1.Timing) int64 {
	wait := t.GetBatchStartNs() - t.GetEnqueuedNs()
	return maxInt(0, wait-maxInt(0, t.GetBatchEndNs()-t.GetBatchStartNs()))
}

// nextLimit is one interval's step, as gateway/adaptive_limit.py's next_limit.
func nextLimit(limit float64, minWaitNs int64, measured, bound bool, targetNs int64, slowStart bool) float64 {
	if !measured || !bound {
		return limit
	}
	if minWaitNs > targetNs {
		return limit * math.Max(limitMaxShrink, float64(targetNs)/float64(minWaitNs))
	}
	if slowStart {
		return 2 * limit
	}
	return limit + math.Max(math.Max(1, math.Sqrt(limit)), limit*limitGrowth)
}

func minInt(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

func maxInt(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// limitEvent is one line of `frontdoor limits MAXIMUM TARGET_MS FALLBACK_MS`'s input.
type limitEvent struct {
	Op       string `json:"op"` // "acquire" | "release" | "forget" | "limit"
	Model    string `json:"model"`
	Priority int32  `json:"priority"`
	NowNs    int64  `json:"now_ns"`
	WaitNs   *int64 `json:"wait_ns"`
	BudgetNs int64  `json:"budget_ns"`
	Expired  bool   `json:"expired"`
}

// limitLines runs the limiter over stdin's events and prints one number per event: the
// retry-after of an acquire (0: admitted), the limit of a "limit", 0 for a release.
func limitLines(maximum int64, targetMs float64, fallbackMs int64) int {
	l := newLimits(maximum, targetMs, fallbackMs)
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		var e limitEvent
		if err := json.Unmarshal(in.Bytes(), &e); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		key := limitKey{e.Model, e.Priority}
		var answer int64
		switch e.Op {
		case "acquire":
			answer = l.acquire(key, e.NowNs, e.BudgetNs)
		case "release":
			wait := int64(-1)
			if e.WaitNs != nil {
				wait = *e.WaitNs
			}
			l.release(key, e.NowNs, wait, isLate(wait, e.BudgetNs, e.Expired))
		case "forget":
			l.forget(key)
		case "limit":
			answer = l.current(key, e.BudgetNs)
		default:
			fmt.Fprintf(os.Stderr, "unknown op %q\n", e.Op)
			return 2
		}
		fmt.Fprintln(out, answer)
	}
	return 0
}
