"""`tiermesh up`'s private redis-server (up/redis_server.py), a real one on a free port: a
password every client needs, kept off the command line, and a memory bound past which
writes are refused (noeviction) while every key already written stays."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tiermesh.up.processes import free_port, stop
from tiermesh.up.redis_server import SECRET_CONFIG, start_redis
from tiermesh.up.supervisor import masked

pytestmark = pytest.mark.integration
PASSWORD = "e2f1c0ffee" * 4


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    port = free_port()
    proc = start_redis(port, tmp_path / "redis", password=PASSWORD, maxmemory="4mb")
    try:
        yield port, proc, tmp_path / "redis"
    finally:
        stop(proc, 10)


def test_every_client_needs_the_password(
    private: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    port, _, _ = private
    with redis.Redis(port=port) as anonymous:
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
    with redis.Redis.from_url(f"redis://:{PASSWORD}@127.0.0.1:{port}/0") as client:
        assert client.ping()


def test_the_password_is_in_an_owner_only_file_not_on_the_command_line(
    private: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    _, proc, folder = private
    assert PASSWORD.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    config = folder / SECRET_CONFIG
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert f"requirepass {PASSWORD}" in config.read_text()


def test_past_maxmemory_writes_are_refused_and_nothing_is_evicted(
    private: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    port, _, _ = private
    with redis.Redis(port=port, password=PASSWORD) as client:
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("maxmemory") == {"maxmemory": str(4 * 1024 * 1024)}
        written = 0
        value = b"x" * 64 * 1024
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            while written < 1000:  # 64 MiB: far past the bound
                client.xadd("tm:q:test", {"job": value})
                written += 1
        assert 0 < written < 1000
        assert client.xlen("tm:q:test") == written  # every entry written before is there
        assert client.get("nothing") is None  # reads still answer


def test_a_password_is_never_printed_whole() -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:6379/0"
    assert masked(url) == "redis://:***@127.0.0.1:6379/0"
    assert masked("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert masked(f"redis://tm:{PASSWORD}@h:1/2") == "redis://tm:***@h:1/2"
