"""What one gRPC hop costs in Python (grpc.aio), client and server CPU side by side in one run.

Two questions behind the request path's budget (DESIGN.md, "What a request may cost"):

- the public call: a bare KServe v2 ModelInfer servicer answering tritonclient.grpc.aio at
  concurrency C, without and with the OpenTelemetry server interceptor (no span processor:
  tracing off). The bare figure is the floor of the gateway's per-request CPU.
- an internal hop carrying a batch of B requests (B x `--payload` bytes, the size of one
  16-token MiniLM hidden state by default): one unary call per batch against one message
  per batch on a long-lived bidirectional stream (a reply message per batch).
- with --go, the bare public call against the same servicer in Go (grpc-go,
  go_front_door/main.go, built into benchmarks/build/go/ as the Go front door is built,
  tiermesh/frontdoor/build.py): what a compiled front door pays per call at the least.
  Needs Debian's Go toolchain (scripts/ensure_go.sh, or apt-get install golang-go
  golang-google-grpc-dev golang-goprotobuf-dev protobuf-compiler).

CPU is user + system of the server process (from /proc) and of this process (the client),
per request, the median over --repeats rounds; modes alternate their order per round. All
traffic goes to 127.0.0.1. It asserts nothing.

    .venv/bin/python benchmarks/grpc_hops.py [--requests 3000] [--batch 8] [--repeats 3] [--go]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tiermesh.bench.cpu import process_cpu_s
from tiermesh.frontdoor.build import FrontDoorUnavailable, build

HOP = "/bench.Hop/"
HERE = Path(__file__).resolve().parent


class Infer(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request: Any, context: Any) -> Any:
        reply = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        out = reply.outputs.add()
        out.name, out.datatype = "sentence_embedding", "FP32"
        out.shape.extend([1, 384])
        reply.raw_output_contents.append(bytes(1536))
        return reply


async def _unary(request: bytes, context: Any) -> bytes:
    return b"ok"


async def _stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for _ in requests:
        yield b"ok"


def serve(port_out: Any, traced: bool) -> None:
    """The server process: the ModelInfer servicer and the two internal-hop methods."""

    async def main() -> None:
        interceptors = []
        if traced:
            from opentelemetry.instrumentation.grpc import aio_server_interceptor
            from opentelemetry.sdk.trace import TracerProvider

            interceptors = [aio_server_interceptor(tracer_provider=TracerProvider())]
        server = grpc.aio.server(
            interceptors=interceptors, options=[("grpc.max_receive_message_length", 1 << 26)]
        )
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Infer(), server)
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
            "Stream": grpc.stream_stream_rpc_method_handler(_stream),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Hop", handlers),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_out.put(port)
        await server.wait_for_termination()

    asyncio.run(main())


async def public_calls(address: str, n: int, concurrency: int) -> None:
    client = grpcaio.InferenceServerClient(address)
    ids = grpcclient.InferInput("input_ids", [1, 16], "INT64")
    ids.set_data_from_numpy(np.ones((1, 16), np.int64))
    todo = iter(range(n))

    async def caller() -> None:
        for _ in todo:
            await client.infer("minilm", [ids])

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    await client.close()


async def unary_batches(address: str, batches: int, payload: bytes) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(HOP + "Unary")
        for _ in range(batches):
            await call(payload)


async def stream_batches(address: str, batches: int, payload: bytes) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(HOP + "Stream")()
        for _ in range(batches):
            await call.write(payload)
            await call.read()
        await call.done_writing()


Load = Callable[[str], Awaitable[None]]


def build_go_server(out: Path) -> Path:
    """go_front_door/main.go built as the front door is (tiermesh/frontdoor/build.py: Debian's
    Go packages, stubs from the protos tritonclient ships); the binary's path."""
    try:
        return build(out, sources=HERE / "go_front_door")
    except FrontDoorUnavailable as exc:
        raise SystemExit(f"--go: {exc}") from None


def measure(load: Load, traced: bool, go_binary: Path | None = None) -> tuple[float, float, float]:
    """(server CPU s, client CPU s, wall s) of one load against a fresh server (the Go one
    with `go_binary`)."""
    proc: Any
    if go_binary is not None:
        proc = subprocess.Popen([go_binary], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
    else:
        ports: Any = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(target=serve, args=(ports, traced), daemon=True)
        proc.start()
        port = ports.get(timeout=60)
    try:
        address = f"127.0.0.1:{port}"
        asyncio.run(load(address))  # warm-up: the first calls pay for connecting
        server0 = process_cpu_s(proc.pid)
        client0, wall0 = time.process_time(), time.perf_counter()
        asyncio.run(load(address))
        return (
            process_cpu_s(proc.pid) - server0,
            time.process_time() - client0,
            time.perf_counter() - wall0,
        )
    finally:
        proc.kill()
        proc.wait() if go_binary is not None else proc.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per mode and round")
    parser.add_argument("--concurrency", type=int, default=32, help="public calls in flight")
    parser.add_argument("--batch", type=int, default=8, help="requests per internal message")
    parser.add_argument("--payload", type=int, default=16 * 384 * 4, help="bytes per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--go", action="store_true", help="also the bare call on a Go server")
    args = parser.parse_args()
    go_binary = build_go_server(HERE / "build" / "go") if args.go else None
    n, batch = args.requests, args.batch
    payload = bytes(args.payload * batch)
    batches = max(1, n // batch)
    public: Load = lambda a: public_calls(a, n, args.concurrency)  # noqa: E731
    modes: dict[str, tuple[Load, bool, int, Path | None]] = {
        "public ModelInfer, bare": (public, False, n, None),
        "public ModelInfer, otel interceptor": (public, True, n, None),
        **(
            {"public ModelInfer, bare, Go server": (public, False, n, go_binary)}
            if go_binary
            else {}
        ),
        f"internal hop, unary per batch of {batch}": (
            lambda a: unary_batches(a, batches, payload),
            False,
            batches * batch,
            None,
        ),
        f"internal hop, stream message per batch of {batch}": (
            lambda a: stream_batches(a, batches, payload),
            False,
            batches * batch,
            None,
        ),
    }
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in modes}
    for round_ in range(args.repeats):
        order = list(modes) if round_ % 2 == 0 else list(reversed(modes))
        for name in order:
            load, traced, requests, binary = modes[name]
            server, client, wall = measure(load, traced, binary)
            rows[name].append((server / requests * 1e6, client / requests * 1e6, requests / wall))
            print(f"round {round_ + 1}: {name} done", flush=True)
    print("\n| mode | server CPU us/request | client CPU us/request | requests/s |")
    print("|---|---|---|---|")
    for name, runs in rows.items():
        server, client, rate = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"| {name} | {server:.0f} | {client:.0f} | {rate:.0f} |")


if __name__ == "__main__":
    main()
