"""Traffic capture: a sample of the gateway's requests as a trace of their shapes, for
`tiermesh bench replay` (baselines built from real traffic).

A captured request is its arrival time, model, version and variant, priority, tenant,
deadline, outcome code, timing breakdown, tier and bucket, and per input its name, datatype,
shape and byte size (for text, the word count and the router's token count) - never its
contents. Contents are stored only for tenants whose tenants-file entry sets
`capture_contents: true`, and only when a key is configured: encrypted (Fernet, AES-128-CBC
+ HMAC-SHA256) under a key of their own that expires (TTL).

The request path only decides (sample rate, window) and appends to a bounded in-memory
queue; one background task owned by the gateway's composition root writes the queue to the
capture stream in one pipeline per round, in which it also reads the capture control hash
(`tiermesh bench capture start|stop`), so capturing costs no Redis round trip per request.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import random
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from cryptography.fernet import Fernet
from prometheus_client import CollectorRegistry, Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tiermesh.core import keys
from tiermesh.core.errors import MAX_RECORDED_NAME
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.loops import raise_if_cancelling
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.tensors import split_bytes
from tiermesh.gateway.auth import Tenants

log = structlog.get_logger("tiermesh.gateway.capture")
RECORD_FIELD = "r"
SCHEMA = 1
# Requests waiting for the writer at most; beyond it a captured request is counted as lost.
MAX_QUEUED = 10_000


@dataclass(frozen=True, slots=True)
class CaptureState:
    """What is sampled now: a share of requests until a wall-clock time (ms)."""

    rate: float = 0.0
    until_ms: float = math.inf

    def sampling(self, now_ms: float) -> bool:
        return self.rate > 0 and now_ms < self.until_ms


def state_from_control(fields: Mapping[bytes | str, bytes | str]) -> CaptureState | None:
    """The state the control hash asks for; None when it holds none (settings apply)."""
    text = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }
    if "rate" not in text:
        return None
    try:
        rate = min(1.0, max(0.0, float(text["rate"])))
        until = float(text.get("until_ms") or math.inf)
    except ValueError:
        return None
    return CaptureState(rate, until if until > 0 else math.inf)


@dataclass(frozen=True, slots=True)
class Observed:
    """One finished request as the data plane saw it (built on the request path, no I/O)."""

    request_id: str
    model: str
    tenant: str
    code: str
    received_ns: int
    ended_ns: int
    job: Job | None = None
    result: JobResult | None = None
    cache_hit: bool = False


def word_count(raw: bytes, count: int, name: str) -> int:
    """Words (whitespace-separated) in the elements of a BYTES tensor: a size, not content."""
    try:
        return sum(len(item.split()) for item in split_bytes(raw, count, name))
    except Exception:  # malformed framing was refused already; count nothing
        return 0


def build_record(obs: Observed) -> dict[str, Any]:
    """The shape of one request as it goes into the capture stream (pure). Never holds a
    tensor's bytes or a text."""
    job, result = obs.job, obs.result
    record: dict[str, Any] = {
        "v": SCHEMA,
        "t_ms": round(obs.received_ns / 1e6, 3),
        "model": job.model if job else obs.model[:MAX_RECORDED_NAME],
        "version": (result.version if result else "") or (job.version if job else ""),
        "variant": (result.variant if result else "") or (job.variant if job else ""),
        "priority": job.priority if job else None,
        "tenant": obs.tenant,
        "deadline_ms": round((job.deadline_ns - obs.received_ns) / 1e6, 3)
        if job and job.deadline_ns
        else None,
        "code": obs.code,
        "cache_hit": obs.cache_hit,
        "inputs": [],
    }
    if job is not None:
        for t in job.inputs:
            item: dict[str, Any] = {
                "name": t.name,
                "datatype": t.datatype,
                "shape": list(t.shape),
                "bytes": len(t.raw),
            }
            if t.datatype == "BYTES":
                count = math.prod(t.shape) if t.shape else 1
                item["words"] = word_count(t.raw, count, t.name)
            record["inputs"].append(item)
    if result is not None:
        record["tier"] = result.tier
        record["bucket"] = result.bucket
        record["batch_size"] = result.batch_size
        if "tokens" in result.annotations:
            record["tokens"] = int(result.annotations["tokens"])
        timing = result.timing.breakdown_ms(obs.ended_ns)
        record["timing_ms"] = {k.removesuffix("_ms"): round(v, 3) for k, v in timing.items()}
    else:
        record["timing_ms"] = {"total": round((obs.ended_ns - obs.received_ns) / 1e6, 3)}
    return record


def seal_contents(job: Job, fernet: Fernet) -> bytes:
    """The request's inputs, encrypted: JSON of name, datatype, shape and base64 bytes."""
    doc = [
        {
            "name": t.name,
            "datatype": t.datatype,
            "shape": list(t.shape),
            "raw": base64.b64encode(t.raw).decode(),
        }
        for t in job.inputs
    ]
    return fernet.encrypt(json.dumps(doc).encode())


