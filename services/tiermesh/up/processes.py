"""Child processes that die with their parent and ignore the terminal's Ctrl-C, so that
the supervisor alone decides the order in which they stop, and that share its session, so
that their CPU priorities rank against each other."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
STDERR_FD = 2
SUPERVISED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}


def _child_setup() -> None:  # runs in the child between fork and exec
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SUPERVISED_SIGNALS)
    # A background process group of the terminal's session: with `stty tostop` a write to
    # the terminal would stop it; ignored (kept across exec), the write goes through.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a child in a process group of its own (the terminal's Ctrl-C goes to ours
    alone), killed if we die. It stays in our session: Linux's autogroup scheduling gives
    each session one equal share of the CPU, so a session per child made every service an
    equal peer whatever its nice, and the nice values the mesh sets (the worker's compute
    lanes, a batch pool's 19) ranked threads only within their own process. Its stdout goes
    to our stderr (where the services log anyway), so the supervisor's own stdout carries
    only what it prints itself (redis-server's banner never mixes in)."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        process_group=0,
        preexec_fn=_child_setup,
        stdin=subprocess.DEVNULL,
        stdout=STDERR_FD,
    )


# Where free_port looks: below the kernel's ephemeral range. A port from bind(0) comes from
# that range, and between its release and the service binding it (seconds, while the
# services before it start) any outgoing connection on the machine may be given it as its
# source port; ports below the range are only ever taken by an explicit bind.
PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
FALLBACK_EPHEMERAL_LOW = 32_768
_ports = random.Random()
# Every port handed out by this process: a mesh takes a dozen before any is bound, and two
# equal random picks (a few in a thousand meshes) would make one service fail to start.
_handed_out: set[int] = set()


def reserve(port: int) -> None:
    """A port chosen elsewhere (the mesh's public port): never handed out here."""
    _handed_out.add(port)


def _ephemeral_low() -> int:
    try:
        return int(PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return FALLBACK_EPHEMERAL_LOW


def free_port(host: str = "127.0.0.1") -> int:
    """A port free a moment ago, outside the ephemeral range when there is room below it
    (else any port the kernel picks), never one this process handed out before. Random, so
    concurrent callers rarely meet."""
    high = _ephemeral_low() - 1
    if high - LOWEST_PORT >= 1000:
        for _ in range(50):
            port = _ports.randint(LOWEST_PORT, high)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM, wait up to grace_s, then SIGKILL. Returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def python_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def environ_with(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(overrides)
    return env
