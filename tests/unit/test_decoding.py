"""The public port's requests before they are messages: compressed ones inflate within a
bound (grpc itself inflates them whole first), unparseable ones are INVALID_ARGUMENT."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tiermesh.gateway.decoding import (
    PUBLIC_SERVER_OPTIONS,
    UNDECODABLE_MESSAGE,
    Refused,
    _reading,
    _ready,
    add_inference_servicer,
    inflated,
)

LIMIT = 1 << 20
REQUEST = service_pb2.ModelInferRequest(model_name="m", id="r").SerializeToString()


def test_a_message_sent_as_it_is_stays_as_it_is() -> None:
    assert inflated(REQUEST, LIMIT) is REQUEST
    assert inflated(b"", LIMIT) == b""


@pytest.mark.parametrize("compress", [gzip.compress, zlib.compress])
def test_gzip_and_zlib_inflate(compress: Any) -> None:
    assert inflated(compress(REQUEST), LIMIT) == REQUEST


@pytest.mark.parametrize("compress", [gzip.compress, zlib.compress])
def test_a_bomb_stops_at_the_limit(compress: Any) -> None:
    refused = inflated(compress(bytes(64 << 20)), LIMIT)
    assert isinstance(refused, Refused)
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"inflates past {LIMIT} bytes" in refused.message


async def test_a_compressed_request_is_read_in_a_thread_and_a_plain_one_at_once() -> None:
    read = _reading(service_pb2.ModelInferRequest.FromString, LIMIT)
    assert read(REQUEST) == service_pb2.ModelInferRequest.FromString(REQUEST)
    compressed = read(gzip.compress(REQUEST))
    assert not isinstance(compressed, (Refused, service_pb2.ModelInferRequest))
    threads: list[str] = []
    original = compressed.read
    object.__setattr__(
        compressed, "read", lambda d: threads.append(threading.current_thread().name) or original(d)
    )
    assert await _ready(compressed) == service_pb2.ModelInferRequest.FromString(REQUEST)
    assert threads and threads[0] != threading.main_thread().name  # off the event loop
    bomb = await _ready(read(gzip.compress(bytes(64 << 20))))
    assert isinstance(bomb, Refused) and bomb.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_broken_gzip_is_undecodable() -> None:
    whole = gzip.compress(REQUEST)
    for broken in (whole[:-5], whole + b"junk", whole[:10] + b"\x00" * 10):
        refused = inflated(broken, LIMIT)
        assert isinstance(refused, Refused) and refused.message == UNDECODABLE_MESSAGE


def test_a_message_that_starts_like_a_zlib_header_is_the_message() -> None:
    # Field 1 as a varint of 29: 0x08 0x1d is also a valid RFC 1950 header.
    message = b"\x08\x1d\x12\x01a"
    assert (message[0] << 8 | message[1]) % 31 == 0
    assert inflated(message, LIMIT) is message


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        return service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)

    async def ModelStreamInfer(self, requests, context):  # type: ignore[no-untyped-def]
        async for request in requests:
            if isinstance(request, Refused):
                yield service_pb2.ModelStreamInferResponse(error_message=request.message)
            else:
                yield service_pb2.ModelStreamInferResponse(
                    infer_response=service_pb2.ModelInferResponse(id=request.id)
                )


async def _serve() -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(options=PUBLIC_SERVER_OPTIONS)
    add_inference_servicer(_Servicer(), server, None, LIMIT)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.mark.parametrize("algorithm", [grpc.Compression.Gzip, grpc.Compression.Deflate])
async def test_compressed_calls_are_served_and_a_bomb_refused(algorithm: grpc.Compression) -> None:
    server, port = await _serve()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            big = service_pb2.ModelInferRequest(model_name="ok", id="x" * 4096)
            reply = await stub.ModelInfer(big, compression=algorithm, timeout=10)
            assert (reply.model_name, len(reply.id)) == ("ok", 4096)
            bomb = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[bytes(LIMIT)])
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.ModelInfer(bomb, compression=algorithm, timeout=10)
            assert exc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"inflates past {LIMIT} bytes" in (exc.value.details() or "")
    finally:
        await server.stop(None)


async def test_a_bomb_on_a_stream_is_answered_on_the_stream() -> None:
    server, port = await _serve()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

            async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
                yield service_pb2.ModelInferRequest(id="bomb", raw_input_contents=[bytes(LIMIT)])
                yield service_pb2.ModelInferRequest(id="after")

            call = stub.ModelStreamInfer(requests(), compression=grpc.Compression.Gzip)
            answers = [r async for r in call]
            assert "inflates past" in answers[0].error_message
            assert answers[1].infer_response.id == "after"
    finally:
        await server.stop(None)