def open_contents(token: bytes, fernet: Fernet) -> list[dict[str, Any]]:
    """Inverse of seal_contents (InvalidToken with the wrong key)."""
    doc: list[dict[str, Any]] = json.loads(fernet.decrypt(token))
    for t in doc:
        t["raw"] = base64.b64decode(t["raw"])
    return doc


class CaptureMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.captured = Counter(
            "tiermesh_capture_records", "Requests written to the capture stream", registry=registry
        )
        self.lost = Counter(
            "tiermesh_capture_records_lost",
            "Sampled requests not captured (writer queue full or Redis trouble)",
            registry=registry,
        )


class Capture:
    """Built in the gateway's __main__. As each request ends the data plane asks `sampled`
    and hands a sampled request to `keep` (`observe` does both); `run` is the one writer
    task (owned by the gateway's Service: cancelled, then `flush`ed)."""

    def __init__(
        self,
        redis: Redis,
        initial: CaptureState,
        *,
        max_len: int,
        contents_tenants: Collection[str] = (),
        contents_key: str = "",
        contents_ttl_s: int = 86_400,
        metrics: CaptureMetrics | None = None,
        clock_ms: Callable[[], float] | None = None,
        sample: Callable[[], float] = random.random,
    ) -> None:
        self._redis = redis
        self._configured = initial
        self.state = initial
        self._max_len = max_len
        self._fernet = Fernet(contents_key.encode()) if contents_key else None
        self._contents_tenants = frozenset(contents_tenants) if self._fernet else frozenset()
        if contents_tenants and self._fernet is None:
            log.warning(
                "capture_contents is set for tenants but no contents key is configured "
                "(TIERMESH_CAPTURE_CONTENTS_KEY): their contents are not captured",
                tenants=sorted(contents_tenants),
            )
        self._ttl_s = contents_ttl_s
        self._metrics = metrics
        self._clock_ms = clock_ms or (lambda: time.time_ns() / 1e6)
        self._sample = sample
        self._queue: deque[Observed] = deque()
        self.lost = 0

    @classmethod
    def from_settings(
        cls,
        settings: GatewaySettings,
        redis: Redis,
        tenants: Tenants | None,
        registry: CollectorRegistry,
    ) -> Capture:
        """Traffic capture as the settings start it (`tiermesh bench capture` changes it
        live)."""
        return cls(
            redis,
            initial_state(
                settings.capture_sample_rate, settings.capture_window_s, time.time() * 1e3
            ),
            max_len=settings.capture_max_len,
            contents_tenants=tenants.capture_contents if tenants is not None else (),
            contents_key=settings.capture_contents_key,
            contents_ttl_s=settings.capture_contents_ttl_s,
            metrics=CaptureMetrics(registry),
        )

    def observe(self, obs: Observed) -> None:
        """Called once per finished request, on the request path: no I/O."""
        if self.sampled():
            self.keep(obs)

    def sampled(self) -> bool:
        """Whether the request ending now is captured: asked first, so that a request that
        is not costs no record (none while capture is off)."""
        state = self.state
        if state.rate <= 0:
            return False
        return state.sampling(self._clock_ms()) and self._sample() < state.rate

    def rate_now(self) -> float:
        """The share of requests sampled now (0 while capture is off or its window over),
        for the front door, which samples the calls it answers itself (books.py)."""
        state = self.state
        return state.rate if state.sampling(self._clock_ms()) else 0.0

    def keep(self, obs: Observed) -> None:
        """Queue a sampled request for the writer."""
        if len(self._queue) >= MAX_QUEUED:
            self._lose(1)
            return
        self._queue.append(obs)

    def _lose(self, n: int) -> None:
        self.lost += n
        if self._metrics is not None:
            self._metrics.lost.inc(n)

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)  # a write period, not a synchronisation
            await self.flush()
            raise_if_cancelling()

    async def flush(self) -> int:
        """Writes what is queued and reads the control hash, in one pipeline; returns the
        number of records written. Redis trouble loses the round's records (counted)."""
        batch = [self._queue.popleft() for _ in range(len(self._queue))]
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for obs in batch:
                    record = build_record(obs)
                    if obs.job is not None and obs.tenant in self._contents_tenants:
                        assert self._fernet is not None
                        key = keys.capture_content_key(obs.request_id)
                        record["contents"] = key
                        pipe.set(key, seal_contents(obs.job, self._fernet), ex=self._ttl_s)
                    pipe.xadd(
                        keys.CAPTURE_STREAM,
                        {RECORD_FIELD: json.dumps(record, separators=(",", ":"))},
                        maxlen=self._max_len,
                        approximate=True,
                    )
                pipe.hgetall(keys.CAPTURE_CONTROL)
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._lose(len(batch))
            log.warning("capture write failed", records=len(batch), error=str(exc))
            return 0
        controlled = state_from_control(replies[-1] or {})
        self.state = controlled if controlled is not None else self._configured
        if self._metrics is not None and batch:
            self._metrics.captured.inc(len(batch))
        return len(batch)


def initial_state(rate: float, window_s: float, now_ms: float) -> CaptureState:
    """The state the settings ask for at start: `rate` for `window_s` (0: no end)."""
    return CaptureState(rate, now_ms + window_s * 1000 if window_s > 0 else math.inf)
