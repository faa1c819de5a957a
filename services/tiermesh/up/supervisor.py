"""Starts redis (unless given), postprocess, router, worker and gateway as separate
processes, waits until each is healthy, and stops them in drain order on SIGINT/SIGTERM:
gateway first (it refuses new requests and waits for the pending ones), then router,
worker, postprocess, and redis last. With `edge_link_ms`, the edge worker reaches redis and
postprocess through latency proxies (stopped right after the workers).

While serving, a process that dies is started again with the same command line and
environment after an exponential backoff (restarts.py), as Kubernetes restarts a crashed
container; the private redis-server restarts on the same port and replays its AOF."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiermesh.core.callers import FRONT_DOOR as DOOR_IDENTITY
from tiermesh.core.callers import WORKER
from tiermesh.up.certs import write_mesh_certs
from tiermesh.up.processes import (
    SUPERVISED_SIGNALS,
    environ_with,
    free_port,
    python_module,
    reserve,
    spawn,
    stop,
)
from tiermesh.up.redis_server import start_redis
from tiermesh.up.restarts import Backoff, RestartPolicy, next_wake_s
from tiermesh.up.tls import (
    INTERNAL_TLS_ENV,
    TlsFiles,
    check_internal_mode,
    mesh_tls,
)
from tiermesh.up.trace_ui import TraceUI, start_trace_ui


@dataclass
class UpOptions:
    host: str = "127.0.0.1"
    port: int = 8001
    redis_url: str = ""
    data_dir: Path = Path(".tiermesh")
    model_repository: Path = Path("models")
    grace_s: float = 10.0
    # The gateway's metrics port (0: a free one); the other services always get free ones.
    metrics_port: int = 8002
    # The gateway's KServe v2 REST port (0: a free one, -1: none), and its model control mode.
    http_port: int = 8000
    model_control: str = "none"
    trace_ui: bool = False
    # Worker tiers to start; the edge worker gets fewer onnxruntime threads.
    tiers: tuple[str, ...] = ("center", "edge")
    edge_threads: int = 1
    # A batch pool: one more worker on the center tier that takes only batch-job work, at
    # the lowest CPU priority (nice 19); the online workers then take none. Unpaced: on one
    # small machine it raises online latency (it drives the feeder and Redis at full rate).
    batch_pool: bool = False
    # Added round trip (ms) on the edge worker's links to redis and postprocess; 0 = none.
    edge_link_ms: float = 0.0
    ready_timeout_s: float = 60.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    extra_env: dict[str, str] = field(default_factory=dict)
    # TLS on the public port (none by default) and mutual TLS between services.
    tls: TlsFiles = field(default_factory=TlsFiles)
    # Internal mutual TLS: "on" (the files in `tls`, else a CA and a certificate per service
    # made at start in data_dir/tls) or "off" (plaintext, said at start); "" =
    # $TIERMESH_INTERNAL_TLS, else "on".
    internal_tls: str = ""
    # The private redis-server's maxmemory (redis units: 1gb, 512mb; "0": no limit), with
    # maxmemory-policy noeviction: past it writes are refused, never queue keys evicted.
    redis_maxmemory: str = "1gb"
    # The public gRPC port's process: "go" (the Go front door in front of the gateway,
    # tiermesh/frontdoor), "python" (the gateway itself) or "auto" (go unless the mesh needs
    # what only the Python gateway does, or there is no Go toolchain); "" =
    # $TIERMESH_FRONT_DOOR, else "auto".
    front_door: str = ""
    # Online workers on the center tier (0 = $TIERMESH_CENTER_WORKERS, else 1): each its own
    # process and onnxruntime session, taking from the same streams.
    center_workers: int = 0
    # What `up --insecure` exposes without API keys (core/exposure.py; "" = nothing): said
    # again in the banner, and the gateway is told it may listen beyond loopback keyless.
    insecure_warning: str = ""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    health_address: str
    # How to start it again after it dies (empty argv: never restarted).
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    backoff: Backoff | None = None


# Process name of each tier's worker.
WORKERS = {"center": "worker", "edge": "worker-edge"}
# The batch pool's worker (UpOptions.batch_pool).
BATCH_WORKER = "worker-batch"
BATCH_POOL_NICE = 19
# Latency proxies between the edge worker and what it talks to in the center.
EDGE_LINKS = ("edge-link-redis", "edge-link-postprocess")


# The center tier's further online workers (UpOptions.center_workers > 1): worker-2, ...
def extra_center_workers(count: int) -> list[str]:
    return [f"worker-{i}" for i in range(2, count + 1)]


# The Go front door's process (UpOptions.front_door "go", or "auto" choosing it).
FRONT_DOOR = "frontdoor"
FRONT_DOORS = ("auto", "go", "python")


def door_refuses(tls: bool, tenants_file: str) -> list[str]:
    """What a mesh asks of its public port that the Go front door does not do yet (it does
    internal mutual TLS)."""
    return [*(["TLS"] if tls else []), *(["API keys"] if tenants_file else [])]


def identity_of(name: str) -> str:
    """The internal identity (core/callers.py) of a process of the mesh, by its name."""
    if name == FRONT_DOOR:
        return DOOR_IDENTITY
    if name.startswith("worker"):  # every tier's, the extra and the batch pool's
        return WORKER
    return name


# Where `up` writes the internal CA and each service's certificate (internal TLS "on" with
# no files given), and the private Redis's URL with its password (never printed).
TLS_FOLDER = "tls"
REDIS_URL_FILE = "redis-url"


def masked(url: str) -> str:
    """`url` with its password replaced by ***, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, address = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{address}"))


