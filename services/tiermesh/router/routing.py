"""The router's work on a batch of jobs: input processing, version, tier and stream choice,
admission. Every Redis command is issued per batch, not per job: one read of the tier states
the batch needs, one pipeline of admissions. Tokenization of all texts of a model is one
`encode_batch` call. Each job gets its own outcome: placed, or a MeshError.

No gRPC here: the servicer (servicer.py) converts messages at the edge.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import redis.asyncio as aioredis
import structlog

from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.errors import (
    MeshError,
    deadline_exceeded,
    invalid,
    not_gated,
    unavailable,
    unknown_model,
)
from tiermesh.core.jobs import Job
from tiermesh.core.keys import DEFAULT_TIER, StreamKey
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import RouterSettings
from tiermesh.core.tenants import Tenant, load_tenants
from tiermesh.core.text import TextEncoder
from tiermesh.core.tls import caller_checks
from tiermesh.core.validation import check_job
from tiermesh.core.wire import encode_job
from tiermesh.rollout.cache import RolloutStates
from tiermesh.rollout.split import Placement, place
from tiermesh.router.admission import Admitter, Enqueue
from tiermesh.router.inputs import prompted, tokenized
from tiermesh.router.metrics import RouterMetrics
from tiermesh.router.policy import (
    choose_stream,
    job_cost,
    model_streams,
    refusal,
    tier_stream,
)
from tiermesh.router.prompt import PromptEncoder
from tiermesh.router.tiers import choose_tier

log = structlog.get_logger("tiermesh.router")
REDIS_DOWN = "queue unavailable (redis down or loading)"


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a job went: its stream entry, the version it was placed on, and the id of the
    copy mirrored to the canary ("" = none)."""

    stream: str
    entry_id: str
    version: str
    shadow_request_id: str = ""


Outcome = Placed | MeshError


@dataclass(slots=True)
class _Work:
    """One job on its way through `route_batch`: what is known of it so far."""

    job: Job
    cfg: ModelConfig | None = None
    placement: Placement | None = None
    tier: str = DEFAULT_TIER
    stream: StreamKey | None = None
    outcome: Outcome | None = None
    # The stream the job would join on each of its model's tiers (tiered models only).
    candidates: dict[str, StreamKey] = field(default_factory=dict)


@dataclass(frozen=True)
class JobChecks:
    """What a router checks of each job when its port takes calls without internal mTLS:
    any process that reaches it could send a job (core/validation.check_job)."""

    # The tenants file's tenants by name; None: the mesh has no tenants file.
    tenants: Mapping[str, Tenant] | None

    @classmethod
    def from_settings(cls, settings: RouterSettings) -> JobChecks | None:
        """With internal mTLS only gateways' certificates reach the router (core/callers.py):
        no checks. Without it anything that reaches the port could send a job: each is
        checked."""
        if caller_checks(settings):
            return None
        if settings.tenants_file is None:
            return cls(None)
        return cls({t.name: t for t in load_tenants(settings.tenants_file)})


