"""The gateway's view of the rest of the mesh: the router, and worker liveness in Redis."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.call_stream import StreamPump
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.errors import (
    MeshError,
    code_from_int,
    code_to_int,
    deadline_exceeded,
    unavailable,
)
from tiermesh.core.jobs import Job
from tiermesh.core.server import make_channel
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.tls import internal_channel_credentials
from tiermesh.core.wire import job_to_proto
from tiermesh.gateway.cache import AnswerCache
from tiermesh.rollout.recorder import OutcomeRecorder
from tiermesh.v1 import job_pb2, router_pb2, router_pb2_grpc

UNAVAILABLE = code_to_int(grpc.StatusCode.UNAVAILABLE)

TIERS = ("edge", "center")
# A router restarting, or a blip on its link to Redis, is retried a little before the
# caller hears UNAVAILABLE. Safe: enqueues are idempotent by request id, so a Route whose
# reply was lost after the job was queued is not queued twice.
ROUTE_ATTEMPTS = 3
ROUTE_BACKOFF_S = 0.05


@dataclass(frozen=True, slots=True)
class Routed:
    """Where the router placed a job: the version, the id of the copy it mirrored to the
    canary ("" = none), and the stream entry."""

    version: str
    shadow_request_id: str = ""
    stream: str = ""
    entry_id: str = ""


class RouterClient:
    """Jobs to the router over one long-lived RouteStream (core/call_stream.StreamPump):
    `route` queues a job and awaits its outcome; the pump writes whatever is queued as one
    batch once the previous batch is answered, and outcomes are resolved as batches of them
    come back. Serial because the router handles a stream's batches one at a time: a job
    queued meanwhile would wait there anyway. No timer: one job at concurrency 1, what came
    in one round trip under load (at c32, 2.5 jobs a message; 1.15 when each batch went as
    soon as the previous write was done). A broken stream fails the jobs on it as
    UNAVAILABLE, which `route` retries on a new stream (enqueues are idempotent by request
    id). `close` ends the stream."""

    def __init__(self, channel: grpc.aio.Channel, max_batch_bytes: int = 16 * 1024 * 1024) -> None:
        # A batch holds jobs up to this many bytes (one bigger job goes alone): what queued
        # while a batch was out must not add up past the router's message limit.
        self._max_batch_bytes = max_batch_bytes
        self._queued: list[job_pb2.Job] = []
        self._waiting: dict[str, asyncio.Future[router_pb2.RouteReply]] = {}
        stub = router_pb2_grpc.RouterStub(channel)
        self._pump: StreamPump[router_pb2.JobBatch, router_pb2.RouteReplies, str] = StreamPump(
            stub.RouteStream, "router", self._take, self._answered, self._broken, serial=True
        )
        self.jobs = 0  # jobs written, for tests and statistics

    @property
    def batches(self) -> int:
        """Batches written."""
        return self._pump.messages

    async def route(self, job: Job, timeout_s: float) -> Routed:
        """Place the job on its stream; raises the router's refusal as a MeshError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        message = job_to_proto(job)
        for attempt in range(ROUTE_ATTEMPTS):
            left = deadline - loop.time()
            if left <= 0:
                raise deadline_exceeded("deadline passed before the request was routed")
            future: asyncio.Future[router_pb2.RouteReply] = loop.create_future()
            self._waiting[job.request_id] = future
            self._queued.append(message)
            self._pump.wake()
            try:
                async with asyncio.timeout(left):
                    reply = await future
            except TimeoutError:
                raise deadline_exceeded("deadline passed before the request was routed") from None
            finally:
                if self._waiting.get(job.request_id) is future:
                    del self._waiting[job.request_id]
            if reply.code == 0:
                version = reply.version or job.version
                return Routed(version, reply.shadow_request_id, reply.stream, reply.entry_id)
            if reply.code != UNAVAILABLE:
                raise MeshError(
                    code_from_int(reply.code),
                    reply.message,
                    retry_after_ms=_retry_after(reply),
                )
            if attempt + 1 == ROUTE_ATTEMPTS:
                raise unavailable(f"router unavailable: {reply.message}")
            await asyncio.sleep(min(ROUTE_BACKOFF_S * 2**attempt, max(0.0, deadline - loop.time())))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def close(self) -> None:
        """End the stream; jobs still waiting fail as UNAVAILABLE."""
        await self._pump.close()

    def _take(self) -> tuple[router_pb2.JobBatch, list[str]] | None:
        """What is queued whose caller still waits, as one batch of at most max_batch_bytes
        (at least one job); the rest stays queued, in order, for the next."""
        live: list[job_pb2.Job] = []
        size = 0
        queued = self._queued
        end = len(queued)
        for i, message in enumerate(queued):
            if message.request_id not in self._waiting:
                continue  # its caller left
            n = message.ByteSize()
            if live and size + n > self._max_batch_bytes:
                end = i
                break
            live.append(message)
            size += n
        self._queued = queued[end:]
        if not live:
            return None
        self.jobs += len(live)
        return router_pb2.JobBatch(jobs=live), [m.request_id for m in live]

    def _answered(self, replies: router_pb2.RouteReplies, sent: set[str]) -> None:
        for reply in replies.replies:
            sent.discard(reply.request_id)
            future = self._waiting.get(reply.request_id)
            if future is not None and not future.done():
                future.set_result(reply)

    def _broken(self, request_ids: set[str], error: grpc.aio.AioRpcError) -> None:
        """Jobs that were on a broken stream: `route` sends them again."""
        lost = router_pb2.RouteReply(code=UNAVAILABLE, message=error.details() or error.code().name)
        for request_id in request_ids:
            future = self._waiting.get(request_id)
            if future is not None and not future.done():
                future.set_result(lost)


