package main

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"google.golang.org/grpc/metadata"
	"tiermeshv1"
)

// traceOf is what a call's trace asks of the door (W3C Trace Context, as the Python
// gateway's CallSpans and HopSpans do it): the span ids of a call the mesh traces, and the
// context its job carries downstream; ok is false for a call the door leaves to the Python
// gateway (a context it cannot read, or a caller's trace while the mesh writes no spans).
//
// A traced call, sampled by the parent's flag or, at the root, always (the SDK's default
// sampler, the only one the door applies: cfg.traceable): its SERVER span and its route
// span get ids here; the job carries the route span's traceparent, so the worker's batch
// span links to it, and the gateway writes both spans and the hops' from the door's books.
func (d *door) traceOf(md metadata.MD) (*tiermeshv1.Trace, map[string]string, bool) {
	parents := md.Get("traceparent")
	if len(parents) > 1 {
		return nil, nil, false
	}
	if !d.cfg.tracing {
		// The Python gateway keeps a caller's request on its trace (its logs name it).
		return nil, nil, len(parents) == 0
	}
	states := md.Get("tracestate")
	state := strings.Join(states, ",")
	t := &tiermeshv1.Trace{Tracestate: state}
	if len(parents) == 1 {
		traceID, parentID, flags, ok := parseTraceparent(parents[0])
		if !ok {
			return nil, nil, false
		}
		if flags&1 == 0 { // not sampled: no spans; the caller's context goes on
			return nil, carrierOf(parents[0], state), true
		}
		t.TraceId, t.ParentSpanId = traceID, parentID
	} else {
		t.TraceId = randomID(16)
	}
	t.SpanId = binary.BigEndian.Uint64(randomID(8))
	t.RouteSpanId = binary.BigEndian.Uint64(randomID(8))
	route := fmt.Sprintf("00-%s-%016x-01", hex.EncodeToString(t.TraceId), t.RouteSpanId)
	return t, carrierOf(route, state), true
}

// carrierOf is the W3C context a job carries downstream.
func carrierOf(traceparent, tracestate string) map[string]string {
	carrier := map[string]string{"traceparent": traceparent}
	if tracestate != "" {
		carrier["tracestate"] = tracestate
	}
	return carrier
}

// parseTraceparent reads a version-00 W3C traceparent; ok is false for anything else.
func parseTraceparent(header string) (traceID []byte, spanID uint64, flags byte, ok bool) {
	parts := strings.Split(strings.TrimSpace(header), "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 || len(parts[3]) != 2 {
		return nil, 0, 0, false
	}
	traceID, err := hex.DecodeString(parts[1])
	if err != nil || strings.ToLower(parts[1]) != parts[1] {
		return nil, 0, 0, false
	}
	span, err := hex.DecodeString(parts[2])
	if err != nil || strings.ToLower(parts[2]) != parts[2] {
		return nil, 0, 0, false
	}
	flag, err := hex.DecodeString(parts[3])
	if err != nil {
		return nil, 0, 0, false
	}
	spanID = binary.BigEndian.Uint64(span)
	zero := true
	for _, b := range traceID {
		zero = zero && b == 0
	}
	if zero || spanID == 0 {
		return nil, 0, 0, false
	}
	return traceID, spanID, flag[0], true
}

// randomID is n random bytes, never all zero (an invalid W3C id).
func randomID(n int) []byte {
	b := make([]byte, n)
	for {
		if _, err := rand.Read(b); err != nil {
			panic(err)
		}
		for _, v := range b {
			if v != 0 {
				return b
			}
		}
	}
}
