"""The gateway's one data plane: what every door (gRPC unary and stream, REST, batch jobs)
asks of the gateway, over domain values; the doors only convert their transport's messages.

`infer` is the one inference path: model control, draining and in-flight limits, the
caller's credentials, validation against the model's metadata, the job, then the response
cache or the router and the wait for the result (dispatch.py). Around it every call is
counted by model and status code, failed calls in Triton's statistics, and, only when they
are on, audited (an authenticated port), captured (a sampled request) and traced (a recorded
span): what is off builds nothing per request.

The other operations are the metadata the doors serve: readiness, server and model
metadata (the model's config; each door renders it), statistics, the repository index and
model control. No proto types here (DESIGN.md, Style).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import redis.asyncio as aioredis
import structlog
from opentelemetry import trace

from tiermesh.core.errors import (
    MAX_RECORDED_NAME,
    MeshError,
    exhausted,
    invalid,
    status_of,
    unavailable,
    unknown_model,
)
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import CallerTraces, trace_id_of, unsampled, w3c_context
from tiermesh.core.tenants import Tenant
from tiermesh.core.validation import Screen, check_tensor
from tiermesh.gateway.adaptive_limit import AdaptiveLimits
from tiermesh.gateway.audit import INFER
from tiermesh.gateway.capture import Capture
from tiermesh.gateway.control import ModelControl, check_allowed
from tiermesh.gateway.dispatch import Answer, Call, Dispatcher
from tiermesh.gateway.door_plans import DoorPlans
from tiermesh.gateway.generation import generation_of
from tiermesh.gateway.hop_spans import HopSpans
from tiermesh.gateway.live_providers import LiveProviders, parameter_value
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
from tiermesh.gateway.security import AccessGate
from tiermesh.gateway.statistics import InferenceStatistics, model_stats_doc
from tiermesh.gateway.statistics_store import StatisticsStore
from tiermesh.gateway.upstream import Upstream

__all__ = ["SERVER", "Answer", "Caller", "DataPlane", "ServerInfo"]

log = structlog.get_logger("tiermesh.gateway")


@dataclass(frozen=True, slots=True)
class Caller:
    """What the data plane needs to know about a call, whatever its door."""

    # Request headers as (lower-case name, value) pairs: the credentials are among them.
    metadata: Sequence[tuple[str, str | bytes]]
    # Seconds until the transport's own deadline (a gRPC deadline); None when it has none.
    time_remaining_s: float | None
    peer: str = ""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    name: str
    version: str
    # Triton's names of the protocol extensions this server has.
    extensions: tuple[str, ...]


T = TypeVar("T")

SERVER = ServerInfo(
    "tiermesh",
    "0.1.0",
    ("binary_tensor_data", "model_configuration", "model_repository", "parameters", "statistics"),
)


class DataPlane:
    """One per gateway, built by its __main__ and shared by every door."""

    def __init__(
        self,
        settings: GatewaySettings,
        repo: ModelRepository,
        upstream: Upstream,
        pending: PendingRequests,
        delivery_address: str,
        metrics: GatewayMetrics,
        gate: AccessGate,
        *,
        control: ModelControl,
        control_enabled: bool,
        stats: StatisticsStore | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        hop_spans: HopSpans | None = None,
        caller_traces: CallerTraces | None = None,
    ) -> None:
        self._settings = settings
        self._repo = repo
        self._up = upstream
        self._pending = pending
        self._delivery_address = delivery_address
        self._metrics = metrics
        self._gate = gate
        self._clock_ns = clock_ns
        self.control = control
        self._control_enabled = control_enabled
        # The mesh's statistics (every gateway's, through Redis); None: this gateway's only.
        self._stats = stats
        # Triton's per-model statistics of this gateway's answers (ModelStatistics, REST).
        self.statistics = stats.statistics if stats is not None else InferenceStatistics()
        # Where the gateway exports: a traced request's spans of the hops after this one.
        self._hop_spans = hop_spans
        # How many calls a second a caller's sampled traceparent is followed (None: all).
        self._caller_traces = caller_traces
        limits = None
        if settings.adaptive_limit:
            limits = AdaptiveLimits(
                settings.max_in_flight, settings.target_wait_ms, settings.retry_after_ms
            )
            metrics.watch_limits(limits)
        self._dispatch = Dispatcher(upstream, pending, metrics, self.statistics, clock_ns, limits)
        self._door_plans = DoorPlans(repo, settings.model_control == "explicit")
        # Traffic capture (gateway/capture.py), set by __main__ when configured.
        self.capture: Capture | None = None
        # The providers live workers' sessions got (ModelConfig), set by __main__.
        self.live_providers: LiveProviders | None = None

    @property
    def draining(self) -> bool:
        """Set as the drain begins (`drain`): new requests are refused UNAVAILABLE."""
        return self._dispatch.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._dispatch.draining = value

    async def drain(self, grace_s: float) -> None:
        """Called once as the gateway stops, after its health went NOT_SERVING: new requests
        are refused from now on; returns once the pending ones were answered, or `grace_s`
        passed."""
        log.info("gateway draining", pending=len(self._pending))
        self.draining = True
        try:
            await asyncio.wait_for(self._pending.wait_empty(), grace_s)
        except TimeoutError:
            log.warning("drain grace passed with requests pending", pending=len(self._pending))

    def counters(self) -> dict[str, object]:
        """What the gateway says as it stops."""
        return {
            "accepted": self.accepted,
            "answered": self.answered,
            "late_results": self._pending.late,
            "router_jobs": self._up.router.jobs,
            "router_batches": self._up.router.batches,
        }

    @property
    def dispatcher(self) -> Dispatcher:
        """For the books of calls the front door answered (books.py)."""
        return self._dispatch

    @property
    def accepted(self) -> int:
        """Requests placed on a queue."""
        return self._dispatch.accepted

    @property
    def answered(self) -> int:
        """Requests placed on a queue whose result reached the caller."""
        return self._dispatch.answered

    # -- inference ----------------------------------------------------------------------

    async def infer(
        self,
        model_name: str,
        parse: Callable[[Screen], InferRequest],
        caller: Caller,
        on_partial: PartialCallback | None = None,
    ) -> Answer:
        """The inference path of every door: `parse` turns the door's message into the
        domain request, after the caller's credentials and quota were checked, calling the
        Screen it is given with each input before it builds the input's contents. `on_partial` (a
        streaming caller) gets the pieces of a generative model's answer as they come,
        before the final answer is returned. Raises MeshError for every refusal; whatever
        the outcome, the call is counted once."""
        return await self._counted(
            model_name, caller, lambda call: self._infer(parse, caller, call, on_partial)
        )

    async def _counted(
        self, model_name: str, caller: Caller, work: Callable[[Call], Awaitable[T]]
    ) -> T:
        """One call of a door, whatever its outcome counted once (and audited, captured)."""
        await self._catch_up(model_name)
        call = Call(request_id=uuid.uuid4().hex, received_ns=self._clock_ns(), model=model_name)
        model = model_name if self._repo.get(model_name) else "unknown"
        code = grpc.StatusCode.OK
        try:
            return await work(call)
        except BaseException as exc:
            code = status_of(exc)
            raise
        finally:
            self._ended(call, caller, model, code)

    def refused_unread(self, caller: Caller, operation: str, model: str, err: MeshError) -> None:
        """A call its door refused before reading its body (the REST door checks the key
        first): counted and audited as the plane counts and audits the calls it refuses
        (`operation` "": a call that leaves no audit entry)."""
        if operation == INFER:
            call = Call(request_id=uuid.uuid4().hex, received_ns=self._clock_ns(), model=model)
            self._ended(call, caller, model if self._repo.get(model) else "unknown", err.code)
        elif operation and self._gate.enabled:
            self._gate.audit(
                operation=operation,
                time_ms=self._clock_ns() // 1_000_000,
                tenant="",
                model=model,
                variant="",
                outcome=err.code.name,
                request_id="",
                peer=caller.peer,
                duration_ms=0.0,
            )

    def _ended(self, call: Call, caller: Caller, model: str, code: grpc.StatusCode) -> None:
        """The call's counts, its audit entry (an authenticated port) and its capture (a
        sampled request)."""
        self._metrics.answered(model, code)
        ok = code == grpc.StatusCode.OK
        capture = self.capture
        sampled = capture is not None and capture.sampled()
        if ok and not sampled and not self._gate.enabled:
            return
        ended_ns = self._clock_ns()
        cfg = self._repo.get(call.model)
        if not ok and cfg is not None:
            version = cfg.version_for(call.version)
            self.statistics.failed(cfg.name, version, call.received_ns, ended_ns)
        if self._gate.enabled:
            self._gate.audit(
                time_ms=ended_ns // 1_000_000,
                tenant=call.tenant,
                model=call.model,
                variant=call.variant,
                outcome=code.name,
                request_id=call.request_id,
                peer=caller.peer,
                duration_ms=(ended_ns - call.received_ns) / 1e6,
            )
        if sampled and capture is not None:
            capture.keep(call.observed(code.name, ended_ns))

    async def _infer(
        self,
        parse: Callable[[Screen], InferRequest],
        caller: Caller,
        call: Call,
        on_partial: PartialCallback | None,
    ) -> Answer:
        tenant, known, held_until_ns = self._admit(caller, call)
        async with self._gate.hold(tenant, call.request_id, held_until_ns):
            # A tensor the model would refuse is refused from its shape, before it is built.
            req = parse(lambda name, datatype, shape: check_tensor(known, name, datatype, shape))
            cfg, job = self._checked_job(req, call, caller, on_partial is not None)
            if cfg.generation is None:
                on_partial = None
            self._bind(job, tenant)
            answer = await self._dispatch.answer(cfg, job, call, on_partial)
            call.result, call.cache_hit = answer.result, answer.cache_hit
            return answer

    async def infer_many(
        self,
        model_name: str,
        parse: Callable[[Callable[[str], Screen]], Sequence[InferRequest]],
        caller: Caller,
    ) -> list[Answer]:
        """One call of several jobs (the OpenAI embeddings door: a list's rows, grouped by
        length): the call's checks once (credentials, quota, its slot), then each request
        validated and routed as a job of its own, all at once. `parse` gets the Screen of a
        model by name (a request may name the model's companion). Answers come in the order
        of `parse`'s requests; the first refusal cancels the other jobs and is the call's.
        Counted, audited and captured as one call."""
        return await self._counted(
            model_name, caller, lambda call: self._infer_many(parse, caller, call)
        )

    async def _infer_many(
        self,
        parse: Callable[[Callable[[str], Screen]], Sequence[InferRequest]],
        caller: Caller,
        call: Call,
    ) -> list[Answer]:
        tenant, _, held_until_ns = self._admit(caller, call)
        async with self._gate.hold(tenant, call.request_id, held_until_ns):
            reqs = parse(self._screen)
            if not reqs:
                raise invalid("nothing to infer")
            work = []
            for i, req in enumerate(reqs):
                if req.model != call.model and self._companion_of(req.model) != call.model:
                    # The caller's key was checked for the model it named, and its companions.
                    raise invalid(f"model '{req.model}' is not a part of '{call.model}'")
                part = call if i == 0 else call.part(uuid.uuid4().hex, req.model)
                cfg, job = self._checked_job(req, part, caller, False)
                work.append((cfg, job, part))
            self._bind(work[0][1], tenant)
            tasks = [
                asyncio.ensure_future(self._dispatch.answer(cfg, job, part, None))
                for cfg, job, part in work
            ]
            try:
                answers = list(await asyncio.gather(*tasks))
                call.result = answers[-1].result
                return answers
            finally:
                # After a refusal the others are still on their way: their callers left.
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _companion_of(self, model_name: str) -> str:
        cfg = self._repo.get(model_name)
        return cfg.companion_of if cfg is not None else ""

    def _screen(self, model_name: str) -> Screen:
        cfg = self._repo.get(model_name)
        if cfg is None:
            raise unknown_model(model_name)
        return lambda name, datatype, shape: check_tensor(cfg, name, datatype, shape)

    async def _catch_up(self, model_name: str) -> None:
        known = self._repo.get(model_name)
        if known is None or not self.control.is_served(known):
            # Another gateway may have loaded it just now: look (one GET) before refusing.
            await self.control.watch.catch_up()

    def _admit(self, caller: Caller, call: Call) -> tuple[Tenant | None, ModelConfig, int]:
        """The checks before a call's body is read: draining, this gateway's in-flight cap,
        credentials, the model; the caller's tenant, the model's config and the deadline of
        the tenant's slot."""
        if self.draining:
            raise unavailable("gateway is draining; retry on another replica")
        if len(self._pending) >= self._settings.max_in_flight:
            raise exhausted(
                f"too many requests in flight at this gateway ({self._settings.max_in_flight})",
                self._settings.retry_after_ms,
            )
        # Credentials and the model's name first: a caller without them learns nothing more.
        tenant = self._gate.authenticate(caller.metadata, caller.peer)
        call.tenant = tenant.name if tenant else ""
        self._gate.check_model(tenant, call.model)
        self._gate.check_audit_room()
        known = self._repo.get(call.model)
        if known is None:
            raise unknown_model(call.model)
        # The tenant's quota next, before the request is read: every call takes a token,
        # valid or not, and the in-flight slot bounds what a tenant's calls hold at once.
        # The slot's deadline is the call's without its `timeout` parameter (not yet read):
        # a longer one outlives its slot's safety expiry, never the other way.
        held_until_ns = effective_deadline_ns(
            call.received_ns, caller.time_remaining_s, None, self._default_timeout_ms(known)
        )
        return tenant, known, held_until_ns

    def _checked_job(
        self, req: InferRequest, call: Call, caller: Caller, stream: bool
    ) -> tuple[ModelConfig, Job]:
        """The job of a parsed request, once checked against its model and version."""
        known = self._repo.get(req.model)
        if known is None:
            raise unknown_model(req.model)
        self.control.check_served(known, req.version)
        cfg = find_model(self._repo, req.model, req.version)
        call.version = req.version
        validate(cfg, req)
        span = trace.get_current_span()
        if self._hop_spans is not None and self._hop_spans.exporting and span.is_recording():
            call.hops = self._hop_spans.choose(span.get_span_context())
        job = self._job(cfg, req, call, caller, stream)
        call.variant = job.variant
        call.job = job
        return cfg, job

    def _bind(self, job: Job, tenant: Tenant | None) -> None:
        """The request's ids in its logs and on its span."""
        span = trace.get_current_span()
        bound = {"request_id": job.request_id, "model": job.model}
        if not span.get_span_context().is_valid and (tid := trace_id_of(job.trace_context)):
            bound["trace_id"] = tid  # no span here: the logs still name the caller's trace
        structlog.contextvars.bind_contextvars(**bound)
        if span.is_recording():
            span.set_attribute("tiermesh.request_id", job.request_id)
            span.set_attribute(
                "tiermesh.client_request_id", job.client_request_id[:MAX_RECORDED_NAME]
            )
            if tenant is not None:
                span.set_attribute("tiermesh.tenant", tenant.name)

    def _default_timeout_ms(self, cfg: ModelConfig) -> int:
        """The wait of a call that names none (no gRPC deadline, no `timeout`)."""
        if cfg.generation is not None:
            return cfg.generation.default_timeout_ms
        return self._settings.default_timeout_ms

    def _job(
        self, cfg: ModelConfig, req: InferRequest, call: Call, caller: Caller, stream: bool
    ) -> Job:
        """The internal job of a validated request."""
        generation = None
        if cfg.generation is not None:
            params = dict(req.parameters)
            generation = generation_of(
                cfg.generation,
                req.inputs,
                params,
                call.request_id,
                stream,
                req.messages,
                req.raw_prompt,
            )
        received_ns = call.received_ns
        return Job(
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
            variant=req.variant and variant_of(cfg, req.variant, req.version),
            deadline_ns=effective_deadline_ns(
                received_ns,
                caller.time_remaining_s,
                req.timeout_us,
                self._default_timeout_ms(cfg),
            ),
            requested_outputs=req.requested_outputs,
            timing=Timing(received_ns=received_ns),
            trace_context=self._trace_context(call, caller),
            controls=req.controls,
            generation=generation,
        )

    def _trace_context(self, call: Call, caller: Caller) -> dict[str, str]:
        """What the job carries downstream: a traced request's route span (chosen now,
        written by the hop spans), else the caller's own context, if any, sampled only
        where this gateway's sampler followed it (or, with no span here, within the rate
        of caller traces): a caller's flag alone does not make every hop record."""
        if call.hops is not None:
            return call.hops.carrier()
        carrier = w3c_context(caller.metadata)
        if not carrier:
            return carrier
        here = trace.get_current_span().get_span_context()
        if here.is_valid:
            return carrier if here.trace_flags.sampled else unsampled(carrier)
        return self._caller_traces.carrier(carrier) if self._caller_traces else carrier

    def is_generative(self, model_name: str) -> bool:
        cfg = self._repo.get(model_name)
        return cfg is not None and cfg.generation is not None

    # -- metadata -----------------------------------------------------------------------

    async def server_ready(self) -> bool:
        return not self.draining and await self._up.liveness.redis_ok()

    def server_metadata(self) -> ServerInfo:
        return SERVER

    def authenticate(self, caller: Caller) -> Tenant | None:
        """The caller's tenant (None when auth is off), or UNAUTHENTICATED."""
        return self._gate.authenticate(caller.metadata, caller.peer)

    def authorize(self, caller: Caller, model: str) -> Tenant | None:
        """The caller's tenant, or UNAUTHENTICATED / PERMISSION_DENIED for `model`."""
        return self._gate.authorize(caller.metadata, caller.peer, model)

    def find(self, name: str, version: str = "") -> ModelConfig:
        """The model's config; NOT_FOUND for an unknown model or version."""
        return find_model(self._repo, name, version)

    def config(self, name: str) -> ModelConfig | None:
        return self._repo.get(name)

    def models(self) -> list[ModelConfig]:
        """Every model of the repository (companions included)."""
        return list(self._repo.configs.values())

    @property
    def metrics(self) -> GatewayMetrics:
        return self._metrics

    def model(self, caller: Caller, name: str, version: str) -> ModelConfig:
        """ModelMetadata and ModelConfig: the config of a model the caller may use."""
        self.authorize(caller, name)
        return self.find(name, version)

    def direct_plan(self, cfg: ModelConfig) -> str:
        """The front door's placement plan for the model (core/direct_plan.py), as JSON."""
        return self._door_plans.parameter(cfg)

    async def providers_live(self, cfg: ModelConfig, version: str) -> str | None:
        """ModelConfig's `execution_providers_live` (live_providers.py) of the model in
        `version` ("" = the default one), as JSON; None when unknown (no reader, or Redis
        unreadable): both doors then answer without it."""
        if self.live_providers is None:
            return None
        counts = await self.live_providers.read(cfg, version)
        return None if counts is None else parameter_value(counts)

    async def model_ready(self, caller: Caller, name: str, version: str) -> bool:
        """ModelReady: loaded (model control) and served by a live worker."""
        self.authorize(caller, name)
        cfg = self._repo.get(name)
        if cfg is None or self.draining:
            return False
        return await self.control.ready(cfg, version)

    def visible(self, caller: Caller) -> list[ModelConfig]:
        """The models the caller may use (all of them when the port is unauthenticated)."""
        tenant = self.authenticate(caller)
        models = list(self._repo.configs.values())
        if tenant is None or tenant.models is None:
            return models
        return [cfg for cfg in models if cfg.name in tenant.models]

    async def statistics_docs(
        self, caller: Caller, name: str, version: str
    ) -> list[dict[str, Any]]:
        """Triton's model_stats entries: of every model the caller may use ("" name), or of
        one model (every version, or the named one). Only to an admin where keys are on."""
        self._gate.check_statistics(self.authenticate(caller))
        if name:
            models = [self.model(caller, name, version)]
        else:
            if version:
                raise invalid("a version needs a model name")
            models = sorted(self.visible(caller), key=lambda c: c.name)
        wanted = [
            (cfg.name, v)
            for cfg in models
            for v in ([version] if version else [ver.version for ver in cfg.versions])
        ]
        if self._stats is None:
            figures = {key: self.statistics.of(*key) for key in wanted}
        else:
            try:
                figures = await self._stats.read(wanted)
            except (aioredis.RedisError, OSError):
                raise unavailable("statistics unavailable (redis down or loading)") from None
        return [model_stats_doc(m, v, figures[(m, v)]) for m, v in wanted]

    async def index_docs(self, caller: Caller, ready_only: bool) -> list[dict[str, str]]:
        """Triton's repository index of the models the caller may use."""
        return await self.control.index(self.visible(caller), ready_only)

    async def load(self, caller: Caller, name: str, version: str = "") -> None:
        await self.audited(caller, "load", name, lambda: self._control(caller, name, version))

    async def unload(self, caller: Caller, name: str, version: str = "") -> None:
        await self.audited(
            caller, "unload", name, lambda: self._control(caller, name, version, load=False)
        )

    async def _control(self, caller: Caller, name: str, version: str, load: bool = True) -> None:
        check_allowed(self._control_enabled, self._gate.enabled, self.authenticate(caller))
        await (self.control.load if load else self.control.unload)(name, version)

    async def audited(
        self,
        caller: Caller,
        operation: str,
        model: str,
        work: Callable[[], Awaitable[T]],
        request_id: str = "",
    ) -> T:
        """`work` (an operation other than ModelInfer: model control, a batch-job call),
        with its audit entry whatever the outcome, on a port with API keys; refused while
        the audit log cannot be written."""
        if not self._gate.enabled:
            return await work()
        started_ns = self._clock_ns()
        code = grpc.StatusCode.OK
        tenant = None
        try:
            tenant = self.authenticate(caller)
            self._gate.check_audit_room()
            return await work()
        except BaseException as exc:
            code = status_of(exc)
            raise
        finally:
            ended_ns = self._clock_ns()
            self._gate.audit(
                operation=operation,
                time_ms=ended_ns // 1_000_000,
                tenant=tenant.name if tenant else "",
                model=model,
                variant="",
                outcome=code.name,
                request_id=request_id[:MAX_RECORDED_NAME],
                peer=caller.peer,
                duration_ms=(ended_ns - started_ns) / 1e6,
            )