class BatchRouter:
    def __init__(
        self,
        settings: RouterSettings,
        repo: ModelRepository,
        admitter: Admitter,
        encoders: Mapping[str, TextEncoder],
        metrics: RouterMetrics,
        clock_ns: Callable[[], int] = time.time_ns,
        rollouts: RolloutStates | None = None,
        control: ControlWatch | None = None,
        prompts: Mapping[str, PromptEncoder] | None = None,
        checks: JobChecks | None = None,
    ) -> None:
        # Jobs from peers no certificate vouches for are checked again (None: trusted).
        self._checks = checks
        # Generative models' chat template and tokenizer, by model name.
        self._prompts = prompts if prompts is not None else {}
        self._rollouts = rollouts
        self._control = control
        self._settings = settings
        self._repo = repo
        self._admitter = admitter
        self._encoders = encoders
        self._metrics = metrics
        self._clock_ns = clock_ns

    async def route_batch(self, jobs: Sequence[Job], received_ns: int = 0) -> list[Outcome]:
        """Each job placed on its stream, or refused: one outcome per job, in order."""
        received_ns = received_ns or self._clock_ns()
        work = [_Work(job) for job in jobs]
        try:
            await self._configs(work)
            self._checked(work)
            self._check_deadlines(work, received_ns)
            await self._input_processing(work)
            await self._versions(work)
            await self._tiers(work, received_ns)
            await self._admit(work, received_ns)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("redis unavailable", error=repr(exc))
            for w in work:
                if w.outcome is None:
                    w.outcome = unavailable(REDIS_DOWN)
        return [w.outcome if w.outcome is not None else _lost() for w in work]

    # --- the steps, each over the jobs still without an outcome ---------------------------

    async def _configs(self, work: list[_Work]) -> None:
        missing = False
        for w in work:
            w.cfg = self._repo.get(w.job.model)
            missing = missing or w.cfg is None
        if missing and self._control is not None:
            await self._control.catch_up()  # loaded into the repository just now?
        for w in work:
            if w.cfg is None:
                w.cfg = self._repo.get(w.job.model)
            if w.cfg is None:
                w.outcome = unknown_model(w.job.model)
                continue
            try:
                w.cfg.priority_level(w.job.priority)  # what the gateway resolved, or 0
            except ValueError as exc:
                w.outcome = invalid(str(exc))

    def _checked(self, work: list[_Work]) -> None:
        if self._checks is None:
            return
        for w in _open(work):
            assert w.cfg is not None
            try:
                check_job(w.cfg, w.job, self._checks.tenants)
            except MeshError as err:
                w.outcome = err

    def _check_deadlines(self, work: list[_Work], now: int) -> None:
        for w in _open(work):
            if w.job.deadline_ns and now >= w.job.deadline_ns:
                w.outcome = deadline_exceeded("deadline passed before the request was queued")

    async def _input_processing(self, work: list[_Work]) -> None:
        """Text to token ids (one encode_batch per model), prompts through their template."""
        texts: dict[str, list[_Work]] = collections.defaultdict(list)
        for w in _open(work):
            cfg = w.cfg
            assert cfg is not None
            if cfg.tokenize is not None:
                texts[cfg.name].append(w)
            elif cfg.generation is not None:
                done = prompted(self._prompts.get(cfg.name), cfg.name, w.job)
                if isinstance(done, MeshError):
                    w.outcome = done
                else:
                    w.job = done
        for model, group in texts.items():
            encoder = self._encoders.get(model)
            if encoder is None:
                for w in group:
                    w.outcome = unavailable(f"model '{model}': its tokenizer is not loaded")
                continue
            for w, job in zip(group, await tokenized(encoder, [w.job for w in group]), strict=True):
                if isinstance(job, MeshError):
                    w.outcome = job
                else:
                    w.job = job

    async def _versions(self, work: list[_Work]) -> None:
        """The version that serves each job: its own, or the rollout's choice (from the
        cached rollout state); UNAVAILABLE for one unloaded through model control (as last
        read by the control watch: no Redis call unless it says unloaded)."""
        unloaded = []
        for w in _open(work):
            cfg = w.cfg
            assert cfg is not None
            state = self._rollouts.get(cfg.queue_model) if self._rollouts is not None else None
            placement = place(cfg.version_for(""), state, w.job)
            if placement.arm in ("stable", "canary"):
                controls = w.job.controls.with_(rollout_arm=placement.arm)
                w.job = w.job.with_(version=placement.version, controls=controls)
            else:
                w.job = w.job.with_(version=placement.version)
            w.placement = placement
            variant, version = w.job.variant, cfg.version_for(w.job.version)
            if variant and not cfg.serves(variant, version):
                # The gateway checked the version it knew; a rollout may place it on another.
                w.outcome = not_gated(cfg.name, variant, version, cfg.servable_variants(version))
                continue
            if self._control is not None and not self._control.state.served(cfg, w.job.version):
                unloaded.append(w)
        if not unloaded:
            return
        assert self._control is not None
        await self._control.catch_up()  # loaded again just now?
        for w in unloaded:
            cfg = w.cfg
            assert cfg is not None
            if not self._control.state.served(cfg, w.job.version):
                w.outcome = unavailable(
                    f"model '{cfg.name}' version {w.job.version} is not loaded (unloaded "
                    "through model control); load it again to serve it"
                )

    async def _tiers(self, work: list[_Work], now: int) -> None:
        """The tier (and, unless the caller named one, the variant) of every job, from one
        read of the states of every candidate stream of the batch. A job placed counts in
        its stream's backlog for the jobs after it."""
        tiered = []
        for w in _open(work):
            cfg = w.cfg
            assert cfg is not None
            if not cfg.tiers:
                w.job = w.job.with_(variant=cfg.variant_for(w.job.variant))
                w.tier = DEFAULT_TIER
            else:
                tiered.append(w)
        if not tiered:
            return
        candidates: dict[str, StreamKey] = {}
        for w in tiered:
            assert w.cfg is not None
            w.candidates = {t.name: tier_stream(w.cfg, w.job, t) for t in w.cfg.tiers}
            candidates.update((s.name, s) for s in w.candidates.values())
        states = await self._admitter.stream_states(list(candidates.values()))
        for w in tiered:
            cfg = w.cfg
            assert cfg is not None
            mine = w.candidates
            seen = {name: states[s.name] for name, s in mine.items()}
            ms_left = (w.job.deadline_ns - now) / 1e6 if w.job.deadline_ns else None
            tier = choose_tier(cfg.tiers, job_cost(cfg, w.job), ms_left, seen)
            if tier is None:
                tiers = ", ".join(t.name for t in cfg.tiers)
                w.outcome = unavailable(
                    f"no live worker for model '{cfg.name}' on any tier ({tiers})"
                )
                continue
            chosen = states[mine[tier.name].name]
            states[mine[tier.name].name] = dataclasses.replace(chosen, backlog=chosen.backlog + 1)
            w.job = w.job.with_(variant=cfg.variant_for(w.job.variant, tier))
            w.tier = tier.name

    async def _admit(self, work: list[_Work], now: int) -> None:
        """Every job's entry written (or refused) in one pipeline; then the canary copies."""
        items: list[Enqueue] = []
        admitted: list[_Work] = []
        enqueued_ns = self._clock_ns()
        for w in _open(work):
            cfg = w.cfg
            assert cfg is not None
            stream = choose_stream(cfg, w.job, w.tier)
            w.stream = stream
            w.job = w.job.with_(
                priority=stream.priority,
                bucket=stream.bucket,
                tier=stream.tier,
                timing=w.job.timing.with_(routed_ns=now, enqueued_ns=enqueued_ns),
            )
            items.append(
                Enqueue(
                    stream,
                    cfg.queue_bound,
                    encode_job(w.job),
                    w.job.trace_context,
                    w.job.request_id,
                    model_streams(cfg, stream),
                    cfg.model_queue_bound,
                    _ms_left(w.job, now),
                )
            )
            admitted.append(w)
        if not items:
            return
        admissions = await self._admitter.admit_many(items)
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        shadows: list[_Work] = []
        for w, admission in zip(admitted, admissions, strict=True):
            cfg, placed_on = w.cfg, w.stream
            assert cfg is not None and placed_on is not None
            counts[(cfg.name, admission.outcome)] += 1
            if admission.outcome == "dup":  # a retry of a request already queued
                log.info("request already queued", request_id=w.job.request_id)
            elif admission.outcome == "noworker":
                w.outcome = unavailable(
                    f"no live worker for model '{cfg.name}' on tier '{placed_on.tier}'"
                )
                continue
            elif admission.outcome != "ok":
                w.outcome = refusal(cfg, admission, self._settings.retry_after_ms)
                continue
            w.outcome = Placed(placed_on.name, admission.detail, w.job.version)
            placement = w.placement
            if (
                admission.outcome == "ok"
                and placement is not None
                and placement.shadow_version
                and (
                    self._control is None
                    or self._control.state.served(cfg, placement.shadow_version)
                )
            ):
                shadows.append(w)
        for (model, outcome), n in counts.items():
            self._metrics.admissions.labels(model, outcome).inc(n)
        if shadows:
            await self._mirror(shadows, now)

    async def _mirror(self, shadows: list[_Work], now: int) -> None:
        """A copy of each (queued) job for the canary, to compare outputs; its answer goes
        to the same gateway, marked. Best effort: a copy not queued is left out."""
        items = []
        for w in shadows:
            cfg, placement = w.cfg, w.placement
            assert cfg is not None and placement is not None
            shadow = w.job.with_(
                request_id=f"{w.job.request_id}-shadow",
                version=placement.shadow_version,
                controls=w.job.controls.with_(shadow_of=w.job.request_id, rollout_arm="shadow"),
            )
            stream = choose_stream(cfg, shadow, w.tier)
            items.append(
                Enqueue(
                    stream,
                    cfg.queue_bound,
                    encode_job(shadow),
                    w.job.trace_context,
                    shadow.request_id,
                    ms_left=_ms_left(w.job, now),
                )
            )
        try:
            admissions = await self._admitter.admit_many(items)
        except (aioredis.RedisError, OSError):
            return
        for w, item, admission in zip(shadows, items, admissions, strict=True):
            assert w.cfg is not None and isinstance(w.outcome, Placed)
            self._metrics.admissions.labels(w.cfg.name, f"shadow_{admission.outcome}").inc()
            if admission.outcome == "ok":
                w.outcome = dataclasses.replace(w.outcome, shadow_request_id=item.request_id)


def _open(work: list[_Work]) -> list[_Work]:
    """The jobs not decided yet."""
    return [w for w in work if w.outcome is None]


def _lost() -> MeshError:
    return MeshError(grpc.StatusCode.INTERNAL, "the router lost track of this request")


def _ms_left(job: Job, now: int) -> int:
    return (job.deadline_ns - now) // 1_000_000 if job.deadline_ns else -1
