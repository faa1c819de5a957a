"""The feeder: moves batch-job inputs from their job onto the background streams, a chunk at
a time, keeping a bounded number of each job's inputs queued. Runs in every router; only
the holder of a Redis lock with a TTL feeds (another router takes over within the TTL when
it dies). Restart-safe: the cursor lives in the job record and moves atomically with the
XADDs (batch/store.py), so a feeder that dies mid-round queues nothing twice."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

import redis.asyncio as aioredis
import structlog

from tiermesh.batch.plan import (
    FINISHED,
    JobRecord,
    background_tier,
    feed_count,
    request_id,
)
from tiermesh.batch.store import BatchStore
from tiermesh.core.controls import Controls
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.keys import BACKGROUND_PRIORITY, StreamKey
from tiermesh.core.loops import lock_owner, repeat
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import RouterSettings
from tiermesh.core.text import TextEncoder
from tiermesh.core.wire import decode_job, encode_job
from tiermesh.router.inputs import with_tokens
from tiermesh.router.policy import choose_stream

log = structlog.get_logger("tiermesh.router.batch_feeder")
# Rounds while no job is active come this many feed intervals apart (20 ms -> 0.5 s).
IDLE_INTERVALS = 25


class Feeder:
    @classmethod
    def from_settings(
        cls,
        settings: RouterSettings,
        redis: aioredis.Redis,
        repo: ModelRepository,
        encoders: Mapping[str, TextEncoder],
    ) -> Feeder:
        return cls(
            BatchStore(redis, settings.batch_retention_s),
            repo,
            encoders,
            lock_owner(),
            pinned_tier=settings.batch_tier,
            max_queued=settings.batch_max_queued,
            chunk=settings.batch_feed_chunk,
            lock_ttl_ms=settings.rollout_lock_ttl_ms,
        )

    def __init__(
        self,
        store: BatchStore,
        repo: ModelRepository,
        encoders: Mapping[str, TextEncoder],
        owner: str,
        *,
        pinned_tier: str = "",
        max_queued: int = 256,
        chunk: int = 64,
        lock_ttl_ms: int = 3000,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._store = store
        self._repo = repo
        self._encoders = encoders
        self._owner = owner
        self._pinned = pinned_tier
        self._max_queued = max_queued
        self._chunk = chunk
        self._lock_ttl_ms = lock_ttl_ms
        self._clock_ns = clock_ns
        # Whether the last round found an active job (the next comes after one interval).
        self.busy = False

    async def run(self, interval_s: float) -> None:
        """Feed rounds until cancelled; Redis trouble is logged and the next round retries.
        While no job is active a round is one SMEMBERS, every IDLE_INTERVALS intervals."""
        await repeat(
            self.round,
            lambda: interval_s * (1 if self.busy else IDLE_INTERVALS),
            lambda exc: log.warning("batch feed round failed", error=str(exc)),
        )

    async def round(self) -> int:
        """One round, if this router holds the lock: each active job gets its next chunk
        where it has room. Returns how many inputs were queued."""
        active = await self._store.active()
        self.busy = bool(active)
        if not active or not await self._store.hold_lock(self._owner, self._lock_ttl_ms):
            return 0
        queued = 0
        for job_id in active:
            job = await self._store.get(job_id)
            if job is None:
                # Expired (a job unfed for the retention period): nothing left to feed.
                await self._store.deactivate(job_id)
                continue
            if job.status in FINISHED:
                continue
            cfg = self._repo.get(job.model)
            n = feed_count(job, self._max_queued, self._chunk)
            if cfg is None or n == 0:
                continue
            raw = await self._store.inputs(job_id, job.fed, n)
            if not raw:
                continue
            # Decoding, tokenizing (one encode_batch, without the GIL) and encoding a chunk
            # take a thread: up to ~11 ms a 16 KiB text, which online batches routed on
            # this event loop would otherwise wait for.
            entries = await asyncio.to_thread(self._entries, cfg, job, raw)
            if await self._store.feed(job_id, job.fed, entries) >= 0:
                queued += len(entries)
        return queued

    def _entries(
        self, cfg: ModelConfig, rec: JobRecord, raw: Sequence[bytes]
    ) -> list[tuple[StreamKey, bytes]]:
        """The stream entries of the job's inputs `raw` (from its cursor on): input
        processing as the router does it online (tokenizing text, all of them in one
        call), then each one's background stream on the job's tier. Runs on a thread."""
        jobs = [self._job(cfg, rec, rec.fed + i, r) for i, r in enumerate(raw)]
        if cfg.tokenize is not None:
            encoded = self._encoders[cfg.name].encode_many([j.inputs[0] for j in jobs])
            jobs = [with_tokens(j, e) for j, e in zip(jobs, encoded, strict=True)]
        return [self._entry(cfg, rec, job) for job in jobs]

    def _job(self, cfg: ModelConfig, rec: JobRecord, index: int, raw: bytes) -> Job:
        """The job of one stored input, before input processing."""
        tier = rec.tier or background_tier(cfg, self._pinned)
        return Job(
            request_id=request_id(rec.job_id, index),
            model=cfg.name,
            inputs=decode_job(raw).inputs,
            gateway="",
            tenant=rec.tenant,
            version=cfg.version_for(rec.version),
            variant=cfg.variant_for(rec.variant, cfg.tier(tier)),
            controls=Controls(batch_job=rec.job_id, batch_index=index),
        )

    def _entry(self, cfg: ModelConfig, rec: JobRecord, job: Job) -> tuple[StreamKey, bytes]:
        """The stream entry of one processed input: its background stream on its tier."""
        now = self._clock_ns()
        tier = rec.tier or background_tier(cfg, self._pinned)
        online = choose_stream(cfg, job, tier)
        stream = StreamKey(online.unit, tier, BACKGROUND_PRIORITY, online.bucket)
        job = dataclasses.replace(
            job,
            priority=BACKGROUND_PRIORITY,
            bucket=stream.bucket,
            tier=tier,
            timing=Timing(received_ns=now, routed_ns=now, enqueued_ns=now),
        )
        return stream, encode_job(job)
