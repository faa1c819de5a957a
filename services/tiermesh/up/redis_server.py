"""A private redis-server for `tiermesh up`: loopback only, AOF on, data in a local folder;
with a password (`requirepass`) and a memory bound (`maxmemory`, `noeviction`: past it
writes are refused, never a queue's keys evicted) when given."""

from __future__ import annotations

import os
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


# Written by start_redis into the data folder, owner-only: the password stays off the
# command line (which every local user can read in /proc).
SECRET_CONFIG = "secret.conf"


def _secret_config(data_dir: Path, password: str, maxmemory: str) -> Path:
    lines = [f"maxmemory {maxmemory or '0'}", "maxmemory-policy noeviction"]
    if password:
        lines.append(f"requirepass {password}")
    path = data_dir / SECRET_CONFIG
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def start_redis(
    port: int,
    data_dir: Path,
    ready_timeout_s: float = 20.0,
    *,
    password: str = "",
    maxmemory: str = "0",
) -> subprocess.Popen[bytes]:
    """Start redis-server and return once it answers PING (raises on failure). With
    `password` every client must AUTH; `maxmemory` in redis units ("1gb"; "0": none)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotFound(INSTALL_HINT)
    data_dir.mkdir(parents=True, exist_ok=True)
    config = _secret_config(data_dir, password, maxmemory)
    proc = spawn(
        [
            binary,
            str(config.resolve()),
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
    client = redis.Redis(port=port, password=password or None, socket_connect_timeout=0.5)
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
