package main

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
)

// The status code names the Python gateway's metrics use (grpc.StatusCode names).
var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN",
	codes.InvalidArgument: "INVALID_ARGUMENT", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
	codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED",
	codes.OutOfRange: "OUT_OF_RANGE", codes.Unimplemented: "UNIMPLEMENTED",
	codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE", codes.DataLoss: "DATA_LOSS",
	codes.Unauthenticated: "UNAUTHENTICATED",
}

// metrics are the door's Prometheus series, named as the Python gateway's for the calls
// the door answers itself (what it passes on, the gateway counts).
type metrics struct {
	mu       sync.Mutex
	answered map[[2]string]uint64 // (model, code) -> ModelInfer calls ended here
	passed   atomic.Int64         // calls passed to the Python gateway
	// As the Python gateway's stop line counts them: jobs placed on a queue, those whose
	// result reached the waiting call (late results: deliveryServer.late).
	accepted, resolved atomic.Int64
	inFlight           *atomic.Int64 // the door's own count, which its cap reads
	placer             *placer       // nil: the router places every job
	books              *books        // nil: nothing booked at the gateway
	limits             *limits       // nil: no adaptive limits
}

func newMetrics(inFlight *atomic.Int64) *metrics {
	return &metrics{answered: map[[2]string]uint64{}, inFlight: inFlight}
}

// ok is how many ModelInfer calls the door answered OK.
func (m *metrics) ok() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n uint64
	for k, v := range m.answered {
		if k[1] == "OK" {
			n += v
		}
	}
	return n
}

func (m *metrics) ended(model string, code codes.Code) {
	name, ok := codeNames[code]
	if !ok {
		name = "UNKNOWN"
	}
	m.mu.Lock()
	m.answered[[2]string{model, name}]++
	m.mu.Unlock()
}

func label(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

func (m *metrics) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	m.mu.Lock()
	keys := make([][2]string, 0, len(m.answered))
	for k := range m.answered {
		keys = append(keys, k)
	}
	counts := make([]uint64, len(keys))
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || (keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1])
	})
	for i, k := range keys {
		counts[i] = m.answered[k]
	}
	m.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	var b strings.Builder
	b.WriteString("# HELP tiermesh_requests_total ModelInfer calls answered, by model and status code\n")
	b.WriteString("# TYPE tiermesh_requests_total counter\n")
	for i, k := range keys {
		fmt.Fprintf(&b, "tiermesh_requests_total{model=\"%s\",code=\"%s\"} %d\n", label(k[0]), label(k[1]), counts[i])
	}
	b.WriteString("# HELP tiermesh_requests_in_flight Requests this gateway is waiting on\n")
	b.WriteString("# TYPE tiermesh_requests_in_flight gauge\n")
	fmt.Fprintf(&b, "tiermesh_requests_in_flight %d\n", m.inFlight.Load())
	b.WriteString("# HELP tiermesh_front_door_passed_total Calls the front door passed to the Python gateway\n")
	b.WriteString("# TYPE tiermesh_front_door_passed_total counter\n")
	fmt.Fprintf(&b, "tiermesh_front_door_passed_total %d\n", m.passed.Load())
	if m.placer != nil {
		b.WriteString("# HELP tiermesh_front_door_placed_total Jobs of models with a placement plan, by who queued them\n")
		b.WriteString("# TYPE tiermesh_front_door_placed_total counter\n")
		fmt.Fprintf(&b, "tiermesh_front_door_placed_total{by=\"door\"} %d\n", m.placer.placed.Load())
		fmt.Fprintf(&b, "tiermesh_front_door_placed_total{by=\"router\"} %d\n", m.placer.passed.Load())
		b.WriteString("# HELP tiermesh_front_door_admission_calls_total Admission script calls the front door made (each for one or more jobs)\n")
		b.WriteString("# TYPE tiermesh_front_door_admission_calls_total counter\n")
		fmt.Fprintf(&b, "tiermesh_front_door_admission_calls_total %d\n", m.placer.calls.Load())
	}
	if m.limits != nil {
		states := m.limits.states()
		gauges := []struct {
			name, help string
			value      func(limitState) float64
		}{
			{"tiermesh_admission_limit", "Adaptive in-flight limit, by model and priority",
				func(st limitState) float64 { return float64(st.limit) }},
			{"tiermesh_admission_drain_per_second", "Requests a second the class drained while held back or late (0: not yet measured)",
				func(st limitState) float64 { return st.drainPerS }},
			{"tiermesh_admission_in_flight", "Requests of the class in flight",
				func(st limitState) float64 { return float64(st.inFlight) }},
		}
		for _, g := range gauges {
			fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", g.name, g.help, g.name)
			for _, st := range states {
				fmt.Fprintf(&b, "%s{model=\"%s\",priority=\"%d\"} %g\n", g.name, label(st.key.model), st.key.priority, g.value(st))
			}
		}
	}
	if m.books != nil {
		b.WriteString("# HELP tiermesh_front_door_books_calls_total Record calls the front door made to book its calls at the Python gateway\n")
		b.WriteString("# TYPE tiermesh_front_door_books_calls_total counter\n")
		fmt.Fprintf(&b, "tiermesh_front_door_books_calls_total %d\n", m.books.calls.Load())
	}
	// As prometheus-client's process collector names it: `tiermesh bench --mesh-metrics`
	// and the dashboards read every process's CPU from it.
	var usage syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &usage) == nil {
		cpu := time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds()
		b.WriteString("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n")
		b.WriteString("# TYPE process_cpu_seconds_total counter\n")
		fmt.Fprintf(&b, "process_cpu_seconds_total %g\n", cpu)
	}
	_, _ = w.Write([]byte(b.String()))
}

// serveMetrics serves /metrics on addr ("" = none); the address it listens on.
func serveMetrics(addr string, m *metrics) (string, error) {
	if addr == "" {
		return "", nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m)
	go func() { _ = http.Serve(lis, mux) }()
	return lis.Addr().String(), nil
}
