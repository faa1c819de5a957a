"""Child processes that die with their parent and ignore the terminal's Ctrl-C, so that
the supervisor alone decides the order in which they stop."""

from __future__ import annotations

import ctypes
import os
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
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a child in its own session (no terminal SIGINT), killed if we die. Its stdout
    goes to our stderr (where the services log anyway), so the supervisor's own stdout
    carries only what it prints itself (redis-server's banner never mixes in)."""
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_child_setup,
        stdin=subprocess.DEVNULL,
        stdout=STDERR_FD,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to 0 and release it)."""
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
