"""Who may call the internal services (core/callers.py), on a real grpc.aio server on port 0
with mutual TLS and certificates made here: each internal method answers a caller whose
certificate names an identity allowed to make it, and refuses every other identity of the
same CA with PERMISSION_DENIED before its servicer runs; no certificate, or one of another
CA, never gets past the handshake; a plaintext port with the check refuses
UNAUTHENTICATED. The handlers here are of every kind grpc.aio runs (unary, async generator,
reader/writer coroutine), since the check wraps each kind differently."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.stream_refusals import server_status
from tiermesh.core.callers import CALLERS, IDENTITIES
from tiermesh.core.server import add_health, bind, make_channel, make_server, set_serving
from tiermesh.core.settings import RouterSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import caller_checks, channel_credentials, internal_server_credentials
from tiermesh.up.certs import DevCerts, write_dev_certs
from tiermesh.v1 import (
    books_pb2,
    books_pb2_grpc,
    delivery_pb2,
    delivery_pb2_grpc,
    postprocess_pb2,
    postprocess_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

pytestmark = pytest.mark.integration
TELEMETRY = Telemetry("callers-test")


class Reached:
    """Which servicer methods ran: a refused call must not reach its servicer."""

    def __init__(self) -> None:
        self.methods: list[str] = []


class Router(router_pb2_grpc.RouterServicer):
    def __init__(self, reached: Reached) -> None:
        self.reached = reached

    async def RouteStream(  # an async generator
        self, request_iterator: AsyncIterator[router_pb2.JobBatch], context: Any
    ) -> AsyncIterator[router_pb2.RouteReplies]:
        self.reached.methods.append("RouteStream")
        async for _ in request_iterator:
            yield router_pb2.RouteReplies()


class Postprocess(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(self, reached: Reached) -> None:
        self.reached = reached

    async def Process(self, request: Any, context: Any) -> postprocess_pb2.ProcessReply:
        self.reached.methods.append("Process")
        return postprocess_pb2.ProcessReply()

    async def ProcessStream(  # a reader/writer coroutine
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> None:
        self.reached.methods.append("ProcessStream")
        async for _ in request_iterator:
            await context.write(postprocess_pb2.ProcessReply())


class Delivery(delivery_pb2_grpc.DeliveryServicer):
    def __init__(self, reached: Reached) -> None:
        self.reached = reached

    async def Deliver(self, request: Any, context: Any) -> delivery_pb2.DeliverReply:
        self.reached.methods.append("Deliver")
        return delivery_pb2.DeliverReply()

    async def DeliverStream(
        self, request_iterator: AsyncIterator[delivery_pb2.Deliveries], context: Any
    ) -> AsyncIterator[delivery_pb2.DeliverReply]:
        self.reached.methods.append("DeliverStream")
        async for _ in request_iterator:
            yield delivery_pb2.DeliverReply()


class Books(books_pb2_grpc.BooksServicer):
    def __init__(self, reached: Reached) -> None:
        self.reached = reached

    async def Record(self, request: Any, context: Any) -> books_pb2.Recorded:
        self.reached.methods.append("Record")
        return books_pb2.Recorded()


async def one_message(make: Callable[[], Any], message: Any) -> None:
    """A stream call: one message out, its reply read, the stream closed; raises with the
    server's status (tests/stream_refusals.py)."""

    async def once() -> None:
        call = make()
        await call.write(message)
        await call.read()
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK

    await server_status(once)


# Each internal method, called once: (gRPC service, method, how to call it on a channel).
Call = Callable[[grpc.aio.Channel], Awaitable[Any]]
CALLS: list[tuple[str, str, Call]] = [
    (
        "tiermesh.v1.Router",
        "RouteStream",
        lambda ch: one_message(
            lambda: router_pb2_grpc.RouterStub(ch).RouteStream(timeout=10), router_pb2.JobBatch()
        ),
    ),
    (
        "tiermesh.v1.Postprocess",
        "Process",
        lambda ch: postprocess_pb2_grpc.PostprocessStub(ch).Process(
            postprocess_pb2.ResultBatch(), timeout=10
        ),
    ),
    (
        "tiermesh.v1.Postprocess",
        "ProcessStream",
        lambda ch: one_message(
            lambda: postprocess_pb2_grpc.PostprocessStub(ch).ProcessStream(timeout=10),
            postprocess_pb2.ResultBatch(),
        ),
    ),
    (
        "tiermesh.v1.Delivery",
        "Deliver",
        lambda ch: delivery_pb2_grpc.DeliveryStub(ch).Deliver(
            delivery_pb2.Deliveries(), timeout=10
        ),
    ),
    (
        "tiermesh.v1.Delivery",
        "DeliverStream",
        lambda ch: one_message(
            lambda: delivery_pb2_grpc.DeliveryStub(ch).DeliverStream(timeout=10),
            delivery_pb2.Deliveries(),
        ),
    ),
    (
        "tiermesh.v1.Books",
        "Record",
        lambda ch: books_pb2_grpc.BooksStub(ch).Record(books_pb2.Entries(), timeout=10),
    ),
]


async def outcome(address: str, credentials: grpc.ChannelCredentials | None, call: Call) -> Any:
    """OK, or the code the call failed with."""
    channel = make_channel(address, credentials=credentials)
    try:
        await call(channel)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


async def health(address: str, credentials: grpc.ChannelCredentials | None) -> Any:
    return await outcome(
        address,
        credentials,
        lambda ch: health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest()),
    )


