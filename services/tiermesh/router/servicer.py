"""The Router servicer: Route(job) -> stream entry, or a refusal with its status code."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import grpc
import redis.asyncio as aioredis
import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.errors import (
    MeshError,
    deadline_exceeded,
    exhausted,
    invalid,
    unavailable,
    unknown_model,
)
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.core.jobs import Job
from tiermesh.core.keys import StreamKey, stream_keys
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import RouterSettings
from tiermesh.core.telemetry import Telemetry, inject_current
from tiermesh.core.tier_spec import TierSpec
from tiermesh.core.wire import encode_job, job_from_proto
from tiermesh.generate.inputs import GenerationInputError
from tiermesh.generate.tensors import prompt_of
from tiermesh.rollout.cache import RolloutStates
from tiermesh.rollout.split import ROLLOUT_ARM, SHADOW_OF, Placement, place
from tiermesh.router.admission import Admission, Admitter
from tiermesh.router.metrics import RouterMetrics
from tiermesh.router.policy import DEFAULT_TIER, choose_stream, job_length
from tiermesh.router.prompt import PromptEncoder
from tiermesh.router.text import TextEncoder
from tiermesh.router.tiers import choose_tier
from tiermesh.v1 import router_pb2, router_pb2_grpc

log = structlog.get_logger("tiermesh.router")


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(
        self,
        settings: RouterSettings,
        repo: ModelRepository,
        admitter: Admitter,
        encoders: Mapping[str, TextEncoder],
        telemetry: Telemetry,
        metrics: RouterMetrics,
        clock_ns: Callable[[], int] = time.time_ns,
        rollouts: RolloutStates | None = None,
        control: ControlWatch | None = None,
        prompts: Mapping[str, PromptEncoder] | None = None,
    ) -> None:
        # Generative models' chat template and tokenizer, by model name.
        self._prompts = prompts if prompts is not None else {}
        self._rollouts = rollouts
        self._control = control
        self._settings = settings
        self._repo = repo
        self._admitter = admitter
        self._encoders = encoders
        self._metrics = metrics
        self._tracer = telemetry.tracer
        self._clock_ns = clock_ns

    @grpc_method
    async def Route(self, request, context):  # type: ignore[no-untyped-def]
        job = job_from_proto(request)
        structlog.contextvars.bind_contextvars(request_id=job.request_id, model=job.model)
        cfg = self._repo.get(job.model)
        if cfg is None and self._control is not None:
            await self._control.catch_up()  # loaded into the repository just now?
            cfg = self._repo.get(job.model)
        if cfg is None:
            raise unknown_model(job.model)
        now = self._clock_ns()
        if job.deadline_ns and now >= job.deadline_ns:
            raise deadline_exceeded("deadline passed before the request was queued")
        if cfg.tokenize is not None:
            job = self._tokenize(cfg.name, job)
        if cfg.generation is not None:
            job = self._prompt(cfg.name, job)
        job, placement = self._version(cfg, job)
        await self._check_loaded(cfg, job.version)
        job, tier = await self._place(cfg, job, now)
        stream = choose_stream(cfg, job, tier)
        with self._tracer.start_as_current_span(
            f"{stream.name} publish", kind=SpanKind.PRODUCER
        ) as span:
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.operation.type", "send")
            span.set_attribute("messaging.destination.name", stream.name)
            span.set_attribute("tiermesh.request_id", job.request_id)
            carrier = inject_current()
            job = dataclasses.replace(
                job,
                priority=stream.priority,
                bucket=stream.bucket,
                tier=stream.tier,
                timing=job.timing.with_(routed_ns=now, enqueued_ns=self._clock_ns()),
                trace_context=carrier,
            )
            try:
                admission = await self._admitter.admit(
                    stream,
                    cfg.queue_bound,
                    encode_job(job),
                    carrier,
                    request_id=job.request_id,
                    model_streams=model_streams(cfg, stream),
                    model_bound=cfg.model_queue_bound,
                    ms_left=(job.deadline_ns - now) // 1_000_000 if job.deadline_ns else -1,
                )
            except (aioredis.RedisError, OSError) as exc:
                log.warning("redis unavailable", error=repr(exc))
                raise unavailable("queue unavailable (redis down or loading)") from None
            span.set_attribute("tiermesh.admission", admission.outcome)
        self._metrics.admissions.labels(cfg.name, admission.outcome).inc()
        if admission.outcome == "noworker":
            raise unavailable(f"no live worker for model '{cfg.name}' on tier '{stream.tier}'")
        shadow_id = ""
        if admission.outcome == "dup":  # a retry of a request already queued: same answer
            log.info("request already queued", entry_id=admission.detail)
        elif admission.outcome != "ok":
            raise refusal(cfg, admission, self._settings.retry_after_ms)
        elif placement.shadow_version and (
            self._control is None or self._control.state.served(cfg, placement.shadow_version)
        ):
            shadow_id = await self._mirror(cfg, job, tier, placement.shadow_version, now)
        return router_pb2.RouteReply(
            stream=stream.name,
            entry_id=admission.detail,
            version=job.version,
            shadow_request_id=shadow_id,
        )

    def _version(self, cfg: ModelConfig, job: Job) -> tuple[Job, Placement]:
        """The version that serves the job: its own, or the rollout's choice (from the
        cached rollout state: no Redis call here)."""
        state = self._rollouts.get(cfg.queue_model) if self._rollouts is not None else None
        placement = place(cfg.stable.version, state, job)
        annotations = job.annotations
        if placement.arm in ("stable", "canary"):
            annotations = {**annotations, ROLLOUT_ARM: placement.arm}
        job = dataclasses.replace(job, version=placement.version, annotations=annotations)
        return job, placement

    async def _check_loaded(self, cfg: ModelConfig, version: str) -> None:
        """UNAVAILABLE for a model or version unloaded through model control (as last
        read by the control watch: no Redis call unless it says unloaded)."""
        if self._control is None or self._control.state.served(cfg, version):
            return
        await self._control.catch_up()  # loaded again just now?
        if not self._control.state.served(cfg, version):
            raise unavailable(
                f"model '{cfg.name}' version {version} is not loaded (unloaded through "
                "model control); load it again to serve it"
            )

    async def _mirror(self, cfg: ModelConfig, job: Job, tier: str, canary: str, now: int) -> str:
        """A copy of the (queued) job for the canary, to compare outputs; its answer goes to
        the same gateway, marked. Best effort: the shadow's id, or "" when not queued."""
        shadow = dataclasses.replace(
            job,
            request_id=f"{job.request_id}-shadow",
            version=canary,
            annotations={**job.annotations, SHADOW_OF: job.request_id, ROLLOUT_ARM: "shadow"},
        )
        stream = choose_stream(cfg, shadow, tier)
        try:
            admission = await self._admitter.admit(
                stream,
                cfg.queue_bound,
                encode_job(shadow),
                dict(job.trace_context),
                request_id=shadow.request_id,
                ms_left=(job.deadline_ns - now) // 1_000_000 if job.deadline_ns else -1,
            )
        except (aioredis.RedisError, OSError):
            return ""
        self._metrics.admissions.labels(cfg.name, f"shadow_{admission.outcome}").inc()
        return shadow.request_id if admission.outcome == "ok" else ""

    async def _place(self, cfg: ModelConfig, job: Job, now: int) -> tuple[Job, str]:
        """The tier (and, unless the caller named one, the variant) that serves the job."""
        if not cfg.tiers:
            variant = job.variant or cfg.default_variant
            return dataclasses.replace(job, variant=variant), DEFAULT_TIER
        candidates = [tier_stream(cfg, job, t) for t in cfg.tiers]
        try:
            states = await self._admitter.tier_states(candidates)
        except (aioredis.RedisError, OSError):
            raise unavailable("queue unavailable (redis down or loading)") from None
        ms_left = (job.deadline_ns - now) / 1e6 if job.deadline_ns else None
        tier = choose_tier(cfg.tiers, job_cost(cfg, job), ms_left, states)
        if tier is None:
            tiers = ", ".join(t.name for t in cfg.tiers)
            raise unavailable(f"no live worker for model '{cfg.name}' on any tier ({tiers})")
        variant = job.variant or tier.variant or cfg.default_variant
        trace.get_current_span().set_attribute("tiermesh.tier", tier.name)
        return dataclasses.replace(job, variant=variant), tier.name

    def _prompt(self, model: str, job: Job) -> Job:
        """A generative request's prompt, templated and tokenized; INVALID_ARGUMENT when it
        does not fit the context."""
        encoder = self._prompts.get(model)
        if encoder is None or job.generation is None:
            raise unavailable(f"model '{model}': its tokenizer is not loaded on this router")
        with self._tracer.start_as_current_span("tokenize") as span:
            try:
                ids = encoder.encode(prompt_of(job.inputs), job.generation.max_new_tokens)
            except GenerationInputError as exc:
                raise invalid(str(exc)) from None
            span.set_attribute("tiermesh.tokens", ids.shape[1])
        annotations = {**job.annotations, "prompt_tokens": str(ids.shape[1])}
        return dataclasses.replace(job, inputs=(ids,), annotations=annotations)

    def _tokenize(self, model: str, job: Job) -> Job:
        """Text in, token ids and attention mask out; `truncated` goes back to the caller."""
        with self._tracer.start_as_current_span("tokenize") as span:
            (ids, mask), truncated = self._encoders[model].encode_tensor(job.inputs[0])
            span.set_attribute("tiermesh.tokens", ids.shape[1])
            span.set_attribute("tiermesh.truncated", truncated)
        annotations = {**job.annotations, "truncated": "true" if truncated else "false"}
        return dataclasses.replace(job, inputs=(ids, mask), annotations=annotations)


