// An open- or closed-loop load generator for KServe v2 ModelInfer (tiermesh/bench/goload.py
// builds it as the Go front door is built and runs it): a Python client cannot offer
// several times the mesh's capacity on a 2-core machine, a compiled one can.
//
// Reads one JSON config on stdin; writes one JSON line per call (sorted by start), then one
// line with the generator's own CPU and wall seconds. Nothing is written during the run:
// each call's figures go into a slice that is encoded after the last call returns.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"inference"
)

type config struct {
	Target      string            `json:"target"`
	Requests    [][]byte          `json:"requests"` // base64 in JSON
	Order       string            `json:"order"`    // "cycle" (default) or "random"
	Mode        string            `json:"mode"`     // "open" or "closed"
	RateRPS     float64           `json:"rate_rps"`
	Concurrency int               `json:"concurrency"`
	DurationS   float64           `json:"duration_s"`
	Seed        int64             `json:"seed"`
	DeadlineMS  float64           `json:"deadline_ms"`
	Metadata    map[string]string `json:"metadata"`
	Connections int               `json:"connections"`
	// closed: a refused caller waits the refusal's retry-after before its next call, as a
	// client with gRPC's retry pushback does, instead of sending it at once
	HonourRetryAfter bool `json:"honour_retry_after"`
}

type result struct {
	request   int
	startS    float64 // open: the scheduled offset; closed: when the call started
	lagMS     float64
	latencyMS float64
	code      codes.Code
	retry     float64 // -1: no trailer
	params    map[string]*inference.InferParameter
}

// The code's name as Python's grpc.StatusCode spells it: grpc-go's String() in upper snake
// case ("ResourceExhausted" -> "RESOURCE_EXHAUSTED"), but for the one spelled apart.
func codeName(code codes.Code) string {
	if code == codes.Canceled {
		return "CANCELLED"
	}
	var b []byte
	lower := false
	for _, r := range code.String() {
		if lower && unicode.IsUpper(r) {
			b = append(b, '_')
		}
		lower = unicode.IsLower(r)
		b = append(b, byte(unicode.ToUpper(r)))
	}
	return string(b)
}

const prefix = "tiermesh."

type caller struct {
	cfg      config
	requests []*inference.ModelInferRequest
	clients  []inference.GRPCInferenceServiceClient
	deadline time.Duration
	md       metadata.MD
	origin   time.Time
}

func (c *caller) call(n int, request int, res *result) {
	ctx, cancel := context.WithTimeout(context.Background(), c.deadline)
	defer cancel()
	if c.md != nil {
		ctx = metadata.NewOutgoingContext(ctx, c.md)
	}
	var trailer metadata.MD
	start := time.Now()
	reply, err := c.clients[n%len(c.clients)].ModelInfer(ctx, c.requests[request], grpc.Trailer(&trailer))
	res.latencyMS = float64(time.Since(start).Nanoseconds()) / 1e6
	res.request = request
	res.code = status.Code(err)
	res.retry = -1
	if values := trailer.Get("retry-after-ms"); len(values) > 0 {
		if v, perr := strconv.ParseFloat(values[0], 64); perr == nil {
			res.retry = v
		}
	}
	if err == nil {
		res.params = reply.Parameters
	}
}

// Poisson arrivals at rate_rps over duration_s, every one sent on schedule from its own
// goroutine whatever is outstanding; its lag is how late the send began.
func (c *caller) open(rng *rand.Rand) []result {
	var offsets []float64
	for t := rng.ExpFloat64() / c.cfg.RateRPS; t < c.cfg.DurationS; t += rng.ExpFloat64() / c.cfg.RateRPS {
		offsets = append(offsets, t)
	}
	picks := c.picks(rng, len(offsets))
	results := make([]result, len(offsets))
	var wg sync.WaitGroup
	wg.Add(len(offsets))
	c.origin = time.Now()
	for i, at := range offsets {
		due := time.Duration(at * 1e9)
		if wait := due - time.Since(c.origin); wait > 0 {
			time.Sleep(wait)
		}
		go func(i int, at float64) {
			defer wg.Done()
			res := &results[i]
			res.startS = at
			res.lagMS = (time.Since(c.origin).Seconds() - at) * 1e3
			c.call(i, picks[i], res)
		}(i, at)
	}
	wg.Wait()
	return results
}

// `concurrency` callers, each sending its next call when its last one returned (or, with
// honour_retry_after, a refused one's retry-after later), until duration_s has passed.
func (c *caller) closed(rng *rand.Rand) []result {
	var next int64 = -1
	perCaller := make([][]result, c.cfg.Concurrency)
	var wg sync.WaitGroup
	wg.Add(c.cfg.Concurrency)
	c.origin = time.Now()
	end := c.origin.Add(time.Duration(c.cfg.DurationS * 1e9))
	for k := 0; k < c.cfg.Concurrency; k++ {
		own := rand.New(rand.NewSource(rng.Int63()))
		go func(k int, own *rand.Rand) {
			defer wg.Done()
			for time.Now().Before(end) {
				n := int(atomic.AddInt64(&next, 1))
				request := n % len(c.requests)
				if c.cfg.Order == "random" {
					request = own.Intn(len(c.requests))
				}
				res := result{startS: time.Since(c.origin).Seconds()}
				c.call(n, request, &res)
				perCaller[k] = append(perCaller[k], res)
				if c.cfg.HonourRetryAfter && res.code != codes.OK && res.retry > 0 {
					pause := time.Duration(res.retry * 1e6)
					if left := time.Until(end); pause > left {
						pause = left
					}
					time.Sleep(pause)
				}
			}
		}(k, own)
	}
	wg.Wait()
	var results []result
	for _, rs := range perCaller {
		results = append(results, rs...)
	}
	sort.Slice(results, func(i, j int) bool { return results[i].startS < results[j].startS })
	return results
}