def _retry_after(reply: router_pb2.RouteReply) -> int | None:
    return reply.retry_after_ms if reply.HasField("retry_after_ms") else None


class Liveness:
    """Answers ServerReady / ModelReady from Redis (worker heartbeats)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def redis_ok(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (aioredis.RedisError, OSError):
            return False

    async def workers(self, unit: ComputeUnit) -> int:
        """Live workers of a compute unit over all tiers."""
        now_ms = int(time.time() * 1000)
        try:
            counts = [
                await self._redis.zcount(keys.workers_key(unit, tier), now_ms, "+inf")
                for tier in TIERS
            ]
        except (aioredis.RedisError, OSError) as exc:
            raise MeshError(grpc.StatusCode.UNAVAILABLE, "redis unavailable") from exc
        return int(sum(counts))


class Cancellations:
    """Tells workers that a caller gave up, so its request is skipped if not yet computed."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def mark(self, request_id: str, ttl_ms: int) -> None:
        """Best effort: a lost mark only costs one wasted computation."""
        try:
            await self._redis.set(keys.cancel_key(request_id), b"1", px=max(ttl_ms, 1000))
        except (aioredis.RedisError, OSError):
            pass


@dataclass(frozen=True)
class Upstream:
    """What the gateway talks to besides its callers; built once in __main__."""

    router: RouterClient
    liveness: Liveness
    cancellations: Cancellations
    cache: AnswerCache | None = None
    # Per-version outcomes for canary judgement; None: not recorded (tests of other things).
    recorder: OutcomeRecorder | None = field(default=None)
    # The router's channel where `connect` opened it (closed by `close`).
    channel: grpc.aio.Channel | None = None

    @classmethod
    def connect(
        cls, settings: GatewaySettings, redis: aioredis.Redis, recorder: OutcomeRecorder
    ) -> Upstream:
        """The router at settings.router_address (one stream of batches over an internal
        channel) and the gateway's state in `redis`."""
        channel = make_channel(
            settings.router_address,
            settings.max_message_bytes,
            internal_channel_credentials(settings),
        )
        return cls(
            RouterClient(channel, settings.max_message_bytes // 4),
            Liveness(redis),
            Cancellations(redis),
            AnswerCache(redis),
            recorder,
            channel,
        )

    async def close(self) -> None:
        """The router stream's pump and reader, then the channel."""
        await self.router.close()
        if self.channel is not None:
            await self.channel.close()