def model_streams(cfg: ModelConfig, stream: StreamKey) -> list[StreamKey]:
    """Every stream of the stream's compute unit on its tier (for the model-wide bound)."""
    if cfg.model_queue_bound <= 0:
        return []
    return stream_keys(stream.model, stream.tier, cfg.priority_levels, cfg.bucket_count)


def refusal(cfg: ModelConfig, admission: Admission, retry_after_ms: int) -> MeshError:
    """The status a refused admission answers with (DESIGN.md's table)."""
    if admission.outcome == "noworker":
        return unavailable(f"no live worker for model '{cfg.name}'")
    if admission.outcome == "late":
        return MeshError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the queue ahead needs ~{admission.detail} ms, more than the request's deadline "
            "leaves",
            retry_after_ms=int(admission.detail),
        )
    what = "queue" if admission.outcome == "full" else "model's queues"
    bound = cfg.queue_bound if admission.outcome == "full" else cfg.model_queue_bound
    return exhausted(
        f"{what} for model '{cfg.name}' full ({admission.detail} waiting, bound {bound}); "
        "retry later",
        retry_after_ms,
    )


def job_cost(cfg: ModelConfig, job: Job) -> int:
    """What a request costs to compute, for tier choice: rows x length (tokens for text)."""
    return job.rows * job_length(job, batched=cfg.max_batch_size > 0)


def tier_stream(cfg: ModelConfig, job: Job, tier: TierSpec) -> StreamKey:
    """The stream the job would join on `tier`."""
    variant = job.variant or tier.variant or cfg.default_variant
    return choose_stream(cfg, dataclasses.replace(job, variant=variant), tier.name)
