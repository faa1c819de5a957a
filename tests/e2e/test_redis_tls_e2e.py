"""A secured Redis (issue 26, acceptance 3): redis-server with a password and TLS only (no
plaintext port), its certificate from a CA of the test's own. Without the password, or with
a wrong one, `tiermesh up` and a service started alone refuse to start with one clear line;
with it, `rediss://` with the CA in `ssl_ca_certs`, the whole mesh serves over TLS: the Python
services through redis-py, the Go front door through redigo (which places jobs itself)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import running, service_metric
from tests.polling import eventually
from tiermesh.up.certs import DevCerts
from tiermesh.up.processes import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = secrets.token_hex(16)


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, certs: DevCerts) -> Iterator[int]:
    """redis-server on a TLS port only, with a password; its port."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed; run `make test`"
    port = free_port()
    data = tmp_path_factory.mktemp("tls-redis")
    proc = subprocess.Popen(
        [
            binary,
            "--port", "0",
            "--tls-port", str(port),
            "--bind", "127.0.0.1",
            "--tls-cert-file", str(certs.server_cert),
            "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", "no",
            "--requirepass", PASSWORD,
            "--dir", str(data),
            "--save", "",
            "--appendonly", "no",
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(
        port=port, password=PASSWORD, ssl=True, ssl_ca_certs=str(certs.ca), socket_timeout=1
    )

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    eventually(answers, "the TLS redis-server to answer", timeout_s=20)
    client.close()
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def url(port: int, certs: DevCerts, password: str | None = PASSWORD) -> str:
    auth = f":{password}@" if password is not None else ""
    return f"rediss://{auth}127.0.0.1:{port}/0?ssl_ca_certs={certs.ca}"


@pytest.mark.parametrize("password", [None, "wrong"])
def test_without_the_password_nothing_starts(
    tls_redis: int, certs: DevCerts, tmp_path: Path, password: str | None
) -> None:
    env = {**os.environ, "TIERMESH_REDIS_URL": url(tls_redis, certs, password)}
    up = subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", "up", "--port", str(free_port()),
         "--http-port", "-1", "--metrics-port", "0", "--data-dir", str(tmp_path / "d")],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert up.returncode == 1, up.stderr
    (line,) = up.stderr.strip().splitlines()
    assert "refused the credentials of TIERMESH_REDIS_URL" in line
    assert f"rediss://127.0.0.1:{tls_redis}" in line and PASSWORD not in line
    # A service started alone (as on Kubernetes) says it in one line too, and exits.
    router = subprocess.run(
        [sys.executable, "-m", "tiermesh.router"],
        env={**env, "TIERMESH_ROUTER_PORT": str(free_port()), "TIERMESH_METRICS_PORT": "0"},
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert router.returncode == 1, router.stderr[-2000:]
    last = router.stderr.strip().splitlines()[-1]
    assert last.startswith("tiermesh router: cannot start: Redis at rediss://127.0.0.1:")
    assert "refused this service's credentials" in last
    assert "Traceback" not in router.stderr


def test_the_mesh_serves_over_tls_with_the_password(
    tls_redis: int, certs: DevCerts, tmp_path: Path, fetched_models: tuple[str, ...]
) -> None:
    with running(
        tmp_path,
        extra_env={"TIERMESH_REDIS_URL": url(tls_redis, certs)},
        fetched=["minilm-l3"],
        span_files=False,
    ) as up:
        assert "Front door: go" in up.banner()
        client = grpcclient.InferenceServerClient(up.url)
        try:
            x = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
            x.set_data_from_numpy(np.array([[1, 2, 3, 4], [0, 0, 0, 1]], np.float32))
            for _ in range(5):
                assert client.infer("mlp", [x]).as_numpy("OUTPUT0").shape[0] == 2
            text = grpcclient.InferInput("text", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[b"over TLS"]], dtype=object))
            vector = client.infer("minilm-l3", [text]).as_numpy("sentence_embedding")
            assert abs(float(np.linalg.norm(vector)) - 1) < 1e-4
        finally:
            client.close()
        # The door queued jobs itself, over its own TLS connection to Redis.
        placed = service_metric(up, "frontdoor", "tiermesh_front_door_placed_total", by="door")
        assert placed >= 5
    # What the mesh left in that Redis: its streams, read over TLS with the password.
    check = redis.Redis(port=tls_redis, password=PASSWORD, ssl=True, ssl_ca_certs=str(certs.ca))
    try:
        assert any(k.startswith(b"tm:") for k in check.scan_iter(count=1000))
    finally:
        check.close()
