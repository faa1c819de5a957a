package main

import (
	"context"
	"sync"
	"time"

	"github.com/golang/protobuf/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"tiermeshv1"
)

const (
	maxBatchBytes = 16 << 20 // a batch of jobs stays under the router's message limit
	routeAttempts = 3        // a router restarting is retried before the caller hears UNAVAILABLE
	routeBackoff  = 50 * time.Millisecond
	// The longest the door waits for the router to answer a batch before it takes the
	// stream for broken (its jobs are sent again: enqueues are idempotent by request id).
	routerReplyWait = 10 * time.Second
	unavailableInt  = int32(codes.Unavailable)
)

// routerClient writes jobs to the router on one long-lived RouteStream, as the Python
// gateway's RouterClient does: whatever is queued goes as one batch once the previous batch
// is answered (the router handles a stream's batches one at a time). A broken stream fails
// the jobs on it as UNAVAILABLE, which route retries on a new stream (enqueues are
// idempotent by request id).
type routerClient struct {
	stub tiermeshv1.RouterClient

	mu          sync.Mutex
	queued      []*tiermeshv1.Job
	waiting     map[string]chan *tiermeshv1.RouteReply
	outstanding map[string]bool // sent on the current stream, not yet answered
	wake        chan struct{}
	answered    chan struct{} // the batch out is answered, or its stream broke
}

func newRouterClient(conn *grpc.ClientConn) *routerClient {
	r := &routerClient{
		stub:        tiermeshv1.NewRouterClient(conn),
		waiting:     map[string]chan *tiermeshv1.RouteReply{},
		outstanding: map[string]bool{},
		wake:        make(chan struct{}, 1),
		answered:    make(chan struct{}, 1),
	}
	go r.pump()
	return r
}

func signal1(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// route places the job; the router's reply (code 0: placed), or a status error of the
// door's own (the deadline passed, the caller left, the router unreachable).
func (r *routerClient) route(ctx context.Context, job *tiermeshv1.Job, deadline time.Time) (*tiermeshv1.RouteReply, error) {
	for attempt := 0; ; attempt++ {
		reply, err := r.once(ctx, job, deadline)
		if err != nil {
			return nil, err
		}
		if reply.Code != unavailableInt {
			return reply, nil
		}
		if attempt+1 == routeAttempts {
			return nil, status.Error(codes.Unavailable, "router unavailable: "+reply.Message)
		}
		wait := routeBackoff << attempt
		if left := time.Until(deadline); left < wait {
			wait = left
		}
		pause := time.NewTimer(wait)
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return nil, contextError(ctx)
		}
	}
}

func (r *routerClient) once(ctx context.Context, job *tiermeshv1.Job, deadline time.Time) (*tiermeshv1.RouteReply, error) {
	left := time.Until(deadline)
	if left <= 0 {
		return nil, status.Error(codes.DeadlineExceeded, "deadline passed before the request was routed")
	}
	ch := make(chan *tiermeshv1.RouteReply, 1)
	r.mu.Lock()
	r.waiting[job.RequestId] = ch
	r.queued = append(r.queued, job)
	r.mu.Unlock()
	signal1(r.wake)
	timer := time.NewTimer(left)
	defer timer.Stop()
	defer func() {
		r.mu.Lock()
		if r.waiting[job.RequestId] == ch {
			delete(r.waiting, job.RequestId)
		}
		r.mu.Unlock()
	}()
	select {
	case reply := <-ch:
		return reply, nil
	case <-timer.C:
		return nil, status.Error(codes.DeadlineExceeded, "deadline passed before the request was routed")
	case <-ctx.Done():
		return nil, contextError(ctx)
	}
}

// take is what is queued whose caller still waits, as one batch of at most maxBatchBytes
// (at least one job); the rest stays queued, in order.
func (r *routerClient) take() []*tiermeshv1.Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	var live []*tiermeshv1.Job
	size, end := 0, len(r.queued)
	for i, job := range r.queued {
		if _, ok := r.waiting[job.RequestId]; !ok {
			continue // its caller left
		}
		n := proto.Size(job)
		if len(live) > 0 && size+n > maxBatchBytes {
			end = i
			break
		}
		live = append(live, job)
		size += n
	}
	r.queued = append([]*tiermeshv1.Job(nil), r.queued[end:]...)
	for _, job := range live {
		r.outstanding[job.RequestId] = true
	}
	return live
}

// routeStream is one RouteStream and what ends it: its receiver closes done when the
// stream fails, cancel ends it from this side.
type routeStream struct {
	stream tiermeshv1.Router_RouteStreamClient
	done   chan struct{}
	cancel context.CancelFunc
}

func (r *routerClient) open() (*routeStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := r.stub.RouteStream(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	rs := &routeStream{stream: s, done: make(chan struct{}), cancel: cancel}
	go r.receive(rs)
	return rs, nil
}

func (r *routerClient) pump() {
	var rs *routeStream
	for {
		<-r.wake
		for {
			jobs := r.take()
			if len(jobs) == 0 {
				break
			}
			if rs != nil {
				select {
				case <-rs.done: // broke while nothing was out
					rs = nil
				default:
				}
			}
			if rs == nil {
				opened, err := r.open()
				if err != nil {
					r.broken(err)
					continue
				}
				rs = opened
			}
			select { // a signal left over from an earlier batch
			case <-r.answered:
			default:
			}
			if err := rs.stream.Send(&tiermeshv1.JobBatch{Jobs: jobs}); err != nil {
				rs.cancel()
				rs = nil
				r.broken(err)
				continue
			}
			timer := time.NewTimer(routerReplyWait)
			select {
			case <-r.answered:
			case <-rs.done:
			case <-timer.C: // a router that neither answers nor fails: a new stream
			}
			timer.Stop()
			r.mu.Lock()
			lost := len(r.outstanding) > 0 // only a broken or stuck stream leaves any
			r.mu.Unlock()
			if lost {
				rs.cancel()
				rs = nil
				r.broken(nil)
			}
		}
	}
}

func (r *routerClient) receive(rs *routeStream) {
	defer close(rs.done)
	for {
		replies, err := rs.stream.Recv()
		if err != nil {
			return
		}
		r.mu.Lock()
		for _, reply := range replies.Replies {
			delete(r.outstanding, reply.RequestId)
			if ch, ok := r.waiting[reply.RequestId]; ok {
				select {
				case ch <- reply:
				default:
				}
			}
		}
		done := len(r.outstanding) == 0
		r.mu.Unlock()
		if done {
			signal1(r.answered)
		}
	}
}

// broken fails the jobs that were on a broken stream: route sends them again.
func (r *routerClient) broken(err error) {
	message := "the router stream broke"
	if err != nil {
		message = err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.outstanding {
		if ch, ok := r.waiting[id]; ok {
			select {
			case ch <- &tiermeshv1.RouteReply{RequestId: id, Code: unavailableInt, Message: message}:
			default:
			}
		}
		delete(r.outstanding, id)
	}
}
