"""A multi-node rehearsal on one machine: three nodes, each a network namespace of the
test's own on one bridge (tests/netns.py), every service binding its node's address (no
127.0.0.1 between nodes), and a Redis Cluster of three primaries with a replica each, spread
as redis-cli spreads them: a primary and a replica on every node, no primary with its
replica on its own node (tests/redis_cluster.py layout):

    node    address       processes
    front   10.213.X.1    router, postprocess, gateways A and B;  primary P1, replica of P3
    edge    10.213.X.2    the edge worker;                         primary P2, replica of P1
    center  10.213.X.3    the center worker;                       primary P3, replica of P2

P3 holds mlp's slot (its streams, worker sets, rates); P2 some other models' and keys. The
test process calls the gateways from its own address on the bridge (10.213.X.254). mlp is
given two tiers: a light call ([1, 4], cost 4) goes to edge, a heavy one ([4, 4], cost 16)
to center; calls are paced (open loop), so that calls stuck on a dead node do not hold the
next ones back.

1. Light calls are served by edge and heavy ones by center (gateway A).
2. The edge node loses its power: SIGKILL of every process in it, the edge worker, the
   primary P2 (its replica on center takes over: the cluster serves every slot again) and
   P1's replica. Until the edge worker's heartbeat expires the router still queues light
   work on edge; the router's stranded-work task then moves it to center; a worker's
   reads of the slots still served go on while P2's are away. Measured: the time from the
   kill until light calls are answered by center (at most the heartbeat TTL plus one
   second), and what gateway A lost (stopped with SIGTERM once the phase is over: its stop
   line's accepted - answered).
3. P3, mlp's primary, is SIGKILLed under load (its replica on front is promoted); what
   gateway B lost is counted the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from redis.cluster import key_slot
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_repository
from tests.e2e.conftest import COUNTS
from tests.e2e.load import Call, Load
from tests.e2e.test_faults_e2e import FAST_RECOVERY
from tests.netns import Network, network
from tests.polling import eventually
from tests.redis_cluster import LocalCluster, slot_range
from tiermesh.bench.calls import values_of
from tiermesh.core.keys import model_tag
from tiermesh.up.supervisor import Service, StartupError, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HEARTBEAT_TTL_S = 2.0
# Light calls cost at most the edge's max_cost (rows x 4 values); heavy ones more.
MLP_TIERS = "tiers: {edge: {max_cost: 4}, center: {}}\n"
LIGHT_ROWS, HEAVY_ROWS = 1, 4
# Ports: each node has a port space of its own.
ROUTER, POSTPROCESS, WORKER_HEALTH = 8012, 8013, 8014
GATEWAYS = {"A": (8001, 8011), "B": (8101, 8111)}  # public port, delivery port
# Calls that end otherwise than answered: refusals the status table documents.
REFUSALS = {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}
CALL_TIMEOUT_S = 6.0
# The node of each Redis node, by index (cluster_layout).
REDIS_NODES = ("front", "front", "edge", "edge", "center", "center")


@dataclass(frozen=True, slots=True)
class Served(Call):
    kind: str = "light"  # or "heavy"
    tier: str = ""  # the tier that answered ("" unless OK)


@dataclass
class Traffic(Load):
    """Paced mlp calls in a thread of their own, light ones by the first caller and heavy
    ones by the second, each call a task of its own: a call waiting on a dead node does
    not hold the next one back. At most `max_in_flight` at once (a tick beyond is skipped
    and counted), so the calls are bounded by the rates and the time it runs."""

    callers: int = 2
    timeout_s: float = CALL_TIMEOUT_S
    light_per_s: float = 40.0
    heavy_per_s: float = 8.0
    max_in_flight: int = 256
    skipped: int = 0
    _in_flight: int = 0

    def of(self, kind: str, after: float = 0.0, before: float = float("inf")) -> list[Served]:
        """The calls of `kind` that ended, started between `after` and `before`."""
        return [
            c
            for c in list(self.calls)
            if isinstance(c, Served) and c.kind == kind and after <= c.start < before
        ]

    def served(self, kind: str, tier: str = "", after: float = 0.0) -> list[Served]:
        """The OK calls of `kind` (answered by `tier`, when given) started after `after`."""
        return [c for c in self.of(kind, after) if c.code == "OK" and (not tier or c.tier == tier)]

    async def _caller(self, client: aioclient.InferenceServerClient, index: int) -> None:
        kind, rows, per_s = (
            ("light", LIGHT_ROWS, self.light_per_s)
            if index == 0
            else ("heavy", HEAVY_ROWS, self.heavy_per_s)
        )
        rng = np.random.default_rng(index)
        tasks: set[asyncio.Task[None]] = set()
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self._in_flight < self.max_in_flight:
                data = rng.standard_normal((rows, 4)).astype(np.float32)
                task = asyncio.create_task(self._call(client, kind, data))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                self.skipped += 1
            next_at += 1 / per_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await asyncio.gather(*tasks)

    async def _call(
        self, client: aioclient.InferenceServerClient, kind: str, data: np.ndarray
    ) -> None:
        inp = aioclient.InferInput("INPUT0", list(data.shape), "FP32")
        inp.set_data_from_numpy(data)
        self._in_flight += 1
        start = time.monotonic()
        tier = ""
        try:
            result = await client.infer(
                "mlp", [inp], timeout=int(self.timeout_s * 1e6), client_timeout=self.timeout_s + 5
            )
            code, tier = "OK", str(values_of(result.get_response().parameters)["tier"])
        except InferenceServerException as exc:
            code = str(exc.status()).removeprefix("StatusCode.")
        finally:
            self._in_flight -= 1
        self.calls.append(Served(start, time.monotonic(), code, kind, tier))


@dataclass
class Rehearsal:
    """The nodes, the cluster, and the services' processes by name."""

    net: Network
    cluster: LocalCluster
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def address(self, node: str, port: int) -> str:
        return f"{self.net.nodes[node].address}:{port}"

    def gateway(self, name: str) -> str:
        return self.address("front", GATEWAYS[name][0])

    def start(self, repo: Path) -> None:
        """Every service at once, each in its node binding the node's address; returns once
        each is healthy."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERMESH_")}
        env.update(
            FAST_RECOVERY,
            TIERMESH_REDIS_URL=self.cluster.url,
            TIERMESH_MODEL_REPOSITORY=str(repo),
            TIERMESH_LOG_FORMAT="json",
            TIERMESH_SHUTDOWN_GRACE_S="5",
            TIERMESH_METRICS_PORT="0",  # on the node's own loopback
            TIERMESH_HEARTBEAT_TTL_MS=str(int(HEARTBEAT_TTL_S * 1000)),
            TIERMESH_HEARTBEAT_INTERVAL_MS="500",
            TIERMESH_POSTPROCESS_ADDRESS=self.address("front", POSTPROCESS),
            TIERMESH_ROUTER_ADDRESS=self.address("front", ROUTER),
        )
        front = self.net.nodes["front"].address
        # Name, node, the port its health is asked on, its own settings (TIERMESH_ omitted).
        plan: list[tuple[str, str, int, dict[str, object]]] = [
            ("router", "front", ROUTER, {"ROUTER_HOST": front, "ROUTER_PORT": ROUTER}),
            (
                "postprocess",
                "front",
                POSTPROCESS,
                {"POSTPROCESS_HOST": front, "POSTPROCESS_PORT": POSTPROCESS},
            ),
            *(
                (
                    f"worker-{tier}",
                    tier,
                    WORKER_HEALTH,
                    {
                        "WORKER_TIER": tier,
                        "WORKER_HOST": self.net.nodes[tier].address,
                        "WORKER_HEALTH_PORT": WORKER_HEALTH,
                        "INTRA_OP_THREADS": 1,
                    },
                )
                for tier in ("edge", "center")
            ),
            *(
                (
                    f"gateway-{name}",
                    "front",
                    public,
                    {
                        "GATEWAY_HOST": front,
                        "GATEWAY_PORT": public,
                        "DELIVERY_HOST": front,
                        "DELIVERY_PORT": delivery,
                        "HTTP_PORT": -1,
                        # Beyond loopback without API keys: on the rehearsal's own bridge.
                        "INSECURE": "true",
                    },
                )
                for name, (public, delivery) in GATEWAYS.items()
            ),
        ]
        services = []
        for name, node, port, own in plan:
            self.procs[name] = self.net.run(
                node,
                [sys.executable, "-m", "tiermesh." + name.partition("-")[0]],
                {**env, **{f"TIERMESH_{k}": str(v) for k, v in own.items()}},
                self.logs / f"{name}.log",
            )
            services.append(Service(name, self.procs[name], self.address(node, port)))
        for svc in services:
            try:
                wait_healthy(svc, timeout_s=90)
            except StartupError as exc:
                log = self.log(svc.name)
                raise AssertionError(f"{svc.name} did not start ({exc}):\n{log}") from None

    def events(self, name: str, event: str) -> list[dict[str, object]]:
        """The JSON log lines of service `name` for `event`."""
        text = (self.logs / f"{name}.log").read_text()
        return [json.loads(line) for line in text.splitlines() if f'"{event}"' in line]

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop_gateway(self, name: str) -> dict[str, int]:
        """SIGTERM a gateway (it drains) and read what it counted from its stop line."""
        proc = self.procs[f"gateway-{name}"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, self.log(f"gateway-{name}")
        for line in (self.logs / f"gateway-{name}.log").read_text().splitlines():
            if '"gateway stopped"' in line and line.startswith("{"):
                doc = json.loads(line)
                return {k: int(doc[k]) for k in COUNTS}
        raise AssertionError(f"gateway {name} logged no stop line:\n{self.log(f'gateway-{name}')}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def cluster_layout() -> list[tuple[int, int]]:
    """The Redis nodes (by index into REDIS_NODES) as (primary, replica): front's primary P1
    with its replica on edge, edge's P2 with its replica on center, center's P3 with its
    replica on front; P3 takes the third of the slots that holds mlp's."""
    slot = key_slot(model_tag("mlp").encode())
    share = next(i for i in range(3) if slot_range(i, 3)[0] <= slot <= slot_range(i, 3)[1])
    layout = [(0, 3), (2, 5)]
    layout.insert(share, (4, 1))
    return layout


