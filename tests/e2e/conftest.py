"""`tiermesh up` as a real subprocess: its own redis-server on a free port, the four
services as separate processes, spans written to JSON-lines files.

With TIERMESH_TEST_REDIS=cluster every mesh uses a local Redis Cluster of its own (three
primaries with a replica each, tests/redis_cluster.py) instead, stopped with the mesh (or
at the session's end): the e2e suites run unchanged in cluster mode. (Meshes of one test
session run side by side, a module's beside a test's own: one Redis for them all would mix
their work.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conftest import copy_repository
from tests.polling import eventually
from tests.redis_cluster import LocalCluster
from tiermesh.core.redis_client import is_cluster_url
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Service, wait_healthy

CLUSTER_RUN = os.environ.get("TIERMESH_TEST_REDIS", "") == "cluster"
# A test of what only a single Redis server has: `tiermesh up`'s private redis-server (its
# process, password, restart from AOF) or the Go door placing jobs itself.
single_redis = pytest.mark.skipif(
    CLUSTER_RUN, reason="about the single Redis server; this run uses a Redis Cluster"
)
# The meshes' clusters in a cluster-mode run that are still running.
_clusters: list[LocalCluster] = []


@pytest.fixture(scope="session", autouse=CLUSTER_RUN)
def redis_clusters_stopped() -> Iterator[None]:
    """At the session's end, no mesh's cluster outlives it."""
    try:
        yield
    finally:
        for cluster in list(_clusters):
            cluster.stop()
        _clusters.clear()


@dataclass
class UpProcess:
    proc: subprocess.Popen[bytes]
    url: str
    trace_dir: Path
    log: Path
    external_redis: str = ""
    cluster: LocalCluster | None = None  # its own Redis Cluster (a cluster-mode run)

    def release(self) -> None:
        """Stop its cluster, once the mesh has stopped."""
        if self.cluster is not None and self.proc.poll() is not None:
            self.cluster.stop()
            if self.cluster in _clusters:
                _clusters.remove(self.cluster)
            self.cluster = None

    def children(self) -> dict[str, int]:
        """pid of each direct child of `tiermesh up`, by service (redis-server and the Go front
        door included)."""
        found: dict[str, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError):
                continue
            if int(fields[1]) != self.proc.pid:
                continue
            for name in ("gateway", "router", "worker", "postprocess"):
                if f"tiermesh.{name}" in cmdline:
                    environ = _environ(stat.parent) if name == "worker" else {}
                    if environ.get("TIERMESH_WORKER_TIER") == "edge":
                        name = "worker-edge"
                    elif environ.get("TIERMESH_WORKER_ONLINE") == "false":
                        name = "worker-batch"
                    found[name] = int(stat.parent.name)
            if "redis-server" in cmdline:
                found["redis"] = int(stat.parent.name)
            if cmdline.split(" ", 1)[0].endswith("/frontdoor"):  # the Go front door's binary
                found["frontdoor"] = int(stat.parent.name)
        return found

    def spans(self) -> list[dict[str, Any]]:
        """The spans written so far: complete lines only (a service may be writing the
        next one as this reads)."""
        out = []
        for f in self.trace_dir.glob("*.jsonl"):
            text = f.read_text()
            for line in text[: text.rfind("\n") + 1].splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return out

    def banner(self) -> str:
        """The log once `tiermesh up` printed its banner (just after the gateway is healthy)."""
        deadline = time.monotonic() + 30
        while "tiermesh is serving" not in (text := self.log.read_text()):
            assert time.monotonic() < deadline, "tiermesh up never printed its banner"
            time.sleep(0.02)
        return text

    def redis_url(self) -> str:
        """The private redis-server `tiermesh up` started, password included: its banner
        shows the URL masked and names the owner-only file holding it whole. In a cluster
        mode run, the cluster's URL."""
        if self.external_redis:
            return self.external_redis
        found = re.search(r"Redis: its password is in (\S+) ", self.banner())
        assert found, "no redis URL file in the tiermesh up banner"
        return Path(found.group(1)).read_text().strip()

    def rest_url(self) -> str:
        """host:port of the KServe v2 REST door (from the tiermesh up banner)."""
        found = re.search(r"KServe v2 REST: http://(\S+)", self.banner())
        assert found, "no REST endpoint in the tiermesh up banner"
        return found.group(1)

    def metrics_urls(self) -> dict[str, str]:
        """Each service's Prometheus endpoint, from the tiermesh up banner."""
        return dict(re.findall(r"(\w+) (http://127\.0\.0\.1:\d+/metrics)", self.banner()))

    def interrupt(self, timeout_s: float = 60) -> int:
        """Ctrl-C, as a terminal sends it to the foreground process; its exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout_s)


def _environ(proc_dir: Path) -> dict[str, str]:
    try:
        raw = (proc_dir / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def start_up(
    tmp: Path,
    grace_s: float = 5.0,
    fetched: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    tiers: Sequence[str] = ("center",),
    up_args: Sequence[str] = (),
    credentials: grpc.ChannelCredentials | None = None,
    span_files: bool = True,
    rollout_model: str = "",
    repository_hook: Callable[[Path], None] | None = None,
) -> UpProcess:
    """`up_args` are added to the `tiermesh up` command line (e.g. TLS flags); with
    `credentials` the first health check of the public port speaks TLS. Without
    `span_files` no service writes its spans (each written synchronously: a cost that
    load tests should not measure, and that production, exporting in batches, does not pay).
    `rollout_model` adds a model with good, drifting and failing versions (tests/conftest.py);
    `repository_hook` changes the repository before the mesh starts."""
    repo = copy_repository(tmp / "models", fetched=fetched, rollout_model=rollout_model)
    if repository_hook is not None:
        repository_hook(repo)
    port = free_port()
    env = dict(os.environ)
    env.pop("TIERMESH_REDIS_URL", None)
    cluster = None
    if CLUSTER_RUN and "TIERMESH_REDIS_URL" not in (extra_env or {}):
        cluster = LocalCluster(tmp / "redis-cluster").start()
        _clusters.append(cluster)
        env["TIERMESH_REDIS_URL"] = cluster.url
    env.update(TIERMESH_LOG_FORMAT="json", TIERMESH_HEARTBEAT_TTL_MS="30000")
    if span_files:
        env["TIERMESH_TRACE_DIR"] = str(tmp / "traces")
    else:
        env.pop("TIERMESH_TRACE_DIR", None)
    env.update(extra_env or {})
    log = tmp / "up.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tiermesh.cli.main",
            "up",
            "--port",
            str(port),
            "--data-dir",
            str(tmp / "data"),
            "--repository",
            str(repo),
            "--grace-s",
            str(grace_s),
            "--metrics-port",
            "0",
            "--tiers",
            ",".join(tiers),
            # The REST door on a free port: meshes of one test session run side by side.
            "--http-port",
            "0",
            *up_args,
        ],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        # A session of its own, as a mesh on a server has: its services share one CPU share
        # (autogroup), and this process, their client, has another.
        start_new_session=True,
    )
    up = UpProcess(
        proc, f"127.0.0.1:{port}", tmp / "traces", log, env.get("TIERMESH_REDIS_URL", ""), cluster
    )
    try:
        wait_healthy(Service("gateway", proc, up.url), timeout_s=90, credentials=credentials)
        # `up` has finished starting only once it printed its banner: until then a service
        # that exits (a fault test's strike) is restarted by the start path, not supervised.
        up.banner()
    except Exception:
        proc.kill()
        proc.wait()
        up.release()
        raise AssertionError(f"tiermesh up did not start:\n{log.read_text()[-4000:]}") from None
    return up


@contextmanager
def running(tmp: Path, **kwargs: Any) -> Iterator[UpProcess]:
    """`start_up(tmp, **kwargs)`, interrupted on the way out unless it already stopped."""
    up = start_up(tmp, **kwargs)
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()
        up.release()


@pytest.fixture(scope="module")
def mesh_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running(tmp_path_factory.mktemp("up")) as up:
        yield up


@pytest.fixture
def new_up(tmp_path: Path) -> Iterator[Callable[..., UpProcess]]:
    """Start a mesh of this test's own; whatever happens, none outlives the test."""
    started: list[UpProcess] = []

    def start(**kwargs: Any) -> UpProcess:
        up = start_up(tmp_path / f"up{len(started)}", **kwargs)
        started.append(up)
        return up

    try:
        yield start
    finally:
        for up in started:
            if up.proc.poll() is None:
                up.interrupt()
            up.release()


