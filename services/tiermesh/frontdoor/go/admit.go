package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gomodule/redigo/redis"
)

// The most jobs one admission call carries by default: Redis runs a script to its end
// before anything else, so a call stays short (~20 us of Redis a job) however many wait.
const defaultAdmitItems = 64

// admitItem is one job to queue with the admission script (core/admission_script.py): its
// keys by name and its per-item values after them, in the script's order; once admitted,
// the script's outcome and detail for it, or the error of the call that carried it.
type admitItem struct {
	stream, workers, rate, enqueued, guard string
	modelStreams                           []string
	// bound, model bound, rate field, ms left, remember ms, entry, traceparent, tracestate
	values []interface{}

	outcome, detail string
	err             error
	done            chan struct{}
}

// admitQueue gathers the jobs that come while an admission call is on its way into the
// next call, as the router's stream does (DESIGN.md, "Internal hops carry batches"): one
// call in flight at a time, sent as soon as the previous one is answered, with no timer.
// A lone job is sent at once by its own goroutine; under load one call carries what came
// in one round trip, and Redis and the door pay one call for many jobs (Redis spent ~55 us
// of CPU a job with a call a job, ~19 with eight a call: benchmarks/admission_batch.py).
type admitQueue struct {
	pool   *redis.Pool
	script *redis.Script
	fields []string
	calls  *atomic.Int64
	most   int // items a call carries at most

	mu      sync.Mutex
	waiting []*admitItem
	calling bool // a call is on its way; whoever makes it sends what waits next
}

// admit queues the item and returns once a call decided it (its outcome, detail and err).
func (q *admitQueue) admit(it *admitItem) {
	it.done = make(chan struct{})
	q.mu.Lock()
	q.waiting = append(q.waiting, it)
	if q.calling {
		q.mu.Unlock()
		<-it.done
		return
	}
	q.calling = true
	q.mu.Unlock()
	// Nothing was waiting, so this item goes first, in the call made here; what came
	// meanwhile goes on in a goroutine of its own, so this caller has its answer now.
	if q.callOnce() {
		go func() {
			for q.callOnce() {
			}
		}()
	}
}

// callOnce makes one call of what waits (up to `most` items) and tells each item; true
// when more waits (the caller makes the next call), false when the queue is idle again.
func (q *admitQueue) callOnce() bool {
	q.mu.Lock()
	n := len(q.waiting)
	if n > q.most {
		n = q.most
	}
	batch := append([]*admitItem(nil), q.waiting[:n]...)
	q.waiting = append(q.waiting[:0], q.waiting[n:]...)
	q.mu.Unlock()
	q.run(batch)
	for _, it := range batch {
		close(it.done)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiting) > 0 {
		return true
	}
	q.calling = false
	return false
}

// run is one script call for the batch: KEYS name each key once, every item's indexes
// point into them.
func (q *admitQueue) run(batch []*admitItem) {
	keys := []interface{}{0} // the key count goes first (a script of any number of keys)
	index := map[string]int{}
	at := func(key string) int {
		if i, ok := index[key]; ok {
			return i
		}
		keys = append(keys, key)
		index[key] = len(keys) - 1
		return len(keys) - 1
	}
	args := []interface{}{len(batch), q.fields[0], q.fields[1], q.fields[2]}
	for _, it := range batch {
		args = append(args, at(it.stream), at(it.workers), at(it.rate), at(it.enqueued))
		args = append(args, it.values...)
		args = append(args, at(it.guard), len(it.modelStreams))
		for _, s := range it.modelStreams {
			args = append(args, at(s))
		}
	}
	keys[0] = len(keys) - 1
	reply, err := q.call(append(keys, args...))
	if err == nil && len(reply) != 2*len(batch) {
		err = fmt.Errorf("the admission script answered %d values for %d jobs", len(reply), len(batch))
	}
	for i, it := range batch {
		if err != nil {
			it.err = err
			continue
		}
		it.outcome, it.detail = reply[2*i], reply[2*i+1]
	}
}

// connection is a connection of the pool, waiting connectionWait at most for a free one.
func connection(pool *redis.Pool) (redis.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), connectionWait)
	defer cancel()
	return pool.GetContext(ctx)
}

func (q *admitQueue) call(args []interface{}) ([]string, error) {
	conn, err := connection(q.pool)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	q.calls.Add(1)
	return redis.Strings(q.script.Do(conn, args...))
}
