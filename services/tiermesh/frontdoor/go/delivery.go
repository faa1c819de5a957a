package main

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"tiermeshv1"
)

// shadowOf (a control, tiermesh/core/controls.py) marks the result of a copy mirrored to a
// canary: nobody waits for it here.
const shadowOf = "shadow_of"

// pending holds the calls waiting for their result, by request id.
type pending struct {
	mu      sync.Mutex
	waiting map[string]chan *tiermeshv1.Result
}

func newPending() *pending {
	return &pending{waiting: map[string]chan *tiermeshv1.Result{}}
}

func (p *pending) register(id string) chan *tiermeshv1.Result {
	ch := make(chan *tiermeshv1.Result, 1)
	p.mu.Lock()
	p.waiting[id] = ch
	p.mu.Unlock()
	return ch
}

func (p *pending) discard(id string) {
	p.mu.Lock()
	delete(p.waiting, id)
	p.mu.Unlock()
}

// resolve hands the result to its waiting call; false when none waits (late, or a
// duplicate).
func (p *pending) resolve(r *tiermeshv1.Result) bool {
	p.mu.Lock()
	ch, ok := p.waiting[r.RequestId]
	delete(p.waiting, r.RequestId)
	p.mu.Unlock()
	if !ok {
		return false
	}
	if r.Timing == nil {
		r.Timing = &tiermeshv1.Timing{}
	}
	r.Timing.DeliveredNs = time.Now().UnixNano()
	ch <- r
	return true
}

// deliveryServer is the door's Delivery service: postprocess hands over the results of the
// jobs this door placed (their `gateway` is this port).
type deliveryServer struct {
	tiermeshv1.UnimplementedDeliveryServer
	pending *pending
	books   *books // nil: a canary's answer is dropped
	late    *atomic.Int64
}

func (d *deliveryServer) deliver(msg *tiermeshv1.Deliveries) *tiermeshv1.DeliverReply {
	reply := &tiermeshv1.DeliverReply{BatchId: msg.BatchId}
	for _, r := range msg.Results {
		if _, shadow := r.Controls[shadowOf]; shadow && !r.Partial {
			if d.books != nil { // a canary's answer: compared at the gateway
				d.books.shadow(r)
			}
			continue
		}
		if d.pending.resolve(r) {
			reply.Resolved++
		} else {
			reply.Late++
			d.late.Add(1)
		}
	}
	return reply
}

func (d *deliveryServer) Deliver(_ context.Context, msg *tiermeshv1.Deliveries) (*tiermeshv1.DeliverReply, error) {
	return d.deliver(msg), nil
}

func (d *deliveryServer) DeliverStream(stream tiermeshv1.Delivery_DeliverStreamServer) error {
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(d.deliver(msg)); err != nil {
			return err
		}
	}
}
