"""Public KServe v2 servicer and internal Delivery servicer of the gateway.

Methods stay short: convert, decide (requests.py), call upstream, convert back.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog
from opentelemetry import trace
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tiermesh.core import model_config
from tiermesh.core.errors import MeshError, deadline_exceeded, exhausted, unavailable
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.keys import compute_unit
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import Telemetry, extract, inject_current
from tiermesh.core.wire import result_from_proto
from tiermesh.gateway import converters
from tiermesh.gateway.cache import cache_digest
from tiermesh.gateway.capture import Capture, Observed
from tiermesh.gateway.generation import generation_of
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PartialCallback, PendingRequests
from tiermesh.gateway.requests import (
    InferRequest,
    effective_deadline_ns,
    find_model,
    priority_level,
    validate,
    variant_of,
)
from tiermesh.gateway.security import Gate
from tiermesh.gateway.shedding import Shedder, ShedKey
from tiermesh.gateway.statistics import InferenceStatistics
from tiermesh.gateway.upstream import Upstream
from tiermesh.rollout.recorder import Recorder, is_shadow
from tiermesh.rollout.split import ROLLOUT_ARM, STICKY_KEY
from tiermesh.v1 import delivery_pb2, delivery_pb2_grpc

log = structlog.get_logger("tiermesh.gateway")
SERVER_NAME = "tiermesh"
SERVER_VERSION = "0.1.0"


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        settings: GatewaySettings,
        repo: ModelRepository,
        upstream: Upstream,
        pending: PendingRequests,
        delivery_address: str,
        metrics: GatewayMetrics,
        gate: Gate,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._metrics = metrics
        self._gate = gate
        self._settings = settings
        self._delivery_address = delivery_address
        self._repo = repo
        self._up = upstream
        self._pending = pending
        self._clock_ns = clock_ns
        self.draining = False
        self._shedder = Shedder()
        # Triton's per-model statistics of this gateway's answers (ModelStatistics, REST).
        self.statistics = InferenceStatistics()
        # Requests placed on a queue, and those of them whose result reached the caller.
        self.accepted = 0
        self.answered = 0
        # Traffic capture (gateway/capture.py), set by __main__ when configured.
        self.capture: Capture | None = None

    @grpc_method
    async def ServerLive(self, request, context):  # type: ignore[no-untyped-def]
        return service_pb2.ServerLiveResponse(live=True)

    @grpc_method
    async def ServerReady(self, request, context):  # type: ignore[no-untyped-def]
        ready = not self.draining and await self._up.liveness.redis_ok()
        return service_pb2.ServerReadyResponse(ready=ready)

    @grpc_method
    async def ModelReady(self, request, context):  # type: ignore[no-untyped-def]
        self._gate.authorize(context.invocation_metadata(), request.name)
        cfg = self._repo.get(request.name)
        if cfg is None or cfg.version(request.version) is None or self.draining:
            return service_pb2.ModelReadyResponse(ready=False)
        variants = {t.variant or cfg.default_variant for t in cfg.tiers} or {cfg.default_variant}
        version = cfg.version(request.version) or cfg.stable
        live = [
            await self._up.liveness.workers(compute_unit(cfg.queue_model, v, version.version))
            for v in variants
        ]
        return service_pb2.ModelReadyResponse(ready=sum(live) > 0)

    @grpc_method
    async def ServerMetadata(self, request, context):  # type: ignore[no-untyped-def]
        return service_pb2.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=[]
        )

    @grpc_method
    async def ModelMetadata(self, request, context):  # type: ignore[no-untyped-def]
        self._gate.authorize(context.invocation_metadata(), request.name)
        return converters.model_metadata(find_model(self._repo, request.name, request.version))

    @grpc_method
    async def ModelConfig(self, request, context):  # type: ignore[no-untyped-def]
        self._gate.authorize(context.invocation_metadata(), request.name)
        return converters.model_config(find_model(self._repo, request.name, request.version))

    @grpc_method
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        answer = await self.infer(
            request.model_name, lambda: converters.infer_request(request), caller_of(context)
        )
        return converters.infer_response(answer.result, answer.responded_ns, answer.cache_hit)

    def is_generative(self, model_name: str) -> bool:
        cfg = self._repo.get(model_name)
        return cfg is not None and cfg.generation is not None

    async def infer(
        self,
        model_name: str,
        parse: Callable[[], InferRequest],
        caller: Caller,
        on_partial: PartialCallback | None = None,
    ) -> Answer:
        """The inference path of every transport (gRPC ModelInfer and ModelStreamInfer, the
        REST door): `parse` turns the transport's message into the domain request, after
        the caller's credentials were checked. Counts every answer by model and status code
        around `_infer`, and leaves its audit entry (when the port is authenticated).
        `on_partial` (a streaming caller) gets the pieces of a generative model's answer as
        they come, before the final answer is returned. Raises MeshError for every
        refusal."""
        call = _Call(request_id=uuid.uuid4().hex, received_ns=self._clock_ns(), model=model_name)
        model = model_name if self._repo.get(model_name) else "unknown"
        code = grpc.StatusCode.OK
        try:
            answer = await self._infer(parse, caller, call, on_partial)
            call.result, call.cache_hit = answer.result, answer.cache_hit
            return answer
        except MeshError as err:
            code = err.code
            raise
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            raise
        finally:
            self._metrics.answered(model, code)
            ended_ns = self._clock_ns()
            cfg = self._repo.get(model_name)
            if code != grpc.StatusCode.OK and cfg is not None:
                version = call.version or cfg.stable.version
                self.statistics.failed(cfg.name, version, call.received_ns, ended_ns)
            self._gate.audit(
                time_ms=ended_ns // 1_000_000,
                tenant=call.tenant,
                model=model_name,
                variant=call.variant,
                outcome=code.name,
                request_id=call.request_id,
                peer=caller.peer,
                duration_ms=(ended_ns - call.received_ns) / 1e6,
            )
            if self.capture is not None:
                self.capture.observe(call.observed(code.name, ended_ns))

    async def _infer(
        self,
        parse: Callable[[], InferRequest],
        caller: Caller,
        call: _Call,
        on_partial: PartialCallback | None,
    ) -> Answer:
        received_ns = call.received_ns
        if self.draining:
            raise unavailable("gateway is draining; retry on another replica")
        if len(self._pending) >= self._settings.max_in_flight:
            raise exhausted(
                f"too many requests in flight at this gateway ({self._settings.max_in_flight})",
                self._settings.retry_after_ms,
            )
        # Credentials and the model's name first: a caller without them learns nothing more.
        tenant = self._gate.authenticate(caller.metadata)
        call.tenant = tenant.name if tenant else ""
        self._gate.check_model(tenant, call.model)
        req = parse()
        cfg = find_model(self._repo, req.model, req.version)
        call.version = req.version
        validate(cfg, req)
        generation = None
        if cfg.generation is not None:
            stream = on_partial is not None
            params = dict(req.parameters)
            generation = generation_of(cfg.generation, req.inputs, params, call.request_id, stream)
        else:
            on_partial = None
        job = Job(
            request_id=call.request_id,
            client_request_id=req.client_request_id,
            tenant=call.tenant,
            model=cfg.name,
            # "" = the router picks (the default version, or a rollout's choice).
            version=req.version,
            inputs=req.inputs,
            gateway=self._delivery_address,
            priority=priority_level(cfg, req.priority),
            # The router picks the variant of the tier it chooses unless the caller named one.
            variant=req.variant and variant_of(cfg, req.variant),
            deadline_ns=effective_deadline_ns(
                received_ns,
                caller.time_remaining_s,
                req.timeout_us,
                cfg.generation.default_timeout_ms
                if cfg.generation
                else self._settings.default_timeout_ms,
            ),
            requested_outputs=req.requested_outputs,
            timing=Timing(received_ns=received_ns),
            trace_context=inject_current(),
            annotations={STICKY_KEY: req.sticky_key} if req.sticky_key else {},
            generation=generation,
        )
        call.variant = job.variant
        call.job = job
        structlog.contextvars.bind_contextvars(request_id=job.request_id, model=job.model)
        span = trace.get_current_span()
        span.set_attribute("tiermesh.request_id", job.request_id)
        span.set_attribute("tiermesh.client_request_id", job.client_request_id)
        if tenant is not None:
            span.set_attribute("tiermesh.tenant", tenant.name)
        async with self._gate.hold(tenant, job.request_id, job.deadline_ns):
            return await self._answer(cfg, job, call, on_partial)

    async def _answer(
        self,
        cfg: model_config.ModelConfig,
        job: Job,
        call: _Call,
        on_partial: PartialCallback | None = None,
    ) -> Answer:
        """From the response cache, or routed and awaited; the call counts against its
        tenant's limits meanwhile."""
        digest = self._cache_digest(cfg, job)
        lookup_ns = 0  # the cache's share of a miss (Triton's cache_miss duration)
        if digest is not None:
            looked = self._clock_ns()
            hit = await self._up.cache.get(cfg.name, digest)  # type: ignore[union-attr]
            lookup_ns = self._clock_ns() - looked
            self._metrics.cache.labels(cfg.name, "miss" if hit is None else "hit").inc()
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
        result = await self._await_result(job, on_partial)
        call.variant = result.variant or call.variant
        call.result = result
        if result.code != grpc.StatusCode.OK:
            raise MeshError(result.code, result.message)
        # A canary's answer is not cached: it would reach stable-routed callers too.
        if digest is not None and result.annotations.get(ROLLOUT_ARM) != "canary":
            put = self._clock_ns()
            await self._up.cache.put(cfg.name, digest, result, cfg.response_cache)  # type: ignore[union-attr]
            lookup_ns += self._clock_ns() - put
        if digest is not None:
            self.statistics.cache_miss(result.model, result.version, lookup_ns)
        return self._respond(result)

    def _respond(self, result: JobResult, cache_hit: bool = False) -> Answer:
        """The response; its time breakdown and facts also go on the request's span."""
        responded = self._clock_ns()
        span = trace.get_current_span()
        for key, value in converters.response_facts(result, responded, cache_hit).items():
            span.set_attribute(key, value)
        rows = result.outputs[0].shape[0] if result.outputs and result.outputs[0].shape else 1
        version = result.version
        if cache_hit:
            received = result.timing.received_ns
            self.statistics.cache_hit(result.model, version, rows, received, responded)
        else:
            self._metrics.timeline(result, result.priority, result.timing.breakdown_ms(responded))
            batch = (result.worker, result.timing.batch_start_ns)
            self.statistics.computed(
                result.model, version, rows, result.timing, responded, batch, result.batch_size
            )
        return Answer(result, responded, cache_hit)

    def _cache_digest(self, cfg: model_config.ModelConfig, job: Job) -> str | None:
        """The response-cache key of a request, or None when the model does not cache."""
        spec = cfg.response_cache
        if not spec.enabled or self._up.cache is None:
            return None
        tenant = None if spec.shared_across_tenants else job.tenant
        return cache_digest(
            cfg.name, job.version, job.variant, tenant, job.inputs, job.requested_outputs
        )

    async def _await_result(self, job: Job, on_partial: PartialCallback | None) -> JobResult:
        """Route the job and wait for its result until its deadline; exactly one answer
        (and, for `on_partial`, the pieces before it)."""
        future = self._pending.register(job.request_id, on_partial)
        # From the moment the Route call is out the job may sit in a stream, even before the
        # router's reply is back: a caller who leaves from then on is marked as gone.
        queued = False
        recorder = self._up.recorder
        try:
            try:
                queued = True
                routed_to = await self._up.router.route(job, self._remaining_s(job))
            except MeshError as err:
                if err.retry_after_ms is not None:  # no room or no time: shed this class
                    late = err.code == grpc.StatusCode.DEADLINE_EXCEEDED
                    key, now = _shed_key(job), self._clock_ns()
                    self._shedder.refused(key, err.retry_after_ms, now, late=late)
                raise
            self.accepted += 1
            if routed_to.shadow_request_id and recorder is not None:
                recorder.mirrored(routed_to.shadow_request_id, job.model, job.deadline_ns)
            try:
                result = await asyncio.wait_for(future, self._remaining_s(job))
                self.answered += 1
            except TimeoutError:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                if recorder is not None:
                    recorder.answered(job.model, routed_to.version, code, job.timing.received_ns)
                raise deadline_exceeded("deadline exceeded while waiting for the result") from None
            if recorder is not None:
                version = result.version or routed_to.version
                recorder.answered(job.model, version, result.code, job.timing.received_ns)
                if routed_to.shadow_request_id:
                    recorder.primary(routed_to.shadow_request_id, result)
            # Delivered = back in the caller's handler (the Deliver call and the wake-up).
            return result.with_(timing=result.timing.with_(delivered_ns=self._clock_ns()))
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


