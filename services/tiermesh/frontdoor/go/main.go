// The Go front door of a tiermesh gateway (issue 21): the public KServe v2 gRPC port in a
// compiled process, so that the per-request work of the common call costs what a grpc-go
// server costs (~0.07 ms) instead of what grpc.aio does (~0.4 ms before any of tiermesh's
// own work).
//
// It answers ModelInfer itself when the request is plainly valid for a model it knows
// (raw tensors, only the priority and timeout parameters, no trace context, a model that is
// ready, not generative and not cached): it builds the job, writes it to the router on one
// RouteStream, waits for postprocess to deliver its result on its own Delivery port, and
// answers with the same response parameters the Python gateway sets. Every other call, and
// every ModelInfer it does not take, goes byte for byte to the Python gateway behind it,
// which stays the one place for auth, model control, REST, statistics, streaming and
// generation, and for every error message. The models it knows, it reads from that
// gateway: its repository index every refreshEvery, ModelMetadata and ModelConfig when a
// model's versions change (models.go).
//
// Configured by the environment `tiermesh up` gives it (README, "Front door").
package main

import (
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	// gzip-compressed calls (tritonclient's compression_algorithm="gzip"), as grpcio takes them.
	_ "google.golang.org/grpc/encoding/gzip"
	"tiermeshv1"
)

// Calls one client connection may have open at once (core/server.py's
// MAX_STREAMS_PER_CONNECTION).
const maxStreamsPerConnection = 1024

// Goroutines kept for the public port's calls (grpc.NumStreamWorkers).
const publicStreamWorkers = 64

type config struct {
	listen         string // the public port
	upstream       string // the Python gateway
	router         string
	books          string // the Python gateway's internal port ("" = nothing booked there)
	deliveryListen string // this door's Delivery port (postprocess dials it)
	metricsListen  string // Prometheus text format at /metrics ("" = none)
	defaultTimeout time.Duration
	maxInFlight    int64
	retryAfterMs   int64
	// Per (model, priority), within maxInFlight: learnt from the waits (limit.go);
	// TIERMESH_ADAPTIVE_LIMIT=false leaves the fixed cap alone.
	adaptiveLimit bool
	targetWaitMs  float64
	grace         time.Duration
	tracing       bool // the mesh writes spans
	// The door traces calls itself (the default sampler: parent-based, always on at the
	// root); with any other OTEL_TRACES_SAMPLER every ModelInfer goes to the Python gateway.
	traceable       bool
	maxMessageBytes int
	// A request on the public port is at most this (TIERMESH_MAX_REQUEST_BYTES, as the Python
	// gateway): grpc-go refuses a bigger message from its header, and inflates at most this.
	maxRequestBytes int
	// A connection with no call for this long is closed (GOAWAY), and one whose handshake
	// takes longer (TIERMESH_IDLE_CONNECTION_S, as the Python gateway's ports).
	idleConnection time.Duration
	// Redis, where the door queues the jobs of models with a placement plan itself
	// ("" = the router places every job: TIERMESH_FRONT_DOOR_PLACES=0).
	redisURL string
	// The most jobs one admission call carries (TIERMESH_FRONT_DOOR_ADMIT_BATCH; 1: a call
	// a job, as before admit.go).
	admitBatch int
}

func env(key, fallback string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return fallback
}

func envInt(key string, fallback int64) int64 {
	v := env(key, "")
	if v == "" {
		return fallback
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		log.Fatalf("%s=%q: not an integer", key, v)
	}
	return n
}

func envFloat(key string, fallback float64) float64 {
	v := env(key, "")
	if v == "" {
		return fallback
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		log.Fatalf("%s=%q: not a positive number", key, v)
	}
	return f
}

