"""TLS on real grpc.aio servers on port 0: who gets in and which status code the others
get; then the four services in this process with TLS on the public port and mutual TLS
between them, called through tritonclient with ssl=True."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc.aio as aioclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.integration.conftest import start_mesh
from tiermesh.core.server import add_health, bind, make_channel, make_server, set_serving
from tiermesh.core.settings import (
    RouterSettings,
    WorkerSettings,
)
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import (
    channel_credentials,
    internal_channel_credentials,
    internal_server_credentials,
    server_credentials,
)
from tiermesh.up.certs import DevCerts, write_dev_certs

pytestmark = pytest.mark.integration
TELEMETRY = Telemetry("tls-test")


@pytest.fixture(scope="module")
def strangers(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """Certificates of another CA: well formed, trusted by nobody here."""
    return write_dev_certs(tmp_path_factory.mktemp("strangers"))


async def serving(credentials: grpc.ServerCredentials) -> tuple[grpc.aio.Server, str]:
    server = make_server(TELEMETRY)
    health = add_health(server)
    port = bind(server, "127.0.0.1", 0, credentials)
    await server.start()
    await set_serving(health, True)
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def tls_server(certs: DevCerts) -> AsyncIterator[str]:
    """TLS only, no client certificate asked for."""
    server, address = await serving(server_credentials(certs.server_cert, certs.server_key))
    yield address
    await server.stop(None)


@pytest.fixture
async def mtls_server(certs: DevCerts) -> AsyncIterator[str]:
    """An internal server: clients need a certificate from the internal CA."""
    settings = RouterSettings(
        internal_tls_ca_file=certs.ca,
        internal_tls_cert_file=certs.internal_cert,
        internal_tls_key_file=certs.internal_key,
    )
    credentials = internal_server_credentials(settings)
    assert credentials is not None
    server, address = await serving(credentials)
    yield address
    await server.stop(None)


async def check(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """One health Check (failing fast, no wait_for_ready): OK or the code it failed with."""
    channel = make_channel(address, credentials=credentials)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


async def test_tls_client_is_served(tls_server: str, certs: DevCerts) -> None:
    assert await check(tls_server, channel_credentials(certs.ca)) == grpc.StatusCode.OK


async def test_localhost_name_matches_too(tls_server: str, certs: DevCerts) -> None:
    address = tls_server.replace("127.0.0.1", "localhost")
    assert await check(address, channel_credentials(certs.ca)) == grpc.StatusCode.OK


async def test_plaintext_client_is_refused(tls_server: str) -> None:
    assert await check(tls_server, None) == grpc.StatusCode.UNAVAILABLE


async def test_client_not_trusting_the_ca_is_refused(tls_server: str, strangers: DevCerts) -> None:
    assert await check(tls_server, channel_credentials(strangers.ca)) == (
        grpc.StatusCode.UNAVAILABLE
    )


async def test_mtls_client_with_certificate_is_served(mtls_server: str, certs: DevCerts) -> None:
    settings = WorkerSettings(
        internal_tls_ca_file=certs.ca,
        internal_tls_cert_file=certs.internal_cert,
        internal_tls_key_file=certs.internal_key,
    )
    assert await check(mtls_server, internal_channel_credentials(settings)) == grpc.StatusCode.OK


async def test_mtls_client_without_certificate_is_refused(
    mtls_server: str, certs: DevCerts
) -> None:
    assert await check(mtls_server, channel_credentials(certs.ca)) == grpc.StatusCode.UNAVAILABLE


async def test_mtls_client_with_a_stranger_certificate_is_refused(
    mtls_server: str, certs: DevCerts, strangers: DevCerts
) -> None:
    stranger = channel_credentials(certs.ca, strangers.internal_cert, strangers.internal_key)
    assert await check(mtls_server, stranger) == grpc.StatusCode.UNAVAILABLE


async def test_mtls_plaintext_client_is_refused(mtls_server: str) -> None:
    assert await check(mtls_server, None) == grpc.StatusCode.UNAVAILABLE


@pytest.fixture
async def tls_mesh(redis_url: str, model_repo: Path, certs: DevCerts) -> AsyncIterator[str]:
    """The four services with internal mTLS and a TLS public port; the gateway's address."""
    mesh = await start_mesh(
        redis_url,
        model_repo,
        common_overrides={
            "internal_tls_ca_file": certs.ca,
            "internal_tls_cert_file": certs.internal_cert,
            "internal_tls_key_file": certs.internal_key,
        },
        gateway_overrides={"tls_cert_file": certs.server_cert, "tls_key_file": certs.server_key},
    )
    try:
        yield mesh.gateway
    finally:
        await mesh.close()


async def test_mesh_with_tls_everywhere_answers(
    tls_mesh: str, certs: DevCerts, model_repo: Path
) -> None:
    """Router, postprocess and Delivery only accept mTLS here, so an answer means every
    internal hop presented the internal certificate."""
    client = aioclient.InferenceServerClient(tls_mesh, ssl=True, root_certificates=str(certs.ca))
    try:
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        inp = aioclient.InferInput("INPUT0", [2, 4], "FP32")
        inp.set_data_from_numpy(x)
        result = await asyncio.wait_for(client.infer("mlp", [inp]), 30)
        sess = ort.InferenceSession(
            str(model_repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
        )
        expected = sess.run(["OUTPUT0"], {"INPUT0": x})[0]
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-6)
    finally:
        await client.close()
    assert await check(tls_mesh, None) == grpc.StatusCode.UNAVAILABLE