func (c *caller) picks(rng *rand.Rand, count int) []int {
	picks := make([]int, count)
	for i := range picks {
		if c.cfg.Order == "random" {
			picks[i] = rng.Intn(len(c.requests))
		} else {
			picks[i] = i % len(c.requests)
		}
	}
	return picks
}

func appendFloat(b []byte, v float64) []byte {
	return strconv.AppendFloat(b, v, 'f', -1, 64)
}

// The mesh's facts among a reply's parameters (`tiermesh.<name>`), by name without the
// prefix, as plain JSON values.
func appendParams(b []byte, params map[string]*inference.InferParameter) []byte {
	b = append(b, '{')
	first := true
	for key, p := range params {
		if !strings.HasPrefix(key, prefix) || p == nil {
			continue
		}
		var value []byte
		switch v := p.ParameterChoice.(type) {
		case *inference.InferParameter_DoubleParam:
			value = appendFloat(nil, v.DoubleParam)
		case *inference.InferParameter_Int64Param:
			value = strconv.AppendInt(nil, v.Int64Param, 10)
		case *inference.InferParameter_Uint64Param:
			value = strconv.AppendUint(nil, v.Uint64Param, 10)
		case *inference.InferParameter_BoolParam:
			value = strconv.AppendBool(nil, v.BoolParam)
		case *inference.InferParameter_StringParam:
			value, _ = json.Marshal(v.StringParam)
		default:
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		name, _ := json.Marshal(strings.TrimPrefix(key, prefix))
		b = append(append(append(b, name...), ':'), value...)
	}
	return append(b, '}')
}

func write(out *bufio.Writer, results []result) {
	var b []byte
	for i := range results {
		r := &results[i]
		b = append(b[:0], `{"request":`...)
		b = strconv.AppendInt(b, int64(r.request), 10)
		b = appendFloat(append(b, `,"start_s":`...), r.startS)
		b = appendFloat(append(b, `,"lag_ms":`...), r.lagMS)
		b = appendFloat(append(b, `,"latency_ms":`...), r.latencyMS)
		b = append(append(append(b, `,"code":"`...), codeName(r.code)...), '"')
		b = append(b, `,"retry_after_ms":`...)
		if r.retry >= 0 {
			b = appendFloat(b, r.retry)
		} else {
			b = append(b, "null"...)
		}
		if r.code == codes.OK {
			b = appendParams(append(b, `,"params":`...), r.params)
		}
		out.Write(append(b, '}', '\n'))
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "goload: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	var cfg config
	if err := json.NewDecoder(os.Stdin).Decode(&cfg); err != nil {
		fail("reading the config: %v", err)
	}
	if len(cfg.Requests) == 0 || cfg.DurationS <= 0 || cfg.DeadlineMS <= 0 {
		fail("the config needs requests, duration_s > 0 and deadline_ms > 0")
	}
	if cfg.Connections <= 0 {
		cfg.Connections = 4
	}
	c := &caller{cfg: cfg, deadline: time.Duration(cfg.DeadlineMS * 1e6)}
	for i, data := range cfg.Requests {
		req := &inference.ModelInferRequest{}
		if err := req.XXX_Unmarshal(data); err != nil {
			fail("request %d is not a ModelInferRequest: %v", i, err)
		}
		c.requests = append(c.requests, req)
	}
	if len(cfg.Metadata) > 0 {
		c.md = metadata.New(cfg.Metadata)
	}
	for i := 0; i < cfg.Connections; i++ {
		// WithBlock: every connection is up before the clock starts, so no arrival pays
		// for a handshake.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := grpc.DialContext(ctx, cfg.Target, grpc.WithInsecure(), grpc.WithBlock())
		cancel()
		if err != nil {
			fail("connecting to %s: %v", cfg.Target, err)
		}
		defer conn.Close()
		c.clients = append(c.clients, inference.NewGRPCInferenceServiceClient(conn))
	}
	rng := rand.New(rand.NewSource(cfg.Seed))
	var results []result
	switch cfg.Mode {
	case "open":
		if cfg.RateRPS <= 0 {
			fail("open mode needs rate_rps > 0")
		}
		results = c.open(rng)
	case "closed":
		if cfg.Concurrency <= 0 {
			fail("closed mode needs concurrency > 0")
		}
		results = c.closed(rng)
	default:
		fail("mode must be open or closed, not %q", cfg.Mode)
	}
	wall := time.Since(c.origin).Seconds()
	var usage syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &usage)
	cpu := time.Duration(usage.Utime.Nano() + usage.Stime.Nano()).Seconds()
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	write(out, results)
	fmt.Fprintf(out, "{\"cpu_s\":%g,\"wall_s\":%g,\"calls\":%d}\n", cpu, wall, len(results))
	if err := out.Flush(); err != nil {
		os.Exit(1)
	}
}
