"""How a worker opens a compute unit's session, and what it needs to follow model control.

The decisions (which units to open and close) are core/serving.py's; the batched loop
applies them in worker/control.py (`ModelControl.apply`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from tokenizers import Tokenizer

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.sessions import Fallback, ProviderChoice, ProviderRequest
from tiermesh.generate.chat_file import ChatFile
from tiermesh.generate.detok import TextStream, for_tokenizer
from tiermesh.generate.engine import Engine
from tiermesh.generate.scheduler import Limits
from tiermesh.generate.service import GenerationService
from tiermesh.worker.runner import ComputeTime, ModelRunner, new_session


def provider_choice(
    worker_request: ProviderRequest, fallback: Fallback, cfg: ModelConfig, tier: str
) -> ProviderChoice:
    """The execution providers a worker on `tier` asks for a model's sessions: its own
    setting (TIERMESH_EXECUTION_PROVIDERS) when given, else the tier's `execution_providers`
    in the model's config, else none (CPU)."""
    if worker_request:
        return ProviderChoice(worker_request, fallback)
    spec = next((t for t in cfg.tiers if t.name == tier), None)
    return ProviderChoice(spec.execution_providers if spec else (), fallback)


def open_runner(
    repo: ModelRepository,
    unit: ComputeUnit,
    cfg: ModelConfig,
    threads: int,
    compute_time: ComputeTime | None = None,
    wide_threads: int = 0,
    providers: ProviderChoice | None = None,
) -> ModelRunner:
    """The session of one compute unit, built from bytes that matched their sha256
    (`verified_model`: nothing changed on disk afterwards reaches it), on the execution
    providers asked for (None: CPU). Blocking: reads, hashes and builds; the loop calls it
    in a thread. Raises RepositoryError on a mismatch, ProviderUnavailable as
    core/sessions.py says."""
    return ModelRunner(
        cfg,
        repo.verified_model(cfg.name, unit.version, unit.variant),
        threads,
        preoptimized=repo.preoptimized(cfg.name, unit.variant, unit.version),
        compute_time=compute_time,
        wide_threads=wide_threads,
        providers=providers,
        unit=unit,
    )


@dataclass(frozen=True)
class UnitControl:
    """What a worker follows model control with: the watch over the state in Redis (which
    re-reads `repo` when it changed), the models it serves (empty: every model), and how
    to open a unit. Built in the worker's __main__."""

    watch: ControlWatch
    repo: ModelRepository
    names: Sequence[str]
    open: Callable[[ComputeUnit, ModelConfig], ModelRunner]
    interval_s: float = 0.5


@dataclass(frozen=True)
class GenerativeUnit:
    """A generative unit's engine (behind its service) and how its tokens become text."""

    service: GenerationService
    text: Callable[[Sequence[str]], TextStream]
    load_s: float
    provider: str = ""  # the execution provider its session got


def open_generative(
    repo: ModelRepository,
    unit: ComputeUnit,
    cfg: ModelConfig,
    threads: int,
    providers: ProviderChoice | None = None,
) -> GenerativeUnit:
    """The decoder session (on the execution providers asked for; None: CPU), tokenizer and
    stop tokens of a generative unit, from files that matched their sha256. Blocking (reads,
    hashes, builds); raises RepositoryError."""
    assert cfg.generation is not None
    spec = cfg.generation
    started = time.perf_counter()
    model = repo.verified_model(cfg.name, unit.version, unit.variant)
    session, provider = new_session(model, threads, providers=providers, unit=unit)
    folder = model.path.parent
    chat = ChatFile.read(folder / spec.chat_file)
    tokenizer = Tokenizer.from_file(str(folder / spec.tokenizer_file))
    limits = Limits(
        max_sequences=spec.max_sequences,
        max_kv_tokens=spec.max_kv_tokens,
        prefill_chunk=spec.prefill_chunk,
        step_tokens=spec.step_tokens,
    )
    engine = Engine(session, chat.stop_token_ids, limits)
    return GenerativeUnit(
        GenerationService(engine),
        partial(for_tokenizer, tokenizer),
        time.perf_counter() - started,
        provider,
    )