@dataclass
class _Call:
    """What one ModelInfer call has learnt so far, for its audit entry."""

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


@dataclass(frozen=True, slots=True)
class Caller:
    """What the inference path needs to know about a call, whatever its transport."""

    # Request headers as (lower-case name, value) pairs: the credentials are among them.
    metadata: Sequence[tuple[str, str | bytes]]
    # Seconds until the transport's own deadline (a gRPC deadline); None when it has none.
    time_remaining_s: float | None
    peer: str = ""


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    return Caller(
        tuple(context.invocation_metadata() or ()), context.time_remaining(), context.peer() or ""
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """One inference's outcome, for its transport to turn into a response."""

    result: JobResult
    responded_ns: int
    cache_hit: bool = False


def _shed_key(job: Job) -> ShedKey:
    return (job.model, job.variant, job.priority)


class DeliveryServicer(delivery_pb2_grpc.DeliveryServicer):
    """Postprocess calls Deliver with the finished results for this gateway's requests."""

    def __init__(
        self, pending: PendingRequests, telemetry: Telemetry, recorder: Recorder | None = None
    ) -> None:
        self._pending = pending
        self._tracer = telemetry.tracer
        self._recorder = recorder

    @grpc_method
    async def Deliver(self, request, context):  # type: ignore[no-untyped-def]
        resolved = late = 0
        for msg in request.results:
            result = result_from_proto(msg)
            if result.partial:  # a piece of a streamed answer: no span per token
                if self._pending.resolve(result):
                    resolved += 1
                else:
                    late += 1
                continue
            if is_shadow(result):  # a canary's answer to a mirrored copy: nobody waits
                if self._recorder is not None:
                    self._recorder.shadow(result)
                continue
            with self._tracer.start_as_current_span(
                "deliver", context=extract(result.trace_context)
            ) as span:
                span.set_attribute("tiermesh.request_id", result.request_id)
                if self._pending.resolve(result):
                    resolved += 1
                else:
                    late += 1
                    log.info("late result dropped", request_id=result.request_id)
        return delivery_pb2.DeliverReply(resolved=resolved, late=late)