COUNTS = ("accepted", "answered", "late_results")
DOOR_STOPPED = re.compile(
    r"frontdoor: stopped: .*\(accepted (\d+), answered (\d+), late_results (\d+)\)"
)


def stop_counts(up: UpProcess) -> list[dict[str, int]]:
    """What each process on the public path counted over its life, in the order they
    stopped: every Python gateway's `gateway stopped` log line and every Go front door's stop
    line (read once `tiermesh up` has stopped): requests `accepted` (placed on a queue),
    `answered` (their result reached the waiting call) and `late_results` (results for a call
    already answered or gone: duplicates and stragglers, dropped)."""
    out = []
    for line in up.log.read_text().splitlines():
        if '"gateway stopped"' in line and line.startswith("{"):
            doc = json.loads(line)
            out.append({k: int(doc[k]) for k in COUNTS})
        elif found := DOOR_STOPPED.search(line):
            out.append(dict(zip(COUNTS, map(int, found.groups()), strict=True)))
    return out


def gateway_counts(up: UpProcess) -> dict[str, int]:
    """`stop_counts` summed: what the public path as a whole accepted, answered and dropped
    (with the Go front door, its calls and those it passed to the Python gateway)."""
    counts = stop_counts(up)
    assert counts, "no process on the public path logged its stop"
    return {k: sum(c[k] for c in counts) for k in COUNTS}


