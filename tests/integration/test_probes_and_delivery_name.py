"""What Kubernetes needs from internal mTLS (deploy/README.md), on real grpc.aio servers:

- a Delivery client that dials a gateway at an address its certificate does not name (a
  pod IP) checks the certificate against TIERMESH_DELIVERY_TLS_SERVER_NAME instead, and
  only that name lets the handshake through;
- a service's health, plaintext on TIERMESH_HEALTH_PORT for probes that present no
  certificate, answers what the service's own (mTLS) port answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiermesh.core.delivery_client import GatewayClients
from tiermesh.core.server import add_health, bind, make_server, serve_health, set_serving
from tiermesh.core.settings import GatewaySettings, PostprocessSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import caller_checks, channel_credentials, internal_server_credentials
from tiermesh.postprocess.__main__ import serve as serve_postprocess
from tiermesh.up.certs import DevCerts, write_dev_certs
from tiermesh.v1 import delivery_pb2, delivery_pb2_grpc

pytestmark = pytest.mark.integration
SHARED_NAME = "gateway.tiermesh.svc"
# A loopback address the certificates do not name (they name 127.0.0.1, ::1, localhost,
# and SHARED_NAME): a pod IP, as a worker dials a gateway in Kubernetes.
POD_IP = "127.0.0.2"
FAILED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class Delivery(delivery_pb2_grpc.DeliveryServicer):
    def __init__(self) -> None:
        self.messages = 0

    async def DeliverStream(
        self, request_iterator: AsyncIterator[delivery_pb2.Deliveries], context: Any
    ) -> AsyncIterator[delivery_pb2.DeliverReply]:
        async for message in request_iterator:
            self.messages += 1
            yield delivery_pb2.DeliverReply(batch_id=message.batch_id)  # the reply it awaits


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("certs"), extra_names=[SHARED_NAME])


async def test_delivery_checks_a_gateway_by_the_name_its_certificates_share(
    named: DevCerts,
) -> None:
    cert, key = named.own("gateway")
    settings = GatewaySettings(
        internal_tls_ca_file=named.ca, internal_tls_cert_file=cert, internal_tls_key_file=key
    )
    server = make_server(Telemetry("delivery-name-test"), guards=caller_checks(settings))
    servicer = Delivery()
    delivery_pb2_grpc.add_DeliveryServicer_to_server(servicer, server)
    port = bind(server, POD_IP, 0, internal_server_credentials(settings))
    await server.start()
    worker = channel_credentials(named.ca, *named.own("worker"))
    address = f"{POD_IP}:{port}"
    try:
        for server_name, delivered in [(SHARED_NAME, True), ("", False), ("other.svc", False)]:
            # A failed handshake leaves the stream without a reply until its timeout.
            clients = GatewayClients(5 if delivered else 0.5, worker, server_name=server_name)
            before = servicer.messages
            try:
                if delivered:
                    await clients.deliver(address, [])
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await clients.deliver(address, [])
                    assert err.value.code() in FAILED, (server_name, err.value)
            finally:
                await clients.close()
            assert servicer.messages == before + delivered, server_name
    finally:
        await server.stop(None)


async def _check(address: str) -> Any:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return reply.status


async def test_the_probe_port_answers_the_service_health_plaintext() -> None:
    server = make_server(Telemetry("probe-test"))
    health = add_health(server)
    probe = await serve_health(health, "127.0.0.1", 0)
    assert probe is not None
    try:
        address = f"127.0.0.1:{probe[1]}"
        # Not serving until the service says so (grpc's own servicer starts SERVING: a
        # probe would pass while a worker still loads its models).
        assert await _check(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        await set_serving(health, True)
        assert await _check(address) == health_pb2.HealthCheckResponse.SERVING
        await set_serving(health, False)  # draining
        assert await _check(address) == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await probe[0].stop(None)
    assert await serve_health(health, "127.0.0.1", -1) is None  # the default: none


async def test_a_service_with_internal_mtls_answers_probes_on_its_health_port(
    certs: DevCerts, redis_url: str, tmp_path: Path
) -> None:
    cert, key = certs.own("postprocess")
    settings = PostprocessSettings(
        redis_url=redis_url,
        model_repository=tmp_path,
        postprocess_port=0,
        metrics_port=0,
        health_port=0,
        internal_tls_ca_file=certs.ca,
        internal_tls_cert_file=cert,
        internal_tls_key_file=key,
    )
    ready: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve_postprocess(settings, stop, Telemetry("postprocess"), ready.set_result)
    )
    try:
        ports = await asyncio.wait_for(ready, 30)
        probe = f"127.0.0.1:{ports['probe_port']}"
        assert await _check(probe) == health_pb2.HealthCheckResponse.SERVING
        # Its own port wants a certificate: a plaintext probe there gets nothing.
        with pytest.raises(grpc.aio.AioRpcError):
            await _check(f"127.0.0.1:{ports['port']}")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
