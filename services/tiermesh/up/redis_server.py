"""A private redis-server for `tiermesh up`: loopback only, AOF on, data in a local folder."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from tiermesh.up.processes import environ_with, spawn

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: "
    "`sudo apt-get install redis-server`; macOS: `brew install redis`), or point "
    "TIERMESH_REDIS_URL at a running Redis 7+."
)


class RedisNotFound(RuntimeError):
    pass


def start_redis(
    port: int, data_dir: Path, ready_timeout_s: float = 20.0
) -> subprocess.Popen[bytes]:
    """Start redis-server and return once it answers PING (raises on failure)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotFound(INSTALL_HINT)
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = spawn(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "yes",
            "--dir",
            str(data_dir.resolve()),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ],
        environ_with(),
    )
    client = redis.Redis(port=port, socket_connect_timeout=0.5)
    deadline = time.monotonic() + ready_timeout_s
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {proc.returncode}")
            try:
                if client.ping():
                    return proc
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                pass
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"redis-server did not answer within {ready_timeout_s}s")
            # A refused connect returns at once; wait for the process briefly instead.
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
    finally:
        client.close()
