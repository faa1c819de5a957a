package main

import (
	"context"
	"log"
	"math"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"tiermeshv1"
)

const (
	// Unsent entries beyond this many are dropped (and counted) while the gateway is away.
	maxUnsentBooks = 100_000
	booksCallWait  = 5 * time.Second
	booksRetryWait = 200 * time.Millisecond
	booksGather    = 50 * time.Millisecond
	// An idle door asks the gateway this often whether traffic capture is on (a busy one
	// learns it from every reply): a capture started with `tiermesh bench capture start`
	// samples the door's calls within about this long, as the gateway's own flush does.
	captureProbeEvery = 250 * time.Millisecond
)

// books reports the calls the door answered itself to the Python gateway's Books service
// (gateway/books.py), which counts them in its ModelStatistics, latency histograms and
// rollout books, and marks the jobs of callers who left as cancelled. Whatever has gathered
// within booksGather of the first entry goes as one Record call, once the previous one is
// answered: at most one call a gather.
type books struct {
	stub tiermeshv1.BooksClient

	mu      sync.Mutex
	unsent  tiermeshv1.Entries
	refused map[[2]string]*tiermeshv1.Refused // unsent.Refused by (model, version)
	wake    chan struct{}
	dropped atomic.Int64 // entries lost while the gateway was away
	calls   atomic.Int64 // Record calls made (probes included)
	// The share of calls reported with their job (traffic capture), as the gateway's last
	// reply said (float64 bits).
	captureRate atomic.Uint64
}

func newBooks(conn *grpc.ClientConn) *books {
	b := &books{stub: tiermeshv1.NewBooksClient(conn), wake: make(chan struct{}, 1), refused: map[[2]string]*tiermeshv1.Refused{}}
	go b.pump()
	return b
}

func count(e *tiermeshv1.Entries) int {
	return len(e.Entries) + len(e.Shadows) + len(e.Mirrored) + len(e.Refused)
}

// unsentCount is how much waits to be sent.
func (b *books) unsentCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return count(&b.unsent)
}

// add queues what fill appends to the unsent books, unless too much is unsent already.
func (b *books) add(fill func(*tiermeshv1.Entries)) {
	b.mu.Lock()
	if count(&b.unsent) >= maxUnsentBooks {
		b.mu.Unlock()
		b.dropped.Add(1)
		return
	}
	fill(&b.unsent)
	b.mu.Unlock()
	signal1(b.wake)
}

func (b *books) call(e *tiermeshv1.Entry) {
	if plain(e) {
		b.add(func(u *tiermeshv1.Entries) { b.countRefused(u, e) })
		return
	}
	b.add(func(u *tiermeshv1.Entries) { u.Entries = append(u.Entries, e) })
}

// plain: a call that ended without being placed and that nothing but its count, duration
// and model concern at the gateway (gateway/books.py books it as a failed call).
func plain(e *tiermeshv1.Entry) bool {
	return e.Code != 0 && !e.Routed && e.Result == nil && e.Job == nil && e.Trace == nil &&
		!e.CallerLeft && e.ShadowRequestId == ""
}

// countRefused adds a plain call to the unsent counts of its (model, version); b.mu held.
func (b *books) countRefused(u *tiermeshv1.Entries, e *tiermeshv1.Entry) {
	key := [2]string{e.Model, e.Version}
	r, ok := b.refused[key]
	if !ok {
		r = &tiermeshv1.Refused{Model: e.Model, Version: e.Version}
		b.refused[key] = r
		u.Refused = append(u.Refused, r)
	}
	r.Count++
	if d := e.EndedNs - e.ReceivedNs; d > 0 {
		r.TotalNs += d
	}
}

func (b *books) mirrored(m *tiermeshv1.Mirrored) {
	b.add(func(u *tiermeshv1.Entries) { u.Mirrored = append(u.Mirrored, m) })
}

func (b *books) shadow(r *tiermeshv1.Result) {
	b.add(func(u *tiermeshv1.Entries) { u.Shadows = append(u.Shadows, r) })
}

func (b *books) take() *tiermeshv1.Entries {
	b.mu.Lock()
	defer b.mu.Unlock()
	if count(&b.unsent) == 0 {
		return nil
	}
	out := b.unsent
	b.unsent = tiermeshv1.Entries{}
	b.refused = map[[2]string]*tiermeshv1.Refused{}
	return &out
}

// putBack returns a batch the gateway did not take, ahead of what came since, within the
// bound.
func (b *books) putBack(batch *tiermeshv1.Entries) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if count(&b.unsent)+count(batch) > maxUnsentBooks {
		b.dropped.Add(int64(len(batch.Entries)))
		return
	}
	b.unsent.Entries = append(batch.Entries, b.unsent.Entries...)
	b.unsent.Shadows = append(batch.Shadows, b.unsent.Shadows...)
	b.unsent.Mirrored = append(batch.Mirrored, b.unsent.Mirrored...)
	b.unsent.Refused = append(batch.Refused, b.unsent.Refused...) // the gateway sums repeats
}

// send makes one Record call of whatever is unsent; false when it failed (kept for later).
func (b *books) send() bool {
	batch := b.take()
	if batch == nil {
		return true
	}
	if err := b.record(batch); err != nil {
		b.putBack(batch)
		return false
	}
	return true
}

// record is one Record call; the reply's capture rate is kept.
func (b *books) record(batch *tiermeshv1.Entries) error {
	ctx, cancel := context.WithTimeout(context.Background(), booksCallWait)
	defer cancel()
	b.calls.Add(1)
	reply, err := b.stub.Record(ctx, batch)
	if err == nil {
		b.captureRate.Store(math.Float64bits(reply.CaptureRate))
	}
	return err
}

// sampled: this call goes to the gateway with its job, for traffic capture.
func (b *books) sampled() bool {
	rate := math.Float64frombits(b.captureRate.Load())
	return rate > 0 && rand.Float64() < rate
}

// probe asks the gateway for the capture rate while the door has nothing to report.
func (b *books) probe() {
	_ = b.record(&tiermeshv1.Entries{}) // a lost probe: the next one asks again
}

func (b *books) pump() {
	failing := false
	tick := time.NewTicker(captureProbeEvery)
	defer tick.Stop()
	for {
		select {
		case <-b.wake:
			// Books are not on any caller's path: gathering for a moment makes one call
			// carry many entries (one Record a call costs the gateway a grpc.aio call each).
			time.Sleep(booksGather)
		case <-tick.C:
			if b.unsentCount() == 0 {
				b.probe()
			}
			continue
		}
		for b.unsentCount() > 0 {
			if b.send() {
				if failing {
					log.Printf("booking at the Python gateway again")
					failing = false
				}
				// What came during the call goes after a gather of its own (its adds woke
				// the pump again): under a steady flow, refusals above all, one Record per
				// gather, not one per round trip.
				break
			}
			if !failing {
				log.Printf("the Python gateway does not take the books now; retrying")
				failing = true
			}
			time.Sleep(booksRetryWait)
		}
	}
}

// flush sends what is unsent before the door stops, within `wait`.
func (b *books) flush(wait time.Duration) {
	end := time.Now().Add(wait)
	for b.unsentCount() > 0 && time.Now().Before(end) {
		if !b.send() {
			time.Sleep(booksRetryWait)
		}
	}
}