@pytest.fixture
def rehearsal(tmp_path: Path) -> Iterator[Rehearsal]:
    with network() as net:
        cluster = LocalCluster(
            tmp_path / "cluster",
            hosts=[net.nodes[n].address for n in REDIS_NODES],
            prefixes=[net.nodes[n].prefix for n in REDIS_NODES],
            layout=cluster_layout(),
            # Beyond loopback Redis takes no client without a password.
            password=secrets.token_hex(16),
        )
        (tmp_path / "logs").mkdir()
        started = Rehearsal(net, cluster, tmp_path / "logs")
        try:
            cluster.start()
            repo = copy_repository(tmp_path / "models")
            with (repo / "mlp" / "config.yaml").open("a") as config:
                config.write(MLP_TIERS)
            started.start(repo)
            yield started
        finally:
            started.stop()
            cluster.stop()


def served_by(url: str, rows: int) -> str:
    """The tier that answers one mlp call of `rows` rows ("" when it fails)."""
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("INPUT0", [rows, 4], "FP32")
    inp.set_data_from_numpy(np.ones((rows, 4), np.float32))
    try:
        result = client.infer("mlp", [inp], timeout=2_000_000, client_timeout=5)
    except InferenceServerException:
        return ""
    finally:
        client.close()
    return str(values_of(result.get_response().parameters)["tier"])