// envBool reads a boolean as pydantic does (true/false, 1/0, yes/no, on/off).
func envBool(key string, fallback bool) bool {
	switch strings.ToLower(env(key, "")) {
	case "":
		return fallback
	case "1", "true", "yes", "on", "t", "y":
		return true
	case "0", "false", "no", "off", "f", "n":
		return false
	}
	log.Fatalf("%s=%q: not a boolean", key, env(key, ""))
	return false
}

func envSeconds(key string, fallback float64) time.Duration {
	v := env(key, "")
	s := fallback
	if v != "" {
		var err error
		if s, err = strconv.ParseFloat(v, 64); err != nil {
			log.Fatalf("%s=%q: not a number of seconds", key, v)
		}
	}
	return time.Duration(s * float64(time.Second))
}

// spansWritten: the mesh writes spans (as core/telemetry.spans_written decides it): the door
// traces the calls it answers (traceOf), or passes every ModelInfer on under another sampler.
func spansWritten() bool {
	if exporter := env("OTEL_TRACES_EXPORTER", ""); exporter != "" {
		for _, name := range strings.Split(exporter, ",") {
			if name == "otlp" {
				return true
			}
		}
	} else if env("OTEL_EXPORTER_OTLP_ENDPOINT", "") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "") != "" {
		return true
	}
	return env("TIERMESH_TRACE_DIR", "") != ""
}

// defaultSampler: the OpenTelemetry SDK's default sampler (parent-based, always on at the
// root), or one that samples the same way.
func defaultSampler(name string) bool {
	return name == "" || name == "parentbased_always_on"
}

func metricsAddress() string {
	port := env("TIERMESH_METRICS_PORT", "")
	if port == "" {
		return ""
	}
	return net.JoinHostPort(env("TIERMESH_METRICS_HOST", "127.0.0.1"), port)
}

// placesWith is the Redis the door queues jobs on, unless TIERMESH_FRONT_DOOR_PLACES=0 or
// Redis is a cluster (redis+cluster://, rediss+cluster://): the door's Redis client speaks
// to one server, so on a cluster the router places every job.
func placesWith() string {
	url := env("TIERMESH_REDIS_URL", "")
	if env("TIERMESH_FRONT_DOOR_PLACES", "1") == "0" || strings.Contains(strings.SplitN(url, "://", 2)[0], "+cluster") {
		return ""
	}
	return url
}

func loadConfig() config {
	for _, key := range []string{"TIERMESH_TENANTS_FILE", "TIERMESH_TLS_CERT_FILE", "TIERMESH_TLS_CLIENT_CA_FILE"} {
		if env(key, "") != "" {
			log.Fatalf("%s is set: the Go front door does not do authentication or TLS yet; "+
				"run without TIERMESH_FRONT_DOOR=go", key)
		}
	}
	upstream := env("TIERMESH_FRONT_DOOR_UPSTREAM", "")
	if upstream == "" {
		log.Fatal("TIERMESH_FRONT_DOOR_UPSTREAM (the Python gateway's address) is not set")
	}
	return config{
		listen:          net.JoinHostPort(env("TIERMESH_GATEWAY_HOST", "127.0.0.1"), env("TIERMESH_GATEWAY_PORT", "8001")),
		upstream:        upstream,
		router:          env("TIERMESH_ROUTER_ADDRESS", "127.0.0.1:8011"),
		books:           env("TIERMESH_FRONT_DOOR_BOOKS", ""),
		deliveryListen:  net.JoinHostPort("127.0.0.1", env("TIERMESH_FRONT_DOOR_DELIVERY_PORT", "0")),
		metricsListen:   metricsAddress(),
		defaultTimeout:  time.Duration(envInt("TIERMESH_DEFAULT_TIMEOUT_MS", 30000)) * time.Millisecond,
		maxInFlight:     envInt("TIERMESH_MAX_IN_FLIGHT", 4096),
		retryAfterMs:    envInt("TIERMESH_RETRY_AFTER_MS", 100),
		adaptiveLimit:   envBool("TIERMESH_ADAPTIVE_LIMIT", true),
		targetWaitMs:    envFloat("TIERMESH_TARGET_WAIT_MS", 10),
		grace:           envSeconds("TIERMESH_SHUTDOWN_GRACE_S", 10),
		tracing:         spansWritten(),
		traceable:       defaultSampler(env("OTEL_TRACES_SAMPLER", "")),
		maxMessageBytes: 64 << 20,
		maxRequestBytes: int(envInt("TIERMESH_MAX_REQUEST_BYTES", 8<<20)),
		idleConnection:  envSeconds("TIERMESH_IDLE_CONNECTION_S", 120),
		redisURL:        placesWith(),
		admitBatch:      admitBatch(),
	}
}

