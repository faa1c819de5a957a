"""The public doors' request limit (TIERMESH_MAX_REQUEST_BYTES): its default and its bound
by the message limit, and a server built with it refusing a bigger message from its header
while its answers may still be as large as the message limit."""

from __future__ import annotations

import grpc
import pytest
from pydantic import ValidationError

from tiermesh.core.server import make_server
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import Telemetry

MIB = 1 << 20


def test_requests_default_to_8_mib_and_at_most_half_a_message() -> None:
    assert GatewaySettings().max_request_bytes == 8 * MIB
    # A smaller message limit and no request limit given: the request limit follows.
    assert GatewaySettings(max_message_bytes=MIB).max_request_bytes == MIB // 2
    assert GatewaySettings(max_request_bytes=32 * MIB).max_request_bytes == 32 * MIB
    with pytest.raises(ValidationError, match="TIERMESH_MAX_REQUEST_BYTES"):
        GatewaySettings(max_request_bytes=33 * MIB)


async def test_a_request_past_the_limit_is_refused_and_a_big_answer_still_sent() -> None:
    server = make_server(Telemetry("gateway"), 4 * MIB, intercepted=False, max_receive_bytes=MIB)

    async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return bytes(3 * MIB)  # over the request limit, under the message limit

    handler = grpc.unary_unary_rpc_method_handler(handle)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"E": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            call = channel.unary_unary("/t.T/E")
            assert len(await call(bytes(MIB - 64), timeout=10)) == 3 * MIB
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await call(bytes(MIB + 1), timeout=10)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "larger than max" in (exc.value.details() or "")
    finally:
        await server.stop(None)