async def internal_server(settings: RouterSettings, reached: Reached) -> tuple[Any, str]:
    """An internal server as the services build one: the caller check from the settings,
    mutual TLS (or plaintext) from the same settings, every internal service on it."""
    server = make_server(TELEMETRY, guards=caller_checks(settings))
    router_pb2_grpc.add_RouterServicer_to_server(Router(reached), server)
    postprocess_pb2_grpc.add_PostprocessServicer_to_server(Postprocess(reached), server)
    delivery_pb2_grpc.add_DeliveryServicer_to_server(Delivery(reached), server)
    books_pb2_grpc.add_BooksServicer_to_server(Books(reached), server)
    health_servicer = add_health(server)
    port = bind(server, "127.0.0.1", 0, internal_server_credentials(settings))
    await server.start()
    await set_serving(health_servicer, True)
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def mtls(certs: DevCerts) -> AsyncIterator[tuple[str, Reached]]:
    router_cert, router_key = certs.own("router")
    settings = RouterSettings(
        internal_tls_ca_file=certs.ca,
        internal_tls_cert_file=router_cert,
        internal_tls_key_file=router_key,
    )
    reached = Reached()
    server, address = await internal_server(settings, reached)
    yield address, reached
    await server.stop(None)


def presenting(certs: DevCerts, identity: str) -> grpc.ChannelCredentials:
    return channel_credentials(certs.ca, *certs.own(identity))


@pytest.mark.parametrize(("service", "method", "call"), CALLS, ids=[c[1] for c in CALLS])
async def test_only_the_identities_allowed_get_through(
    mtls: tuple[str, Reached], certs: DevCerts, service: str, method: str, call: Call
) -> None:
    address, reached = mtls
    allowed = CALLERS[service]
    assert allowed, service
    for identity in IDENTITIES:
        before = len(reached.methods)
        got = await outcome(address, presenting(certs, identity), call)
        if identity in allowed:
            assert got == grpc.StatusCode.OK, (identity, method)
            assert reached.methods[before:] == [method]
        else:
            assert got == grpc.StatusCode.PERMISSION_DENIED, (identity, method)
            assert reached.methods[before:] == [], f"{identity}'s {method} reached the servicer"


async def test_the_mesh_calls_are_the_ones_allowed() -> None:
    """The table itself: who calls what in the mesh, and nobody else."""
    assert {s: sorted(ids) for s, ids in CALLERS.items()} == {
        "tiermesh.v1.Router": ["frontdoor", "gateway"],
        "tiermesh.v1.Postprocess": ["worker"],
        "tiermesh.v1.Delivery": ["postprocess", "worker"],
        "tiermesh.v1.Books": ["frontdoor"],
    }


@pytest.mark.parametrize(("service", "method", "call"), CALLS, ids=[c[1] for c in CALLS])
async def test_no_certificate_or_another_cas_never_gets_in(
    mtls: tuple[str, Reached],
    certs: DevCerts,
    strangers: DevCerts,
    service: str,
    method: str,
    call: Call,
) -> None:
    address, reached = mtls
    allowed = sorted(CALLERS[service])[0]
    # Trusting the server, but presenting nothing: the handshake fails.
    assert await outcome(address, channel_credentials(certs.ca), call) == (
        grpc.StatusCode.UNAVAILABLE
    )
    # The right identity from another CA: the handshake fails too.
    forged = channel_credentials(certs.ca, *strangers.own(allowed))
    assert await outcome(address, forged, call) == grpc.StatusCode.UNAVAILABLE
    assert await outcome(address, None, call) == grpc.StatusCode.UNAVAILABLE
    assert reached.methods == []


async def test_health_answers_any_certificate_of_the_ca(
    mtls: tuple[str, Reached], certs: DevCerts
) -> None:
    address, _ = mtls
    for identity in IDENTITIES:
        assert await health(address, presenting(certs, identity)) == grpc.StatusCode.OK
    assert await health(address, channel_credentials(certs.ca)) == grpc.StatusCode.UNAVAILABLE


async def test_one_shared_certificate_naming_every_identity_may_call_everything(
    mtls: tuple[str, Reached], certs: DevCerts
) -> None:
    address, _ = mtls
    shared = channel_credentials(certs.ca, certs.internal_cert, certs.internal_key)
    for _, method, call in CALLS:
        assert await outcome(address, shared, call) == grpc.StatusCode.OK, method


async def test_a_certificate_naming_no_identity_is_refused(
    mtls: tuple[str, Reached], certs: DevCerts
) -> None:
    """The public port's client certificate comes from the same CA here, naming no
    identity (a certificate with only a CN or a DNS name is no tiermesh service)."""
    address, reached = mtls
    anonymous = channel_credentials(certs.ca, certs.client_cert, certs.client_key)
    for _, _, call in CALLS:
        assert await outcome(address, anonymous, call) == grpc.StatusCode.PERMISSION_DENIED
    assert reached.methods == []


async def test_without_internal_tls_there_is_no_check(tmp_path: Path) -> None:
    """Internal TLS off (explicitly, `--internal-tls off`): plaintext, as asked."""
    reached = Reached()
    server, address = await internal_server(RouterSettings(), reached)
    try:
        for _, method, call in CALLS:
            assert await outcome(address, None, call) == grpc.StatusCode.OK, method
    finally:
        await server.stop(None)


@pytest.fixture(scope="module")
def strangers(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    """Certificates of another CA, naming the same identities: trusted by nobody here."""
    return write_dev_certs(tmp_path_factory.mktemp("strangers"))
