"""Opening a worker's units as its settings ask: the batched units' runners (threads per
call and lanes, the execution providers) and the generative units' engines."""

from __future__ import annotations

from collections.abc import Mapping

import structlog
from prometheus_client import CollectorRegistry

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.sessions import ProviderChoice
from tiermesh.core.settings import WorkerSettings
from tiermesh.worker.lanes import cores_available, plan
from tiermesh.worker.runner import ComputeTime, ModelRunner
from tiermesh.worker.units import GenerativeUnit, open_generative, open_runner, provider_choice

log = structlog.get_logger("tiermesh.worker")


class Opener:
    """Opens the units of a worker: at start every unit served, and later a batched unit
    model control loads (worker/units.UnitControl calls it). Blocking; raises
    RepositoryError or ProviderUnavailable."""

    def __init__(
        self, settings: WorkerSettings, repo: ModelRepository, registry: CollectorRegistry
    ) -> None:
        self._settings = settings
        self._repo = repo
        # Batched models: threads per call and lanes. Generative ones keep the threads
        # setting: their loop runs one engine step at a time.
        self.compute = plan(settings.intra_op_threads, settings.compute_lanes, cores_available())
        self._compute_time = ComputeTime(registry, per_thread=self.compute.threads == 1)

    def __call__(self, unit: ComputeUnit, cfg: ModelConfig) -> ModelRunner:
        """A batched unit's runner."""
        # A batch computing alone on an idle worker may use every lane's threads.
        wide = self.compute.threads * self.compute.lanes
        threads, time = self.compute.threads, self._compute_time
        return open_runner(self._repo, unit, cfg, threads, time, wide, self._providers(cfg))

    def runners(self, units: Mapping[ComputeUnit, ModelConfig]) -> dict[ComputeUnit, ModelRunner]:
        """The runners of the batched `units`, each logged as it loaded."""
        runners = {unit: self(unit, cfg) for unit, cfg in units.items()}
        for unit, runner in runners.items():
            log.info(
                "model loaded", unit=unit, load_s=round(runner.load_s, 3), provider=runner.provider
            )
        return runners

    def generatives(
        self, units: Mapping[ComputeUnit, ModelConfig]
    ) -> dict[ComputeUnit, GenerativeUnit]:
        """The engines of the generative `units`, each logged as it loaded."""
        threads = self._settings.intra_op_threads
        opened = {
            unit: open_generative(self._repo, unit, cfg, threads, self._providers(cfg))
            for unit, cfg in units.items()
        }
        for unit, gen in opened.items():
            log.info(
                "generative model loaded",
                unit=unit,
                load_s=round(gen.load_s, 3),
                provider=gen.provider,
            )
        return opened

    def _providers(self, cfg: ModelConfig) -> ProviderChoice:
        """Execution providers: the worker's own setting, else each model's tier's, else CPU."""
        settings = self._settings
        return provider_choice(
            settings.provider_request, settings.provider_fallback, cfg, settings.worker_tier
        )