// admitBatch is TIERMESH_FRONT_DOOR_ADMIT_BATCH: the most jobs one admission call carries.
func admitBatch() int {
	n := envInt("TIERMESH_FRONT_DOOR_ADMIT_BATCH", defaultAdmitItems)
	if n < 1 || n > 1000 {
		log.Fatalf("TIERMESH_FRONT_DOOR_ADMIT_BATCH=%d: choose 1 to 1000 jobs a call", n)
	}
	return int(n)
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("frontdoor: ")
	if len(os.Args) == 3 && os.Args[1] == "tokenize" {
		os.Exit(tokenizeLines(os.Args[2]))
	}
	if len(os.Args) == 3 && os.Args[1] == "place" {
		os.Exit(placeLines(os.Args[2]))
	}
	if len(os.Args) == 2 && os.Args[1] == "limits" { // the limiter alone, for a parity test
		os.Exit(limitLines(envInt("TIERMESH_MAX_IN_FLIGHT", 4096), envFloat("TIERMESH_TARGET_WAIT_MS", 10), envInt("TIERMESH_RETRY_AFTER_MS", 100)))
	}
	cfg := loadConfig()
	// The collector keeps Go's default pace (GOGC=100). At 4x (GOGC=400) the door spent ~5%
	// less CPU, but its RSS stood 11 MB higher (28 against 16-17 MB in the soak) and a burst
	// of arrivals, which holds a few MB live for a moment, set the next heap goal to 5x that:
	// spikes of +10-25 MB where GOGC=100 gives half.
	// Where the door spends its CPU (go tool pprof -top BINARY FILE), written at stop.
	if path := env("TIERMESH_FRONT_DOOR_CPU_PROFILE", ""); path != "" {
		f, err := os.Create(path)
		if err != nil {
			log.Fatalf("TIERMESH_FRONT_DOOR_CPU_PROFILE=%s: %v", path, err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatalf("CPU profile: %v", err)
		}
	}

	// The Python gateway's public port behind the door is plaintext on loopback (it is the
	// public API); the router and the gateway's books are internal: mTLS when the mesh has it.
	internal := mustInternalTLS()
	upstream, err := grpc.Dial(cfg.upstream, grpc.WithInsecure(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.maxMessageBytes), grpc.MaxCallSendMsgSize(cfg.maxMessageBytes)))
	if err != nil {
		log.Fatalf("the Python gateway at %s: %v", cfg.upstream, err)
	}
	routerConn, err := grpc.Dial(cfg.router, internal.dialOption(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.maxMessageBytes), grpc.MaxCallSendMsgSize(cfg.maxMessageBytes)))
	if err != nil {
		log.Fatalf("the router at %s: %v", cfg.router, err)
	}

	deliveryLis, err := net.Listen("tcp", cfg.deliveryListen)
	if err != nil {
		log.Fatalf("the Delivery port %s: %v", cfg.deliveryListen, err)
	}
	var booked *books
	if cfg.books != "" {
		booksConn, err := grpc.Dial(cfg.books, internal.dialOption(),
			grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(cfg.maxMessageBytes)))
		if err != nil {
			log.Fatalf("the Python gateway's books at %s: %v", cfg.books, err)
		}
		booked = newBooks(booksConn)
	}
	pending := newPending()
	delivery := grpc.NewServer(append(internal.serverOptions(), grpc.MaxRecvMsgSize(cfg.maxMessageBytes))...)
	var late atomic.Int64 // results nobody here waited for
	tiermeshv1.RegisterDeliveryServer(delivery, &deliveryServer{pending: pending, books: booked, late: &late})
	go func() {
		if err := delivery.Serve(deliveryLis); err != nil {
			log.Fatalf("Delivery: %v", err)
		}
	}()

	models := newModels(upstream)
	// Known before the first call: a call that came before the first read went to the
	// Python gateway (ready models included), so what the door answered varied with timing.
	models.refresh(true)
	go models.keepFresh(refreshEvery)
	door := &door{
		cfg:      cfg,
		models:   models,
		router:   newRouterClient(routerConn),
		pending:  pending,
		proxy:    &proxy{conn: upstream},
		delivery: deliveryLis.Addr().String(),
		books:    booked,
	}
	if cfg.redisURL != "" {
		door.placer = newPlacer(cfg.redisURL, cfg.admitBatch)
	}
	if cfg.adaptiveLimit {
		door.limits = newLimits(cfg.maxInFlight, cfg.targetWaitMs, cfg.retryAfterMs)
	}
	door.metrics = newMetrics(&door.inFlight)
	door.metrics.placer = door.placer
	door.metrics.books = door.books
	door.metrics.limits = door.limits
	if _, err := serveMetrics(cfg.metricsListen, door.metrics); err != nil {
		log.Fatalf("the metrics port %s: %v", cfg.metricsListen, err)
	}

	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		log.Fatalf("the public port %s: %v", cfg.listen, err)
	}
	public := grpc.NewServer(
		grpc.CustomCodec(rawCodec{}),
		// Calls run on a pool of goroutines whose stacks have grown already (a new one per
		// call when all are busy): a refusal pays no stack growth, which was ~9% of the
		// door's CPU at 5x (runtime.newstack in its profile).
		grpc.NumStreamWorkers(publicStreamWorkers),
		grpc.UnknownServiceHandler(door.handle),
		grpc.MaxRecvMsgSize(cfg.maxRequestBytes),
		grpc.MaxSendMsgSize(cfg.maxMessageBytes),
		// The public port's bounds on a connection, as core/server.py sets them.
		grpc.MaxConcurrentStreams(maxStreamsPerConnection),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: cfg.idleConnection}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Minute}),
		grpc.ConnectionTimeout(cfg.idleConnection),
	)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		// New calls are refused; the calls in flight are answered within the grace.
		log.Printf("draining: %d calls in flight", door.inFlight.Load())
		done := make(chan struct{})
		go func() { public.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(cfg.grace):
			public.Stop()
		}
		delivery.Stop()
		if booked != nil {
			booked.flush(2 * time.Second)
			if n := booked.dropped.Load(); n > 0 {
				log.Printf("%d calls were not booked at the Python gateway (it was away)", n)
			}
		}
		pprof.StopCPUProfile()
		m := door.metrics
		log.Printf("stopped: %d requests answered here, %d passed to the Python gateway "+
			"(accepted %d, answered %d, late_results %d)",
			m.ok(), m.passed.Load(), m.accepted.Load(), m.resolved.Load(), late.Load())
		if door.placer != nil {
			log.Printf("jobs with a placement plan: %s", door.placer.describe())
		}
		os.Exit(0)
	}()
	fmt.Fprintf(os.Stderr, "frontdoor: serving on %s (delivery %s, Python gateway %s)\n",
		lis.Addr(), deliveryLis.Addr(), cfg.upstream)
	if err := public.Serve(lis); err != nil {
		log.Fatalf("public port: %v", err)
	}
	select {} // Serve returns at GracefulStop: the signal goroutine exits the process
}