def test_edge_node_lost_then_a_redis_primary_failed_over(
    rehearsal: Rehearsal, capsys: pytest.CaptureFixture[str]
) -> None:
    net, cluster = rehearsal.net, rehearsal.cluster
    front, edge, center = (net.nodes[n].address for n in ("front", "edge", "center"))
    # A primary on every node, none with its replica on its own node, and mlp's primary on
    # center, its replica on front.
    pairs = cluster.pairs()
    assert len(pairs) == 3 and all(p.host != r.host for p, r in pairs), pairs
    assert {p.host for p, _ in pairs} == {front, edge, center}, pairs
    mlp_primary = cluster.primary_of(model_tag("mlp"))
    assert (mlp_primary.host, cluster.replica_of(mlp_primary).host) == (center, front)

    # 1. Light calls on edge, heavy ones on center, once both workers have registered.
    url = rehearsal.gateway("A")
    warm: list[str] = []  # the tier of each warm-up call through A ("" when it failed)

    def ask(rows: int) -> str:
        warm.append(served_by(url, rows))
        return warm[-1]

    eventually(lambda: ask(LIGHT_ROWS) == "edge", "a light call served by edge", 30)
    assert ask(HEAVY_ROWS) == "center"

    # 2. The edge node loses its power.
    with Traffic(url) as traffic:
        eventually(lambda: len(traffic.served("light")) >= 40, "40 light calls answered")
        eventually(lambda: len(traffic.served("heavy")) >= 8, "8 heavy calls answered")
        struck = time.monotonic()
        killed = net.kill_all("edge")
        moved = eventually(
            lambda: [c.end for c in traffic.served("light", "center") if c.end >= struck],
            "light calls answered by center",
            20,
        )
        moved_s = min(moved) - struck
        settled = struck + HEARTBEAT_TTL_S + 1
        eventually(
            lambda: len(traffic.served("light", "center", after=settled)) >= 40,
            "40 light calls answered by center after the move",
        )
        cluster.wait_ok()  # P2's replica took over: every slot served again
    edge_stops = rehearsal.stop_gateway("A")
    edge_lost = edge_stops["accepted"] - edge_stops["answered"]

    # 3. mlp's primary fails over under load.
    with Traffic(rehearsal.gateway("B")) as load:
        eventually(lambda: len(load.served("light")) >= 40, "40 light calls answered on B")
        hit = time.monotonic()
        dead, promoted = cluster.fail_over(model_tag("mlp"))
        promoted_s = time.monotonic() - hit
        after = hit + promoted_s
        recovered_s = load.wait_for(1, timeout_s=20, after=after) - hit
        eventually(
            lambda: len(load.served("light", after=after)) >= 40,
            "40 light calls answered after the promotion",
        )
    failover_stops = rehearsal.stop_gateway("B")
    failover_lost = failover_stops["accepted"] - failover_stops["answered"]

    # Light calls sent while the dead edge still counted as live: queued there, then moved.
    meanwhile = traffic.of("light", after=struck, before=settled)
    moves = rehearsal.events("router", "moved work stranded on a tier without live workers")
    with capsys.disabled():
        print(
            f"\nmulti-node rehearsal (front {front}, edge {edge}, center {center}): "
            f"edge node SIGKILLed ({len(killed)} processes): {describe(traffic, edge_stops)}, "
            f"light calls answered by center {moved_s:.2f} s after the kill (TTL "
            f"{HEARTBEAT_TTL_S:.0f} s); light calls started within TTL + 1 s of the kill "
            f"{len(meanwhile)}, the slowest {max(c.seconds for c in meanwhile):.2f} s; "
            f"stranded entries the router moved to center {sum(int(str(m['n'])) for m in moves)}"
            f"\nredis primary {dead.address} (mlp's) SIGKILLed: "
            f"{describe(load, failover_stops)}, replica {promoted.address} promoted after "
            f"{promoted_s:.2f} s, first answer after {recovered_s:.2f} s"
        )
    # Before the kill, light work on edge and heavy work on center.
    assert {c.tier for c in traffic.served("light") if c.end < struck} == {"edge"}
    assert {c.tier for c in traffic.served("heavy") if c.end < struck} == {"center"}
    # After it, light calls answered by center within the heartbeat TTL plus one second, and
    # every light call from then on answered by center, or refused RESOURCE_EXHAUSTED with a
    # Retry-After: the gateway's adaptive limit, shrunk by the seconds the calls queued on
    # the dead edge waited, grows back over a few hundred ms (README, "Status codes").
    assert moved_s <= HEARTBEAT_TTL_S + 1
    late_light = traffic.of("light", after=settled)
    assert {(c.code, c.tier) for c in late_light} <= {("OK", "center"), ("RESOURCE_EXHAUSTED", "")}
    assert len([c for c in late_light if c.code == "OK"]) >= 40
    # Every call ended within its deadline, answered or refused with a documented code ...
    for run in (traffic, load):
        assert set(run.codes()) <= {"OK", *REFUSALS}, run.codes()
        assert max(c.seconds for c in run.calls) < CALL_TIMEOUT_S + 1
    # ... and nothing either gateway had accepted was lost.
    assert edge_lost == 0, edge_stops
    assert failover_lost == 0, failover_stops
    assert edge_stops["answered"] == traffic.codes()["OK"] + sum(map(bool, warm))
    assert failover_stops["answered"] == load.codes()["OK"]


def describe(run: Traffic, stops: dict[str, int]) -> str:
    codes = run.codes()
    refused = ", ".join(f"{k} {v}" for k, v in sorted(codes.items()) if k != "OK") or "none"
    return (
        f"sent {len(run.calls)} (skipped {run.skipped}), OK {codes['OK']}, refused: {refused}, "
        f"accepted {stops['accepted']}, answered {stops['answered']}, "
        f"lost {stops['accepted'] - stops['answered']}, duplicates dropped {stops['late_results']}"
    )
