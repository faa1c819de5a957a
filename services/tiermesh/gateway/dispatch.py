"""The part of an inference the data plane runs once the request's job is built: answered
from the response cache, or refused while its class is shed, or routed and awaited until
its deadline; then the answer's metrics, statistics and, when the request is traced, its
span's facts. Exactly one answer (or refusal) per job; no proto types.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from tiermesh.core.errors import MeshError, deadline_exceeded, exhausted, unavailable
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.repository import ModelConfig
from tiermesh.gateway.adaptive_limit import AdaptiveLimits, is_late, queue_wait_ns
from tiermesh.gateway.cache import cache_digest
from tiermesh.gateway.capture import Observed
from tiermesh.gateway.facts import response_facts
from tiermesh.gateway.hop_spans import Hops, TracedPlacement
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PartialCallback, PendingRequests
from tiermesh.gateway.shedding import Shedder, ShedKey
from tiermesh.gateway.statistics import InferenceStatistics
from tiermesh.gateway.upstream import Upstream


@dataclass(frozen=True, slots=True)
class Answer:
    """One inference's outcome, for its door to turn into a response."""

    result: JobResult
    responded_ns: int
    cache_hit: bool = False


@dataclass(slots=True)
class Call:
    """What one inference has learnt so far, for its audit entry, statistics and capture."""

    request_id: str
    received_ns: int
    model: str = ""
    # The version the caller named ("" = the default one).
    version: str = ""
    tenant: str = ""
    variant: str = ""
    # For traffic capture: the job as routed and its result, when it got that far.
    job: Job | None = None
    result: JobResult | None = None
    cache_hit: bool = False
    # A traced request's span ids (its hop spans are written when the result is back).
    hops: Hops | None = None

    def part(self, request_id: str, model: str) -> Call:
        """Another job of the same call (plane.infer_many), with its own request id."""
        return Call(request_id, self.received_ns, model, self.version, self.tenant)

    def observed(self, code: str, ended_ns: int) -> Observed:
        return Observed(
            self.request_id,
            self.model,
            self.tenant,
            code,
            self.received_ns,
            ended_ns,
            self.job,
            self.result,
            self.cache_hit,
        )


def rows_of(result: JobResult) -> int:
    """The rows an answer holds (its first output's first dimension; 1 without one)."""
    return result.outputs[0].shape[0] if result.outputs and result.outputs[0].shape else 1


def _shed_key(job: Job) -> ShedKey:
    return (job.model, job.variant, job.priority)


