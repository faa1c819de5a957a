package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
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
	// A slow model's scale: its target wait is at least its smoothed batch compute, and an
	// interval lasts at least feedbackComputes of them.
	feedbackComputes = 2
	// An interval with late requests brings the limit down to what is computed in this
	// share of the class's deadline budget at the rate its requests were computed lately.
	drainShare = 0.4
	// But no longer than this: a deeper queue makes bigger batches.
	maxIntervalNs = 3 * limitIntervalNs
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
	late      int64 // released this interval late (isLate)
	slowStart bool  // idle since it last shrank: it doubles where it would grow
	// Requests finished this interval with a batch compute, the sum of those, and a
	// finished request's batch compute smoothed over intervals.
	computed, computeSumNs int64
	computeNs              float64
	servedPerS             float64 // requests computed a second (not expired), smoothed
	// Requests ended this interval with a deadline, the sum of their budgets, and an
	// ended request's budget smoothed over intervals.
	budgeted, budgetSumNs int64
	budgetNs              float64
	lastPeak              int64 // the most in flight at once in the interval before this one
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
func (l *limits) acquire(key limitKey, nowNs int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.class(key, nowNs)
	if c.inFlight >= l.limitOf(c) {
		c.refused++
		return l.retryMs(c)
	}
	c.inFlight++
	if c.inFlight > c.peak {
		c.peak = c.inFlight
	}
	return 0
}

// release: an admitted request ended; waitNs < 0 when it says nothing of the queue;
// late: it expired unanswered (waitNs is then all its time) or waited long (isLate);
// computeNs its batch's compute (batchComputeNs; 0: none); budgetNs its deadline budget
// (received -> deadline; 0: none).
func (l *limits) release(key limitKey, nowNs, waitNs int64, late bool, computeNs, budgetNs int64) {
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
	if budgetNs > 0 {
		c.budgeted++
		c.budgetSumNs += budgetNs
	}
	if waitNs < 0 {
		return
	}
	c.finished++
	if computeNs > 0 {
		c.computed++
		c.computeSumNs += computeNs
	}
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

func (l *limits) current(key limitKey) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.classes[key]; ok {
		return l.limitOf(c)
	}
	return minInt(limitInitial, l.maximum)
}

func (l *limits) limitOf(c *limitClass) int64 {
	return maxInt(limitMinimum, minInt(l.maximum, int64(math.Floor(c.limit))))
}

func (l *limits) retryMs(c *limitClass) int64 {
	if c.ratePerS <= 0 {
		return l.fallbackRetry
	}
	excess := c.inFlight - l.limitOf(c) + 1
	ms := int64(math.Ceil(float64(excess) * 1000 / c.ratePerS))
	return maxInt(minRetryMs, minInt(maxRetryMs, ms))
}

func (l *limits) class(key limitKey, nowNs int64) *limitClass {
	c, ok := l.classes[key]
	if !ok {
		c = &limitClass{limit: float64(minInt(limitInitial, l.maximum)), startNs: nowNs, minWaitNs: -1}
		l.classes[key] = c
	} else if float64(nowNs-c.startNs) >= intervalNs(c.computeNs) {
		l.adjust(c, nowNs)
	}
	return c
}

func (l *limits) adjust(c *limitClass, nowNs int64) {
	elapsedS := float64(nowNs-c.startNs) / 1e9
	idle := c.inFlight == 0 && float64(nowNs-c.startNs) >= 2*intervalNs(c.computeNs)
	// This interval's measures count in the step that ends it.
	if c.ended > 0 {
		c.ratePerS = smoothed(c.ratePerS, float64(c.ended)/elapsedS)
		c.servedPerS = smoothed(c.servedPerS, float64(c.computed)/elapsedS)
	}
	if c.computed > 0 {
		c.computeNs = smoothed(c.computeNs, float64(c.computeSumNs/c.computed))
	}
	if c.budgeted > 0 {
		c.budgetNs = smoothed(c.budgetNs, float64(c.budgetSumNs/c.budgeted))
	}
	if idle {
		// Nothing in flight since at least an interval ago: idle, its queue drained.
		c.slowStart = true
	} else {
		bound := c.refused > 0 || c.peak >= l.limitOf(c) || c.late > 0
		target := maxInt(l.targetWaitNs, int64(c.computeNs))
		limit := nextLimit(c.limit, c.minWaitNs, c.finished > 0, bound, target, c.slowStart)
		if c.late > 0 { // never up, and down to what drains in time
			limit = math.Min(limit, math.Min(c.limit, math.Max(drains(c), kept(c))))
		}
		c.slowStart = c.slowStart && c.late == 0 && limit >= c.limit
		c.limit = limit
	}
	c.limit = math.Max(limitMinimum, math.Min(float64(l.maximum), c.limit))
	c.startNs = nowNs
	c.lastPeak, c.peak = c.peak, c.inFlight
	c.refused, c.finished, c.ended, c.late = 0, 0, 0, 0
	c.computed, c.computeSumNs, c.budgeted, c.budgetSumNs = 0, 0, 0, 0
	c.minWaitNs = -1
}

// smoothed is the next value of a figure smoothed over intervals (its first measure as is).
func smoothed(old, next float64) float64 {
	if old <= 0 {
		return next
	}
	return (1-rateSmoothing)*old + rateSmoothing*next
}

// intervalNs is how long a class's interval lasts: limitIntervalNs, or feedbackComputes of
// its smoothed batch compute where that is longer.
func intervalNs(computeNs float64) float64 {
	return math.Max(limitIntervalNs, math.Min(feedbackComputes*computeNs, maxIntervalNs))
}

// queueSignal is what an answered call says of its queue: its wait (queueWaitNs, or all its
// time when it expired unanswered: expired; -1: nothing) and its batch's compute.
type queueSignal struct {
	waitNs, computeNs int64
	expired           bool
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
	return maxInt(0, wait-batchComputeNs(t))
}

// batchComputeNs is how long an answered request's batch computed (0: not batched).
func batchComputeNs(t *tiermeshv1.Timing) int64 {
	return maxInt(0, t.GetBatchEndNs()-t.GetBatchStartNs())
}

// kept is gateway/adaptive_limit.py's _kept: what a late cut leaves to callers the limit
// refused none of (as many as were in flight the interval before).
func kept(c *limitClass) float64 {
	if c.refused > 0 {
		return 0
	}
	return float64(c.lastPeak)
}

// drains is gateway/adaptive_limit.py's _drains: how many of the class's requests drain in
// drainShare of its deadline budget at the rate its requests were computed; unbounded while
// either is unknown.
func drains(c *limitClass) float64 {
	if c.servedPerS <= 0 || c.budgetNs <= 0 {
		return math.Inf(1)
	}
	return c.servedPerS * c.budgetNs / 1e9 * drainShare
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
	Compute  int64  `json:"compute_ns"`
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
			answer = l.acquire(key, e.NowNs)
		case "release":
			wait := int64(-1)
			if e.WaitNs != nil {
				wait = *e.WaitNs
			}
			l.release(key, e.NowNs, wait, isLate(wait, e.BudgetNs, e.Expired), e.Compute, e.BudgetNs)
		case "forget":
			l.forget(key)
		case "limit":
			answer = l.current(key)
		default:
			fmt.Fprintf(os.Stderr, "unknown op %q\n", e.Op)
			return 2
		}
		fmt.Fprintln(out, answer)
	}
	return 0
}
