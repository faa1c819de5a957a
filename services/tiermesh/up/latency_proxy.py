"""A TCP proxy that makes a link slow, not narrow: every byte is delivered a fixed time
after it arrived, in order, in each direction, while any number of bytes are in flight.
`tiermesh up --edge-link-ms N` puts one in front of redis and one in front of postprocess
for the edge worker, so the edge tier sees the round trip of a real edge-to-center link.

The delay is given as the added ROUND TRIP and split evenly: rtt_ms / 2 each way. A chunk
is never delivered before its release time (monotonic loop clock), so a request-reply
through the proxy takes at least rtt_ms longer than without it; it may be later when the
machine is busy. Connection setup is not delayed (the links `up` proxies are long-lived).

Per connection and direction, a reader task stamps each chunk with its release time and
queues it; the direction's writer writes each chunk when its time comes. Up to
MAX_QUEUED_CHUNKS chunks may wait per direction (then the reader stops reading: TCP back
pressure), so throughput is bounded only by that window divided by the delay.

    python -m tiermesh.up.latency_proxy --listen 127.0.0.1:PORT --target HOST:PORT --rtt-ms N
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Sequence

CHUNK_BYTES = 64 * 1024
MAX_QUEUED_CHUNKS = 4096
# asyncio runs a timer up to one clock resolution before its time; sleeping that much
# longer keeps the promise that nothing is delivered before its release time.
TIMER_EARLY_S = time.get_clock_info("monotonic").resolution
# A queued chunk: release time (loop clock, s) and the bytes; b"" = the sender's EOF,
# None = the read failed (the connection is reset).
Queued = tuple[float, bytes | None]


class LinkBroken(ConnectionError):
    """A read on the other side of a direction failed: the connection ends in both."""


class LatencyProxy:
    """Listens on one address and forwards each connection to `target`, delayed.

    `start` binds and returns the listening (host, port); `close` stops listening, cancels
    every connection's tasks and aborts its sockets, and returns when all are gone."""

    def __init__(self, target_host: str, target_port: int, rtt_ms: float) -> None:
        if rtt_ms < 0:
            raise ValueError("rtt_ms must be >= 0")
        self.target = (target_host, target_port)
        self.one_way_s = rtt_ms / 2000.0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._accepted, host, port)
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accepted(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        """Called by the server for each accepted connection: serves it in a task of the
        proxy's own, which `close` cancels."""
        if self._closing:  # accepted just before close(): never served
            client_w.transport.abort()
            return
        task = asyncio.create_task(self._connection(client_r, client_w))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _connection(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        """Both directions until each has seen its sender's EOF; a reset, a failed connect
        to the target or cancellation aborts both sides instead."""
        writers = [client_w]
        clean = False
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
            writers.append(upstream_w)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._direction(client_r, upstream_w))
                tg.create_task(self._direction(upstream_r, client_w))
            clean = True
        except* OSError:
            pass  # the target is down or a side reset: nothing to report to anyone
        finally:
            for w in writers:
                if clean:
                    w.close()
                else:
                    w.transport.abort()

    async def _direction(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Moves one direction until the sender's EOF (forwarded as a half-close)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Queued] = asyncio.Queue(MAX_QUEUED_CHUNKS)

        async def read() -> None:
            while True:
                try:
                    chunk: bytes | None = await reader.read(CHUNK_BYTES)
                except OSError:
                    chunk = None
                await queue.put((loop.time() + self.one_way_s, chunk))
                if not chunk:
                    return

        reading = asyncio.create_task(read())
        try:
            while True:
                release, chunk = await queue.get()
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait + TIMER_EARLY_S)
                if chunk is None:
                    raise LinkBroken
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


async def serve(listen: tuple[str, int], target: tuple[str, int], rtt_ms: float) -> None:
    """Runs the proxy until SIGTERM or SIGINT, then closes it."""
    proxy = LatencyProxy(*target, rtt_ms)
    await proxy.start(*listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await proxy.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--listen", type=_address, required=True, help="HOST:PORT to listen on")
    p.add_argument("--target", type=_address, required=True, help="HOST:PORT to forward to")
    p.add_argument("--rtt-ms", type=float, required=True, help="added round trip, ms")
    args = p.parse_args(argv)
    if args.rtt_ms < 0:
        p.error("--rtt-ms must be >= 0")
    asyncio.run(serve(args.listen, args.target, args.rtt_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