# Starts of one service within `tiermesh up`'s own start before it gives up.
START_ATTEMPTS = 3


# The health check's channel retries a closed port every 50-200 ms. gRPC's default
# reconnect backoff (1 s, growing 1.6x) left `up` noticing a serving gateway up to ~1 s
# late, a window in which the mesh serves but `up` still counts it as starting.
HEALTH_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 200),
]


class StartupError(RuntimeError):
    pass


def wait_healthy(
    svc: Service, timeout_s: float, credentials: grpc.ChannelCredentials | None = None
) -> None:
    """Block until the service's grpc.health.v1 says SERVING, or raise StartupError when it
    exits or the timeout passes. Each check waits for the port to open (wait_for_ready).
    With `credentials` the check speaks TLS (a TLS-only port, or mTLS with a client
    certificate); a failing handshake looks like a port not open yet until the timeout."""
    deadline = time.monotonic() + timeout_s
    with (
        grpc.insecure_channel(svc.health_address, options=HEALTH_CHANNEL_OPTIONS)
        if credentials is None
        else grpc.secure_channel(svc.health_address, credentials, options=HEALTH_CHANNEL_OPTIONS)
    ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if svc.proc.poll() is not None:
                raise StartupError(f"{svc.name} exited with code {svc.proc.returncode}")
            try:
                reply = stub.Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0, wait_for_ready=True
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                continue  # not listening yet: the next Check waits for it again
            # Listening but not serving yet: give it a moment (returns early if it dies).
            with contextlib.suppress(subprocess.TimeoutExpired):
                svc.proc.wait(timeout=0.05)
    raise StartupError(f"{svc.name} not healthy within {timeout_s}s")


def wait_listening(svc: Service, timeout_s: float) -> None:
    """Block until the service accepts TCP connections on its address, or raise
    StartupError when it exits or the timeout passes."""
    host, _, port = svc.health_address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if svc.proc.poll() is not None:
            raise StartupError(f"{svc.name} exited with code {svc.proc.returncode}")
        try:
            socket.create_connection((host, int(port)), timeout=1.0).close()
            return
        except OSError:  # not listening yet: give it a moment (returns early if it dies)
            with contextlib.suppress(subprocess.TimeoutExpired):
                svc.proc.wait(timeout=0.05)
    raise StartupError(f"{svc.name} not listening within {timeout_s}s")


def redis_target(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise StartupError(f"edge_link_ms needs a TCP redis URL, not {url!r}")
    return parts.hostname, parts.port or 6379


def with_address(url: str, address: str) -> str:
    """`url` with its host:port replaced (credentials, database and query kept)."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{address}"))


class Mesh:
    """Owns the child processes of one `tiermesh up`."""

    def __init__(self, opts: UpOptions) -> None:
        self.opts = opts
        self.services: list[Service] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_port = 0
        self.redis_backoff = Backoff(opts.restart, time.monotonic())
        self.redis_url = opts.redis_url
        self.metrics_ports: dict[str, int] = {}
        self.http_port = opts.http_port
        self.trace_ui: TraceUI | None = None
        self.extra_workers: list[str] = []
        # Which process serves the public gRPC port, and why (the banner says it).
        self.door_choice = ""
        # What the internal hops speak (the banner says it).
        self.internal_tls = ""
        self.redis_password = ""

    def _certs_to_make(self) -> Path | None:
        """Where the mesh's internal certificates are to be made: with internal TLS on and
        no files given, a CA and one certificate per service, fresh at every start (None:
        the files given, or internal TLS off)."""
        opts = self.opts
        mode = opts.internal_tls or self._setting(INTERNAL_TLS_ENV, "on")
        check_internal_mode(mode, opts.tls)
        if mode == "off":
            self.internal_tls = (
                "OFF (--internal-tls off): router, postprocess and the Delivery ports take "
                "calls from anyone who reaches 127.0.0.1, unauthenticated"
            )
            return None
        if opts.tls.internal_given():
            self.internal_tls = "on (the certificates given)"
            return None
        folder = opts.data_dir / TLS_FOLDER
        self.internal_tls = f"on (a CA and a certificate per service in {folder})"
        return folder

    def start(self) -> None:
        opts = self.opts
        to_make = self._certs_to_make()
        tls = mesh_tls(opts.tls)  # checked before anything starts
        door = self._front_door(tls.public)
        if "center" in opts.tiers:
            self.extra_workers = extra_center_workers(self._center_workers())
        # Nothing is written before every check above has passed.
        if to_make is not None:
            write_mesh_certs(to_make)
            tls = mesh_tls(dataclasses.replace(opts.tls, internal_tls_dir=to_make))
        elif tls.internal is None:
            _say(f"internal mTLS {self.internal_tls}")
        # The ports asked for are never handed out again to an internal service.
        for asked in (opts.port, self.http_port, opts.metrics_port):
            if asked > 0:
                reserve(asked)
        if not self.redis_url:
            self.redis_port = free_port()
            self.redis_password = secrets.token_hex(24)
            self.redis = self._restart_redis()
            self.redis_url = f"redis://:{self.redis_password}@127.0.0.1:{self.redis_port}/0"
            _write_private(opts.data_dir / REDIS_URL_FILE, self.redis_url + "\n")
        if opts.trace_ui:
            self.trace_ui = start_trace_ui(opts.data_dir)
        ports = {
            k: free_port()
            for k in (
                *("router", "postprocess", "worker", "worker-edge", BATCH_WORKER, "delivery"),
                *(("gateway-behind-door", "door-delivery") if door else ()),
                *self.extra_workers,
            )
        }
        if self.http_port == 0:
            self.http_port = free_port()
        env = environ_with(
            TIERMESH_REDIS_URL=self.redis_url,
            TIERMESH_MODEL_REPOSITORY=str(opts.model_repository),
            TIERMESH_SHUTDOWN_GRACE_S=str(opts.grace_s),
            TIERMESH_ROUTER_HOST="127.0.0.1",
            TIERMESH_ROUTER_PORT=str(ports["router"]),
            TIERMESH_ROUTER_ADDRESS=f"127.0.0.1:{ports['router']}",
            TIERMESH_POSTPROCESS_HOST="127.0.0.1",
            TIERMESH_POSTPROCESS_PORT=str(ports["postprocess"]),
            TIERMESH_POSTPROCESS_ADDRESS=f"127.0.0.1:{ports['postprocess']}",
            TIERMESH_WORKER_HOST="127.0.0.1",
            TIERMESH_WORKER_HEALTH_PORT=str(ports["worker"]),
            TIERMESH_DELIVERY_HOST="127.0.0.1",
            TIERMESH_DELIVERY_PORT=str(ports["delivery"]),
            TIERMESH_GATEWAY_HOST=opts.host,
            TIERMESH_GATEWAY_PORT=str(opts.port),
            TIERMESH_HTTP_HOST=opts.host,
            TIERMESH_HTTP_PORT=str(self.http_port),
            TIERMESH_MODEL_CONTROL=opts.model_control,
            TIERMESH_INSECURE="true" if opts.insecure_warning else "false",
            **(self.trace_ui.otel_env() if self.trace_ui else {}),
            **tls.env,
            **opts.extra_env,
        )
        plan = [
            ("postprocess", f"127.0.0.1:{ports['postprocess']}"),
            ("router", f"127.0.0.1:{ports['router']}"),
            *(
                (WORKERS[tier], f"127.0.0.1:{ports[WORKERS[tier]]}")
                for tier in ("center", "edge")
                if tier in opts.tiers
            ),
            *((name, f"127.0.0.1:{ports[name]}") for name in self.extra_workers),
            *([(BATCH_WORKER, f"127.0.0.1:{ports[BATCH_WORKER]}")] if opts.batch_pool else []),
            # A TLS-only public port: its health is checked on the Delivery port (up/tls.py);
            # so it is with internal mTLS, where every check presents the probe's certificate.
            (
                "gateway",
                f"127.0.0.1:{ports['delivery']}"
                if tls.public or tls.internal is not None
                else f"127.0.0.1:{ports['gateway-behind-door']}"
                if door
                else f"{opts.host}:{opts.port}",
            ),
        ]
        self.metrics_ports = {
            name: opts.metrics_port if name == "gateway" and opts.metrics_port else free_port()
            for name, _ in plan
        }
        edge_link: dict[str, str] = {}
        if opts.edge_link_ms > 0 and "edge" in opts.tiers:
            edge_link = self._start_edge_links(env)
        # Everything behind the gateway starts at once (each is a Python process importing
        # for seconds, a worker also loads its models); the gateway starts once they all
        # serve, so a healthy public port means a mesh that answers.
        *backends, front = plan
        if door:  # the Python gateway serves behind the door, on an internal port
            env = {**env, "TIERMESH_GATEWAY_HOST": "127.0.0.1"}
            env["TIERMESH_GATEWAY_PORT"] = str(ports["gateway-behind-door"])
        for group in (backends, [front]):
            started = [
                self._spawn_service(
                    name, address, {**env, **tls.own.get(identity_of(name), {})}, ports, edge_link
                )
                for name, address in group
            ]
            for svc in started:
                self._wait_started(svc, tls.internal)
        if door:
            door_env = {
                **env,
                "TIERMESH_GATEWAY_HOST": opts.host,
                "TIERMESH_GATEWAY_PORT": str(opts.port),
                "TIERMESH_FRONT_DOOR_UPSTREAM": f"127.0.0.1:{ports['gateway-behind-door']}",
                "TIERMESH_FRONT_DOOR_DELIVERY_PORT": str(ports["door-delivery"]),
                # The gateway's internal port, where the door books what it answered.
                "TIERMESH_FRONT_DOOR_BOOKS": f"127.0.0.1:{ports['delivery']}",
                "TIERMESH_METRICS_PORT": str(
                    self.metrics_ports.setdefault(FRONT_DOOR, free_port())
                ),
                **tls.own.get(DOOR_IDENTITY, {}),
            }
            # Its health is the gateway's, asked through the door (which passes it on).
            svc = self._spawn(FRONT_DOOR, [str(door)], door_env, f"{opts.host}:{opts.port}")
            self._wait_started(svc, None)

    def _setting(self, name: str, default: str) -> str:
        """A choice the mesh's environment makes when its option leaves it open."""
        return environ_with(**self.opts.extra_env).get(name, default)

    def _center_workers(self) -> int:
        raw = self.opts.center_workers or self._setting("TIERMESH_CENTER_WORKERS", "1")
        try:
            count = int(raw)
        except ValueError:
            count = 0
        if count < 1:
            raise StartupError(f"TIERMESH_CENTER_WORKERS={raw!r}: a whole number of at least 1")
        return count

    def _front_door(self, tls: bool) -> Path | None:
        """The Go front door's binary (built now unless cached) when the mesh runs one;
        `door_choice` says which door serves and why."""
        choice = self.opts.front_door or self._setting("TIERMESH_FRONT_DOOR", "auto")
        if choice not in FRONT_DOORS:
            raise StartupError(
                f"TIERMESH_FRONT_DOOR={choice!r}: choose one of {', '.join(FRONT_DOORS)}"
            )
        if choice == "python":
            self.door_choice = "python (asked for)"
            return None
        refused = door_refuses(tls, self._setting("TIERMESH_TENANTS_FILE", ""))
        if choice == "go" and refused:
            raise StartupError(
                f"the Go front door does not do {' or '.join(refused)} yet: run it without "
                "them, or with TIERMESH_FRONT_DOOR=python"
            )
        if choice == "auto":
            from tiermesh.core.telemetry import spans_written, uses_default_sampler

            env = environ_with(**self.opts.extra_env)
            # Spans under another sampler than the default: the door would pass every call
            # on, one hop more for each (with the default it traces the calls itself).
            # Explicit model control: the door learns of an unload within its index refresh
            # (2 s), while the gateway refuses the model at once.
            tracing = self.opts.trace_ui or spans_written(env)
            sampler = tracing and not uses_default_sampler(env)
            explicit = self.opts.model_control == "explicit"
            lacks = [
                *refused,
                *(["OTEL_TRACES_SAMPLER=" + env["OTEL_TRACES_SAMPLER"]] if sampler else []),
                *(["explicit model control"] if explicit else []),
            ]
            if lacks:
                self.door_choice = f"python (the Go door does not do {' or '.join(lacks)} yet)"
                return None
        from tiermesh.core.cache_dir import default_cache_dir
        from tiermesh.frontdoor.build import FrontDoorUnavailable, build

        try:
            binary = build(default_cache_dir())
        except FrontDoorUnavailable as exc:
            if choice == "go":
                raise StartupError(str(exc)) from None
            self.door_choice = f"python ({exc}; `make frontdoor` installs and builds it)"
            return None
        self.door_choice = "go (TIERMESH_FRONT_DOOR=python for the Python gateway alone)"
        return binary

    def _spawn_service(
        self,
        name: str,
        address: str,
        env: dict[str, str],
        ports: dict[str, int],
        link: dict[str, str],
    ) -> Service:
        """One service of the plan in its own environment, started (not waited for)."""
        child_env = {**env, "TIERMESH_METRICS_PORT": str(self.metrics_ports[name])}
        extra = name in self.extra_workers
        if self.opts.batch_pool and (name in WORKERS.values() or extra):
            child_env["TIERMESH_BATCH_JOBS"] = "false"  # the batch pool takes that work
        if extra:
            child_env.update(
                TIERMESH_WORKER_TIER="center", TIERMESH_WORKER_HEALTH_PORT=str(ports[name])
            )
        if name == BATCH_WORKER:
            child_env.update(
                TIERMESH_WORKER_TIER="center",
                TIERMESH_WORKER_HEALTH_PORT=str(ports[name]),
                TIERMESH_WORKER_ONLINE="false",
                TIERMESH_BATCH_JOBS="true",
                TIERMESH_WORKER_NICE=str(BATCH_POOL_NICE),
            )
        if name == WORKERS["edge"]:
            # The edge tier: its own heartbeats and streams, deliberately less compute,
            # and (with edge_link_ms) a slow link to the center.
            child_env.update(
                TIERMESH_WORKER_TIER="edge",
                TIERMESH_WORKER_HEALTH_PORT=str(ports[name]),
                TIERMESH_INTRA_OP_THREADS=str(self.opts.edge_threads),
                **link,
            )
        worker = name in WORKERS.values() or name == BATCH_WORKER or extra
        module = "tiermesh.worker" if worker else f"tiermesh.{name}"
        return self._spawn(name, python_module(module), child_env, address)

    def _wait_started(self, svc: Service, credentials: grpc.ChannelCredentials | None) -> None:
        """wait_healthy; a service that dies while starting is started again, as it would be
        once serving (START_ATTEMPTS in all), so one crash at start does not sink the mesh."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                wait_healthy(svc, self.opts.ready_timeout_s, credentials)
                return
            except StartupError as exc:
                if svc.proc.poll() is None or attempt == START_ATTEMPTS:
                    raise
                svc.proc = spawn(svc.argv, svc.env)
                _say(f"{svc.name} died while starting ({exc}); started again (pid {svc.proc.pid})")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], address: str) -> Service:
        backoff = Backoff(self.opts.restart, time.monotonic())
        svc = Service(name, spawn(argv, env), address, argv, env, backoff)
        self.services.append(svc)
        return svc

    def _start_edge_links(self, env: dict[str, str]) -> dict[str, str]:
        """Start a latency proxy in front of redis and one in front of postprocess (which
        need not be up yet: a proxy connects per accepted connection); returns the edge
        worker's environment pointing at them."""
        redis_host, redis_port = redis_target(self.redis_url)
        post_host, _, post_port = env["TIERMESH_POSTPROCESS_ADDRESS"].rpartition(":")
        targets = {
            EDGE_LINKS[0]: f"{redis_host}:{redis_port}",
            EDGE_LINKS[1]: f"{post_host}:{post_port}",
        }
        listen = {}
        for name, target in targets.items():
            listen[name] = f"127.0.0.1:{free_port()}"
            argv = [
                *python_module("tiermesh.up.latency_proxy"),
                *("--listen", listen[name], "--target", target),
                *("--rtt-ms", str(self.opts.edge_link_ms)),
            ]
            svc = self._spawn(name, argv, env, listen[name])
            wait_listening(svc, self.opts.ready_timeout_s)
        return {
            "TIERMESH_REDIS_URL": with_address(self.redis_url, listen[EDGE_LINKS[0]]),
            "TIERMESH_POSTPROCESS_ADDRESS": listen[EDGE_LINKS[1]],
        }

    def stop(self) -> dict[str, int]:
        """Stop in drain order; returns each process's exit code."""
        codes: dict[str, int] = {}
        order = [
            *(FRONT_DOOR, "gateway", "router", *WORKERS.values(), *self.extra_workers),
            *(BATCH_WORKER, *EDGE_LINKS, "postprocess"),
        ]
        for name in order:
            for svc in self.services:
                if svc.name == name:
                    codes[name] = stop(svc.proc, self.opts.grace_s + 5)
        if self.redis is not None:
            codes["redis"] = stop(self.redis, 10)
        if self.trace_ui is not None:  # last: it receives the services' final spans
            codes["trace-ui"] = stop(self.trace_ui.proc, 10)
        return codes

    def supervise(self, now: float) -> float | None:
        """Called whenever a child may have exited and when a restart falls due: notices
        exits, restarts what is due. Returns the seconds until the next pending restart
        (None when nothing waits). A restarted worker reclaims what the dead one had read;
        a restarted redis-server replays its AOF, and every service reconnects by itself."""
        if self.redis is not None:
            self.redis = _revive(
                "redis-server", self.redis, self.redis_backoff, now, self._restart_redis
            )
        for svc in self.services:
            if svc.backoff is not None and svc.argv:
                svc.proc = _revive(
                    svc.name,
                    svc.proc,
                    svc.backoff,
                    now,
                    functools.partial(spawn, svc.argv, svc.env),
                )
        return next_wake_s(
            [self.redis_backoff, *(s.backoff for s in self.services if s.backoff)], now
        )

    def _restart_redis(self) -> subprocess.Popen[bytes]:
        """Same port, password and data folder: it replays its AOF before answering PING."""
        return start_redis(
            self.redis_port,
            self.opts.data_dir / "redis",
            password=self.redis_password,
            maxmemory=self.opts.redis_maxmemory,
        )


def _revive(
    name: str,
    proc: subprocess.Popen[bytes],
    backoff: Backoff,
    now: float,
    restart: Callable[[], subprocess.Popen[bytes]],
) -> subprocess.Popen[bytes]:
    """The process to keep watching: `proc`, or its successor once its restart fell due."""
    if backoff.due_at is None and proc.poll() is not None:
        delay = backoff.exited(now)
        _say(
            f"{name} exited with code {proc.returncode}; restarting in {delay:.1f}s "
            f"({backoff.crashes} crash(es) in a row)"
        )
    if not backoff.due(now):
        return proc
    try:
        successor = restart()
    except (RuntimeError, OSError) as exc:
        backoff.restarted(now)  # a start that failed at once counts as one more crash
        delay = backoff.exited(time.monotonic())
        _say(f"{name} did not come back ({exc}); retrying in {delay:.1f}s")
        return proc
    backoff.restarted(now)
    _say(f"{name} restarted (pid {successor.pid}, restart {backoff.restarts})")
    return successor


def _http_url(opts: UpOptions, port: int) -> str:
    scheme = "https" if opts.tls.tls_cert else "http"
    return f"{scheme}://{opts.host}:{port}"


def _say(message: str) -> None:
    print(f"tiermesh up: {message}", file=sys.stderr, flush=True)


def _write_private(path: Path, text: str) -> None:
    """A file only its owner may read, never briefly readable by others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)


def run(opts: UpOptions) -> int:
    """The `tiermesh up` command: start, serve until a signal or a child's death, stop."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SUPERVISED_SIGNALS)
    mesh = Mesh(opts)
    try:
        try:
            mesh.start()
        except Exception as exc:
            print(f"tiermesh up: {exc}", file=sys.stderr)
            return 1
        endpoint = f"{opts.host}:{opts.port}"
        redis_shown = masked(mesh.redis_url)
        print(
            f"\ntiermesh is serving KServe v2 gRPC on {endpoint} (redis: {redis_shown})\n"
            + (
                f"Redis: its password is in {opts.data_dir / REDIS_URL_FILE} (the full URL)\n"
                if mesh.redis_password
                else ""
            )
            + (
                f"KServe v2 REST: {_http_url(opts, mesh.http_port)}\n"
                if mesh.http_port >= 0
                else ""
            )
            + "Metrics (Prometheus): "
            + ", ".join(
                f"{name} http://127.0.0.1:{port}/metrics"
                for name, port in mesh.metrics_ports.items()
            )
            + (f"\nTraces: {mesh.trace_ui.ui_url}" if mesh.trace_ui else "")
            + f"\nFront door: {mesh.door_choice}"
            + f"\nInternal mTLS: {mesh.internal_tls}"
            + (f"\n\n*** {opts.insecure_warning} ***\n" if opts.insecure_warning else "")
            + "\nTry, from another shell:\n"
            f"  .venv/bin/tiermesh infer --url {endpoint} --model mlp --data '[[1, 2, 3, 4]]'\n"
            "Ctrl-C drains and stops every process.\n",
            flush=True,
        )
        wake_s: float | None = None
        while True:
            info: signal.struct_siginfo | None
            if wake_s is None:
                info = signal.sigwaitinfo(SUPERVISED_SIGNALS)
            else:  # a restart falls due: wake for it even without a signal
                info = signal.sigtimedwait(SUPERVISED_SIGNALS, wake_s)
            if info is not None and info.si_signo in (signal.SIGINT, signal.SIGTERM):
                print("tiermesh up: draining...", file=sys.stderr, flush=True)
                return 0
            wake_s = mesh.supervise(time.monotonic())
    finally:
        codes = mesh.stop()
        print(f"tiermesh up: stopped {codes}", file=sys.stderr, flush=True)