class Dispatcher:
    """Owned by the data plane; `answer` is called once per job, inside its tenant's hold."""

    def __init__(
        self,
        upstream: Upstream,
        pending: PendingRequests,
        metrics: GatewayMetrics,
        statistics: InferenceStatistics,
        clock_ns: Callable[[], int],
        limits: AdaptiveLimits | None = None,
    ) -> None:
        self._up = upstream
        self._pending = pending
        self._metrics = metrics
        self._clock_ns = clock_ns
        self._shedder = Shedder()
        # None: only the gateway's fixed cap (TIERMESH_ADAPTIVE_LIMIT=false).
        self._limits = limits
        self.statistics = statistics
        self.draining = False
        # Requests placed on a queue, and those of them whose result reached the caller.
        self.accepted = 0
        self.answered = 0

    async def answer(
        self, cfg: ModelConfig, job: Job, call: Call, on_partial: PartialCallback | None
    ) -> Answer:
        """From the response cache, or routed and awaited; raises MeshError for a refusal
        or a failed result."""
        digest = self._cache_digest(cfg, job)
        lookup_ns = 0  # the cache's share of a miss (Triton's cache_miss duration)
        if digest is not None:
            looked = self._clock_ns()
            hit = await self._up.cache.get(cfg.name, digest)  # type: ignore[union-attr]
            lookup_ns = self._clock_ns() - looked
            self._metrics.cache_lookup(cfg.name, hit is not None)
            if hit is not None:
                return self._respond(
                    hit.with_(client_request_id=job.client_request_id, timing=job.timing),
                    cache_hit=True,
                )
            if self.draining:  # the drain may have begun while the cache answered
                raise unavailable("gateway is draining; retry on another replica")
        shed_ms = self._shedder.remaining_ms(_shed_key(job), self._clock_ns(), job.deadline_ns)
        if shed_ms:
            raise exhausted(
                f"model '{job.model}' is refusing priority {job.priority} work for now; "
                "retry later",
                shed_ms,
            )
        result, placed = await self._limited(cfg, job, on_partial, call.hops)
        if placed is not None:
            # The hop spans once the answer is on its way: a trace dir's file writes, or a
            # processor's work, are not the caller's wait, nor in the response's total_ms.
            asyncio.get_running_loop().call_soon(placed.write, result)
        call.variant = result.variant or call.variant
        call.result = result
        if result.code != grpc.StatusCode.OK:
            raise MeshError(result.code, result.message)
        # A canary's answer is not cached: it would reach stable-routed callers too.
        if digest is not None and result.controls.rollout_arm != "canary":
            put = self._clock_ns()
            await self._up.cache.put(cfg.name, digest, result, cfg.response_cache)  # type: ignore[union-attr]
            lookup_ns += self._clock_ns() - put
        if digest is not None:
            self.statistics.cache_miss(result.model, result.version, lookup_ns)
        return self._respond(result)

    def _respond(self, result: JobResult, cache_hit: bool = False) -> Answer:
        """The answer, counted; its time breakdown and facts also go on the request's span
        when the span is recorded (nothing is built for it otherwise)."""
        responded = self._clock_ns()
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(response_facts(result, responded, cache_hit))
        if cache_hit:
            received = result.timing.received_ns
            rows = rows_of(result)
            self.statistics.cache_hit(result.model, result.version, rows, received, responded)
        else:
            self.computed(result, responded)
        return Answer(result, responded, cache_hit)

    def computed(self, result: JobResult, responded_ns: int) -> None:
        """The latency histograms and statistics of an answer a worker computed (this
        gateway's, or one its front door answered: books.py)."""
        timing = result.timing
        self._metrics.timeline(result, result.priority, timing.breakdown_ms(responded_ns))
        batch = (result.worker, timing.batch_start_ns)
        self.statistics.computed(
            result.model,
            result.version,
            rows_of(result),
            timing,
            responded_ns,
            batch,
            result.batch_size,
        )

    def _cache_digest(self, cfg: ModelConfig, job: Job) -> str | None:
        """The response-cache key of a request, or None when the model does not cache."""
        spec = cfg.response_cache
        if not spec.enabled or self._up.cache is None:
            return None
        tenant = None if spec.shared_across_tenants else job.tenant
        return cache_digest(
            cfg.name, job.version, job.variant, tenant, job.inputs, job.requested_outputs
        )

    async def _limited(
        self, cfg: ModelConfig, job: Job, on_partial: PartialCallback | None, hops: Hops | None
    ) -> tuple[JobResult, TracedPlacement | None]:
        """`_await_result` within the adaptive limit of the job's (model, priority): refused
        at once beyond it; its wait in the work queue beyond one batch's compute
        (queue_wait_ns) teaches the limit. Generative
        models are not limited here: their schedulers admit by tokens and slots."""
        limits = self._limits
        if limits is None or cfg.generation is not None:
            return await self._await_result(job, on_partial, hops)
        key = (job.model, job.priority)
        budget_ns = job.deadline_ns - job.timing.received_ns if job.deadline_ns else 0
        retry_ms = limits.acquire(key, self._clock_ns(), budget_ns)
        if retry_ms:
            raise exhausted(
                f"model '{job.model}' has as many priority {job.priority} requests in flight "
                f"as it drains in time ({limits.limit(key, budget_ns)}); retry later",
                retry_ms,
            )
        wait_ns: int | None = None
        expired = False
        try:
            result, placed = await self._await_result(job, on_partial, hops)
            timing = result.timing
            if timing.batch_start_ns and timing.enqueued_ns:
                wait_ns = queue_wait_ns(timing)
            elif result.code == grpc.StatusCode.DEADLINE_EXCEEDED:  # expired in its queue
                wait_ns, expired = self._clock_ns() - job.timing.received_ns, True
            return result, placed
        except MeshError as err:
            if err.code == grpc.StatusCode.DEADLINE_EXCEEDED and err.retry_after_ms is None:
                wait_ns, expired = self._clock_ns() - job.timing.received_ns, True  # unanswered
            raise
        finally:
            limits.release(key, self._clock_ns(), wait_ns, is_late(wait_ns, budget_ns, expired))

    async def _await_result(
        self, job: Job, on_partial: PartialCallback | None, hops: Hops | None
    ) -> tuple[JobResult, TracedPlacement | None]:
        """Route the job and wait for its result until its deadline; exactly one answer
        (and, for `on_partial`, the pieces before it). With `hops` (a traced request), also
        where it was placed, for its hop spans; without an answer in time, the route span
        is written here."""
        future = self._pending.register(job.request_id, on_partial)
        # From the moment the job is queued for the router stream it may sit in a work
        # stream, even before the router's outcome is back: a caller who leaves from then on
        # is marked as gone.
        queued = False
        recorder = self._up.recorder
        try:
            try:
                queued = True
                began = self._clock_ns()
                routed_to = await self._up.router.route(job, self._remaining_s(job))
            except MeshError as err:
                if err.retry_after_ms is not None:  # no room or no time: shed this class
                    late = err.code == grpc.StatusCode.DEADLINE_EXCEEDED
                    key, now = _shed_key(job), self._clock_ns()
                    self._shedder.refused(key, err.retry_after_ms, now, late=late)
                raise
            self.accepted += 1
            placed = None
            if hops is not None:
                placed = hops.placed(routed_to.stream, routed_to.entry_id, began, self._clock_ns())
            if routed_to.shadow_request_id and recorder is not None:
                recorder.mirrored(routed_to.shadow_request_id, job.model, job.deadline_ns)
            try:
                result = await asyncio.wait_for(future, self._remaining_s(job))
                self.answered += 1
            except TimeoutError:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                if placed is not None:
                    placed.write(None)
                if recorder is not None:
                    recorder.answered(job.model, routed_to.version, code, job.timing.received_ns)
                raise deadline_exceeded("deadline exceeded while waiting for the result") from None
            if recorder is not None:
                version = result.version or routed_to.version
                recorder.answered(job.model, version, result.code, job.timing.received_ns)
                if routed_to.shadow_request_id:
                    recorder.primary(routed_to.shadow_request_id, result)
            # Delivered = back in the caller's handler (the Deliver call and the wake-up).
            return result.with_(timing=result.timing.with_(delivered_ns=self._clock_ns())), placed
        except asyncio.CancelledError:
            # wait_for cancels the future it waited on: a cancelled future has no answer.
            if queued and (not future.done() or future.cancelled()):
                # The caller gave up: tell the workers, so the request is not computed.
                ms_left = int(self._remaining_s(job) * 1000)
                await asyncio.shield(self._up.cancellations.mark(job.request_id, ms_left))
            raise
        finally:
            self._pending.discard(job.request_id)

    def _remaining_s(self, job: Job) -> float:
        return (job.deadline_ns - self._clock_ns()) / 1e9