def door_serves(up: UpProcess) -> bool:
    """Whether the Go front door holds the public port (`tiermesh up --front-door auto`
    chose it, or it was asked for)."""
    return "frontdoor" in up.metrics_urls()


def fail_redis(up: UpProcess, key: str, timeout_s: float = 30) -> None:
    """SIGKILL the Redis holding `key`: the private redis-server (`tiermesh up` starts it
    again from its AOF), or in a cluster-mode run the primary of `key`'s slot (its replica
    takes over; the killed node comes back as a replica, so later tests keep one)."""
    if up.cluster is not None:
        killed, _ = up.cluster.fail_over(key)
        up.cluster.restart(killed)
        return
    server = up.children()["redis"]
    os.kill(server, signal.SIGKILL)
    eventually(lambda: up.children().get("redis", server) != server, "redis restarted", timeout_s)


def door_places(up: UpProcess) -> bool:
    """Whether the Go front door queues jobs itself (core/direct_plan.py): it serves, and
    Redis is one server (on a cluster the router places every job)."""
    return door_serves(up) and not is_cluster_url(up.redis_url())


def scrape_metrics(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample a Prometheus endpoint serves, by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def service_metric(up: UpProcess, service: str, name: str, **labels: str) -> float:
    """The sum of a service's series `name` whose labels include `labels` (0 without one)."""
    wanted = set(labels.items())
    samples = scrape_metrics(up.metrics_urls()[service])
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def report_figures(
    name: str, figures: dict[str, Any], out: Path, record_property: Callable[[str, Any], None]
) -> str:
    """Writes a scenario's figures to `out` (JSON), records them as a junit property, and
    returns the one-line table row (print it with capsys disabled so it shows without -s)."""
    out.write_text(json.dumps(figures, indent=2, sort_keys=True, default=str))
    record_property(name, json.dumps(figures, sort_keys=True, default=str))
    return f"{name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()) + f" ({out})"
