"""A real local Redis Cluster for the tests: redis-server processes with cluster mode on,
joined by `redis-cli --cluster create`, three primaries with a replica each by default."""

from __future__ import annotations

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


@dataclass
class ClusterNodeProcess:
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    command: list[str]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=5)


@dataclass
class LocalCluster:
    """`hosts` gives each node's address (one per node; all 127.0.0.1 by default)."""

    data: Path
    hosts: Sequence[str] = ("127.0.0.1",) * 6
    replicas: int = 1
    nodes: list[ClusterNodeProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The services' TIERMESH_REDIS_URL: every node a seed."""
        return "redis+cluster://" + ",".join(n.address for n in self.nodes if n.proc.poll() is None)

    def start(self, prefix: Sequence[str] = ()) -> LocalCluster:
        """Start every node (each command run after `prefix`, e.g. `ip netns exec NS`), join
        them and wait until every live node says the cluster is ok."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; run `make test`, which installs it")
        for i, host in enumerate(self.hosts):
            port = free_port()
            folder = self.data / f"node{i}"
            folder.mkdir(parents=True, exist_ok=True)
            command = [
                *prefix,
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
                "--appendonly",
                "yes",
                # A replica's first sync starts at once (Redis waits 5 s for more replicas).
                "--repl-diskless-sync-delay",
                "0",
                "--save",
                "",
                "--loglevel",
                "warning",
            ]
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
            self.nodes.append(ClusterNodeProcess(host, port, proc, command))
        for node in self.nodes:
            self._wait(node.client().ping, f"node {node.address} to answer")
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
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()
        return self

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
        for node in self.live():
            info = node.client().info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", -1)) == primary.port:
                return node
        raise LookupError(f"{primary.address} has no replica")

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
