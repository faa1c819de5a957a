"""A real local Redis Cluster for the tests: redis-server processes with cluster mode on,
joined by `redis-cli --cluster create`, three primaries with a replica each by default; or
joined by hand as a `layout` says who replicates whom, each node started through a command
prefix of its own (`ip netns exec NS`: a node per network namespace, tests/netns.py)."""

from __future__ import annotations

import functools
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
from redis.cluster import key_slot

from tests.polling import eventually
from tiermesh.up.processes import free_port

# Short enough that a failover under test takes a few seconds, long enough that a busy
# 2-core machine does not fail over a primary that is merely slow.
NODE_TIMEOUT_MS = 2000
SLOTS = 16384


def slot_range(share: int, shares: int) -> tuple[int, int]:
    """The first and last slot of the `share`-th of `shares` primaries (a `layout`'s order)."""
    return SLOTS * share // shares, SLOTS * (share + 1) // shares - 1


@dataclass
class ClusterNodeProcess:
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    command: list[str]
    password: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(
            host=self.host, port=self.port, password=self.password or None, socket_timeout=5
        )


@dataclass
class LocalCluster:
    """`hosts` gives each node's address (one per node; all 127.0.0.1 by default), and
    `prefixes` each node's command prefix (empty: `start`'s prefix for every node). The
    test process must reach every address: it asks the nodes how the cluster is.

    `layout` joins the nodes by hand instead of `redis-cli --cluster create`: (primary,
    replica) node indexes, the slots split evenly over the primaries in that order
    (slot_range), so a test decides which node holds a key and which node its replica."""

    data: Path
    hosts: Sequence[str] = ("127.0.0.1",) * 6
    replicas: int = 1
    nodes: list[ClusterNodeProcess] = field(default_factory=list)
    prefixes: Sequence[Sequence[str]] = ()
    layout: Sequence[tuple[int, int]] = ()
    # Every node's password ("" = none). Redis refuses clients beyond loopback without one.
    password: str = ""

    @property
    def url(self) -> str:
        """The services' TIERMESH_REDIS_URL: every node a seed."""
        credentials = f":{self.password}@" if self.password else ""
        return f"redis+cluster://{credentials}" + ",".join(n.address for n in self.live())

    def start(self, prefix: Sequence[str] = ()) -> LocalCluster:
        """Start every node (each command run after its own prefix, else `prefix`, e.g.
        `ip netns exec NS`), join them and wait until every live node says the cluster is ok."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run `make test`, which installs it")
        for i, host in enumerate(self.hosts):
            port = free_port()
            folder = self.data / f"node{i}"
            folder.mkdir(parents=True, exist_ok=True)
            command = [
                *(self.prefixes[i] if self.prefixes else prefix),
                binary,
                "--port",
                str(port),
                "--bind",
                host,
                "--dir",
                str(folder),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                # A primary failing over stops only its own slots, not the whole cluster
                # (README, "Redis": what the mesh asks of a cluster).
                "--cluster-require-full-coverage",
                "no",
                "--appendonly",
                "yes",
                # A replica's first sync starts at once (Redis waits 5 s for more replicas).
                "--repl-diskless-sync-delay",
                "0",
                "--save",
                "",
                "--loglevel",
                "warning",
                *(
                    ("--requirepass", self.password, "--masterauth", self.password)
                    if self.password
                    else ()
                ),
            ]
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
            self.nodes.append(ClusterNodeProcess(host, port, proc, command, self.password))
        for node in self.nodes:
            self._wait(node.client().ping, f"node {node.address} to answer")
        if self.layout:
            self._join()
            return self
        subprocess.run(
            [
                *prefix,
                "redis-cli",
                "--cluster",
                "create",
                *(n.address for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
                *(("-a", self.password, "--no-auth-warning") if self.password else ()),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()
        return self

    def _join(self) -> None:
        """Join the nodes as `layout` says: each a config epoch of its own (as `redis-cli
        --cluster create` gives them), all met, the slots split over the primaries, each
        replica following its primary once it has heard of it; then wait_ok."""
        clients = [n.client() for n in self.nodes]
        for epoch, client in enumerate(clients, start=1):
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", epoch)
        for node in self.nodes[1:]:
            clients[0].execute_command("CLUSTER MEET", node.host, node.port)
        primaries = [p for p, _ in self.layout]
        for share, primary in enumerate(primaries):
            first, last = slot_range(share, len(primaries))
            clients[primary].execute_command("CLUSTER ADDSLOTSRANGE", first, last)
        for primary, replica in self.layout:
            primary_id = clients[primary].execute_command("CLUSTER MYID")
            self._wait(
                functools.partial(
                    clients[replica].execute_command, "CLUSTER REPLICATE", primary_id
                ),
                f"{self.nodes[replica].address} to follow {self.nodes[primary].address}",
            )
        for client in clients:
            client.close()
        self.wait_ok()

    def wait_ok(self, timeout_s: float = 30) -> None:
        """Until every live node reports cluster_state:ok and knows a primary per slot, and
        every replica is in sync with its primary (only then can it take over)."""

        def ok() -> bool:
            for node in self.live():
                info = node.client().cluster("info")
                if info.get("cluster_state") != "ok" or int(info["cluster_slots_ok"]) != 16384:
                    return False
                replication = node.client().info("replication")
                if replication.get("role") == "slave" and (
                    replication.get("master_link_status") != "up"
                    or replication.get("master_sync_in_progress")
                ):
                    return False
            return True

        self._wait(ok, "the cluster to be ok", timeout_s)

    def live(self) -> list[ClusterNodeProcess]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def primary_of(self, key: str) -> ClusterNodeProcess:
        """The live node that is primary of `key`'s slot now."""
        slot = key_slot(key.encode())
        for node in self.live():
            for start, end, primary, *_ in node.client().execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    host = primary[0].decode() if isinstance(primary[0], bytes) else primary[0]
                    address = (host, int(primary[1]))
                    return next(n for n in self.nodes if (n.host, n.port) == address)
        raise LookupError(f"no primary serves slot {slot}")

    def replica_of(self, primary: ClusterNodeProcess) -> ClusterNodeProcess:
        """A live replica of `primary`."""
        for found, replica in self.pairs():
            if found is primary:
                return replica
        raise LookupError(f"{primary.address} has no replica")

    def pairs(self) -> list[tuple[ClusterNodeProcess, ClusterNodeProcess]]:
        """(primary, replica) for every live replica, as the replicas say now."""
        out = []
        for node in self.live():
            info = node.client().info("replication")
            if info.get("role") != "slave":
                continue
            address = (str(info.get("master_host")), int(info.get("master_port", -1)))
            primary = next((n for n in self.nodes if (n.host, n.port) == address), None)
            if primary is not None:
                out.append((primary, node))
        return out

    def flush(self) -> None:
        """Empty every primary (replicas follow)."""
        for node in self.live():
            if node.client().info("replication").get("role") == "master":
                node.client().flushall()

    def kill(self, node: ClusterNodeProcess) -> None:
        """SIGKILL: the node is gone at once, nothing flushed."""
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=10)

    def fail_over(self, key: str) -> tuple[ClusterNodeProcess, ClusterNodeProcess]:
        """SIGKILL the primary of `key`'s slot and wait until its replica serves the slot:
        (the killed node, the promoted one)."""
        primary = self.primary_of(key)
        replica = self.replica_of(primary)
        self.kill(primary)
        self._wait(lambda: self.primary_of(key) is replica, f"{replica.address} promoted", 30)
        self.wait_ok()
        return primary, replica

    def restart(self, node: ClusterNodeProcess) -> None:
        """Start a killed node again (its config and AOF kept): it rejoins as a replica of
        whichever node took over its slots."""
        node.proc = subprocess.Popen(node.command, stdout=subprocess.DEVNULL)

        def replica_again() -> bool:
            info = node.client().info("replication")
            return info.get("role") == "slave" and info.get("master_link_status") == "up"

        self._wait(replica_again, f"{node.address} back as a replica", 30)
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.proc.kill()

    @staticmethod
    def _wait(check: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
        def answered() -> bool:
            try:
                return bool(check())
            except (redis.RedisError, OSError):
                return False

        eventually(answered, what, timeout_s)
