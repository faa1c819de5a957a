"""`tiermesh probe` / `python -m tiermesh.cli.probe`, the image's healthcheck, against a real
grpc.aio health server on port 0: exit 0 only while SERVING, 1 for NOT_SERVING or when
nothing (or nothing it trusts) answers, 2 for a usage error; plaintext and mutual TLS."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tiermesh.cli.args import USAGE
from tiermesh.cli.main import main as tiermesh_main
from tiermesh.cli.probe import INTERNAL_TLS_ENV, NOT_SERVING, SERVING, UNREACHABLE
from tiermesh.up.certs import DevCerts

SERVING_STATUS = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING_STATUS = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class HealthServer:
    address: str
    health: health_aio.HealthServicer


async def _start(credentials: grpc.ServerCredentials | None) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    return server, (
        server.add_secure_port("127.0.0.1:0", credentials)
        if credentials is not None
        else server.add_insecure_port("127.0.0.1:0")
    )


@pytest.fixture
async def plain() -> AsyncIterator[HealthServer]:
    server, port = await _start(None)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await server.start()
    try:
        yield HealthServer(f"127.0.0.1:{port}", health)
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def mutual(certs: DevCerts) -> AsyncIterator[HealthServer]:
    credentials = grpc.ssl_server_credentials(
        [(certs.internal_key.read_bytes(), certs.internal_cert.read_bytes())],
        root_certificates=certs.ca.read_bytes(),
        require_client_auth=True,
    )
    server, port = await _start(credentials)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await server.start()
    try:
        yield HealthServer(f"127.0.0.1:{port}", health)
    finally:
        await server.stop(grace=None)


def _probe(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The probe as the image's HEALTHCHECK runs it: a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.probe", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


async def probe(*argv: str, env: dict[str, str] | None = None) -> int:
    # Off the event loop: the server under test runs on it.
    return (await asyncio.to_thread(_probe, *argv, env=env)).returncode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_exit_code_follows_the_serving_status(plain: HealthServer) -> None:
    await plain.health.set("", SERVING_STATUS)
    assert await probe(plain.address) == SERVING
    await plain.health.set("", NOT_SERVING_STATUS)
    assert await probe(plain.address) == NOT_SERVING
    await plain.health.set("", SERVING_STATUS)
    assert await probe(plain.address, "--service", "no.such.Service") == UNREACHABLE


async def test_address_defaults_to_the_variable_the_image_sets(plain: HealthServer) -> None:
    await plain.health.set("", SERVING_STATUS)
    assert await probe("--quiet", env={"TIERMESH_PROBE_ADDRESS": plain.address}) == SERVING


async def test_nothing_listening_is_unreachable_within_the_timeout() -> None:
    result = await asyncio.to_thread(_probe, f"127.0.0.1:{_free_port()}", "--timeout-s", "1")
    assert result.returncode == UNREACHABLE
    assert "UNAVAILABLE" in result.stderr or "DEADLINE_EXCEEDED" in result.stderr


async def test_the_tiermesh_command_probes_too(plain: HealthServer) -> None:
    await plain.health.set("", SERVING_STATUS)
    assert await asyncio.to_thread(tiermesh_main, ["probe", plain.address, "--quiet"]) == 0
    await plain.health.set("", NOT_SERVING_STATUS)
    assert await asyncio.to_thread(tiermesh_main, ["probe", plain.address, "--quiet"]) == 1


async def test_mutual_tls_with_the_services_own_files(
    mutual: HealthServer, certs: DevCerts
) -> None:
    await mutual.health.set("", SERVING_STATUS)
    files = (certs.ca, certs.internal_cert, certs.internal_key)
    env = dict(zip(INTERNAL_TLS_ENV, map(str, files), strict=True))
    assert await probe(mutual.address, "--internal-tls", env=env) == SERVING
    assert (
        await probe(
            mutual.address,
            "--tls-ca",
            str(certs.ca),
            "--tls-client-cert",
            str(certs.client_cert),
            "--tls-client-key",
            str(certs.client_key),
            "--tls-server-name",
            "localhost",
        )
        == SERVING
    )
    # Plaintext, or TLS without a client certificate, gets no answer it can trust.
    assert await probe(mutual.address, "--timeout-s", "2") == UNREACHABLE
    assert await probe(mutual.address, "--tls-ca", str(certs.ca), "--timeout-s", "2") == UNREACHABLE
    # --internal-tls without the variables is a usage error, not a hang.
    cleared = {name: "" for name in INTERNAL_TLS_ENV}
    assert await probe(mutual.address, "--internal-tls", env=cleared) == USAGE
