"""The gateway's view of the rest of the mesh: the router, and worker liveness in Redis."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import grpc
import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.errors import MeshError, deadline_exceeded, unavailable
from tiermesh.core.grpc_errors import mesh_error_from_rpc
from tiermesh.core.jobs import Job
from tiermesh.core.wire import job_to_proto
from tiermesh.gateway.cache import ResponseCache
from tiermesh.rollout.recorder import Recorder
from tiermesh.v1 import router_pb2_grpc

TIERS = ("edge", "center")
# A router restarting, or a blip on its link to Redis, is retried a little before the
# caller hears UNAVAILABLE. Safe: enqueues are idempotent by request id, so a Route whose
# reply was lost after the job was queued is not queued twice.
ROUTE_ATTEMPTS = 3
ROUTE_BACKOFF_S = 0.05


@dataclass(frozen=True, slots=True)
class Routed:
    """Where the router placed a job: the version, and the id of the copy it mirrored to
    the canary ("" = none)."""

    version: str
    shadow_request_id: str = ""


class RouterClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = router_pb2_grpc.RouterStub(channel)

    async def route(self, job: Job, timeout_s: float) -> Routed:
        """Place the job on its stream; raises the router's refusal as a MeshError."""
        deadline = time.monotonic() + timeout_s
        message = job_to_proto(job)
        for attempt in range(ROUTE_ATTEMPTS):
            left = deadline - time.monotonic()
            if left <= 0:
                raise deadline_exceeded("deadline passed before the request was routed")
            try:
                reply = await self._stub.Route(message, timeout=left)
                return Routed(reply.version or job.version, reply.shadow_request_id)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise mesh_error_from_rpc(err) from None
                if attempt + 1 == ROUTE_ATTEMPTS:
                    raise unavailable(f"router unavailable: {err.details()}") from None
            await asyncio.sleep(min(ROUTE_BACKOFF_S * 2**attempt, max(0.0, left)))
        raise AssertionError("unreachable: the last attempt returns or raises")


class Liveness:
    """Answers ServerReady / ModelReady from Redis (worker heartbeats)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis

    async def redis_ok(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (aioredis.RedisError, OSError):
            return False

    async def workers(self, unit: str) -> int:
        """Live workers of a compute unit ("mlp.fp32") over all tiers."""
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
    cache: ResponseCache | None = None
    # Per-version outcomes for canary judgement; None: not recorded (tests of other things).
    recorder: Recorder | None = field(default=None)
