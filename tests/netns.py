"""Nodes of a multi-node rehearsal on one machine: Linux network namespaces of the test's
own, one per node, joined by veth pairs to a bridge that lives in a namespace of its own
(so no bridge or firewall rule of the machine is touched), with private addresses from a
test-only block, 10.213.X.0/24 with X from the test's pid. The test process reaches every
node through one more veth pair, its end in the root namespace holding 10.213.X.254: its
clients (gRPC, Redis) talk to the nodes' addresses as a client on another host would.

Everything made here is named after the test's pid and removed on the way out, whether
the test passed or not. Where `ip netns add` is not permitted the test is skipped."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.polling import eventually

# Addresses of the test's own namespaces only: 10.213.X.0/24.
BLOCK = "10.213"
# The test process's address on the bridge (the last octet).
HOST_OCTET = 254
BRIDGE = "br0"
_made = itertools.count()


@dataclass(frozen=True)
class Node:
    name: str  # "front", "edge", "center"
    netns: str  # the namespace's name, e.g. "tm4242a-edge"
    address: str  # its address on the bridge, e.g. "10.213.67.2"

    @property
    def prefix(self) -> list[str]:
        """What runs a command inside the node: `ip netns exec NS`."""
        return ["ip", "netns", "exec", self.netns]


@dataclass
class Network:
    nodes: dict[str, Node]
    host_address: str  # the test process's own address, in the root namespace
    hub: str  # the bridge's namespace
    link: str  # the root namespace's end of the veth pair to the bridge
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(
        self,
        node: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `argv` inside `node` (`ip netns exec` execs it: the pid is the command's),
        its output (both streams) appended to `log` when given."""
        out: IO[bytes] | int = subprocess.DEVNULL if log is None else log.open("ab")
        try:
            proc = subprocess.Popen(
                [*self.nodes[node].prefix, *argv],
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child has its own copy
        self.procs.append(proc)
        return proc

    def pids(self, node: str) -> list[int]:
        """Every live process inside `node` (zombies, which hold no namespace, excluded)."""
        return _pids(self.nodes[node].netns)

    def kill_all(self, node: str, timeout_s: float = 10) -> list[int]:
        """SIGKILL every process inside `node`, as a machine losing its power would, and
        wait until none is left; returns the pids killed."""
        return _kill_all(self.nodes[node].netns, self.procs, timeout_s)


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _must(*args: str) -> None:
    done = _ip(*args)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _pids(netns: str) -> list[int]:
    done = _ip("netns", "pids", netns)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _kill_all(netns: str, procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    killed: set[int] = set()

    def gone() -> bool:
        for pid in _pids(netns):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        for proc in procs:  # reap our own children: the dead are not left as zombies
            proc.poll()
        return not _pids(netns)

    eventually(gone, f"every process of {netns} to die", timeout_s)
    return sorted(killed)


def _free_block() -> int:
    """X of a 10.213.X.0/24 that no address of the root namespace is in, from the pid."""
    used = _ip("-o", "-4", "addr", "show").stdout
    start = os.getpid() % 250
    for i in range(250):
        x = (start + i) % 250 + 1
        if f" {BLOCK}.{x}." not in used:
            return x
    raise RuntimeError(f"no free /24 in {BLOCK}.0.0/16 for the test's namespaces")


def _check_permitted(netns: str) -> None:
    """Make the first namespace, or skip the test where that is not permitted here."""
    try:
        done = _ip("netns", "add", netns)
    except FileNotFoundError:
        pytest.skip("the `ip` command (iproute2) is not installed")
    if done.returncode != 0:
        reason = done.stderr.strip()
        if "not permitted" in reason or "Permission denied" in reason:
            pytest.skip(f"`ip netns add` is not permitted here: {reason}")
        raise RuntimeError(f"ip netns add {netns}: {reason}")


@contextmanager
def network(names: Sequence[str] = ("front", "edge", "center")) -> Iterator[Network]:
    """A namespace per node in `names` (loopback up, an address on the shared bridge) and
    the test process's own address on that bridge; every process still inside a namespace
    is SIGKILLed and everything made is deleted on the way out."""
    tag = f"tm{os.getpid()}{next(_made)}"
    # At most 15 characters: tm + pid (up to 7) + counter + h.
    net = Network({}, "", f"{tag}-hub", f"{tag}h")
    _check_permitted(net.hub)
    made = [net.hub]
    try:
        x = _free_block()
        _must("-n", net.hub, "link", "set", "lo", "up")
        _must("-n", net.hub, "link", "add", BRIDGE, "type", "bridge")
        _must("-n", net.hub, "link", "set", BRIDGE, "up")
        for octet, name in enumerate(names, start=1):
            node = Node(name, f"{tag}-{name}", f"{BLOCK}.{x}.{octet}")
            _must("netns", "add", node.netns)
            made.append(node.netns)
            _must("-n", node.netns, "link", "set", "lo", "up")
            # eth0 inside the node, its peer (named after the node) on the bridge.
            _must(
                *("link", "add", "eth0", "netns", node.netns, "type", "veth"),
                *("peer", "name", name, "netns", net.hub),
            )
            _must("-n", net.hub, "link", "set", name, "master", BRIDGE, "up")
            _must("-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _must("-n", node.netns, "link", "set", "eth0", "up")
            net.nodes[name] = node
        net.host_address = f"{BLOCK}.{x}.{HOST_OCTET}"
        _must("link", "add", net.link, "type", "veth", "peer", "name", "host", "netns", net.hub)
        _must("-n", net.hub, "link", "set", "host", "master", BRIDGE, "up")
        _must("addr", "add", f"{net.host_address}/24", "dev", net.link)
        _must("link", "set", net.link, "up")
        yield net
    finally:
        _remove(made, net.link, net.procs)


def _remove(made: Sequence[str], link: str, procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill what runs inside, then delete the root end of the link and every namespace
    (their veth pairs go with them). Best effort: a cleanup error never hides the test's."""
    errors: list[str] = []
    for netns in made:
        try:
            _kill_all(netns, procs, 10)
        except AssertionError as exc:
            errors.append(str(exc))
    _ip("link", "del", link)  # absent when making it failed: nothing to do then
    for netns in reversed(made):
        done = _ip("netns", "del", netns)
        if done.returncode != 0:
            errors.append(done.stderr.strip())
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    if errors:
        print(f"tests/netns.py: cleanup left {errors}")
