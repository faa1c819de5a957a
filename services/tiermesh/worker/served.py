"""The compute units a batched worker has sessions for, and the streams it reads for them.
Plain state, shared by the loop's parts; model control (worker/control.py) changes it."""

from __future__ import annotations

from collections.abc import Mapping

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelConfig
from tiermesh.worker.runner import ModelRunner


class ServedUnits:
    """Units with a session (keyed by compute unit, "mlp@1.fp32"): those served, and those
    closing (unloaded through model control: no longer read, finishing what was read)."""

    def __init__(
        self,
        tier: str,
        configs: Mapping[ComputeUnit, ModelConfig],
        runners: Mapping[ComputeUnit, ModelRunner],
        *,
        online: bool,
        background: bool,
    ) -> None:
        self.tier = tier
        # False: a batch pool worker, reading only background streams and never registered
        # for online admission (no heartbeat), so routers never count on it.
        self.online = online
        # True: batch-job work (background streams) is read too.
        self.background = background
        self.configs = dict(configs)
        self.runners = dict(runners)
        self.closing: set[ComputeUnit] = set()
        # Closing units whose queued entries are being answered (not retired meanwhile).
        self.draining: set[ComputeUnit] = set()
        # The streams read, as of the last `refresh_keys` (model control calls it once the
        # served set changed: between those calls reads go on over the old set).
        self.keys = self.stream_keys()

    @property
    def serving(self) -> list[ComputeUnit]:
        """The units this worker reads and heartbeats for."""
        return [u for u in self.configs if u not in self.closing]

    def providers(self, units: list[ComputeUnit]) -> dict[ComputeUnit, str]:
        """The execution provider each of `units` got its session on (unit -> provider), for
        the heartbeat; units without a session (or whose provider is unknown) are left out."""
        return {
            unit: runner.provider
            for unit in units
            if (runner := self.runners.get(unit)) is not None and runner.provider
        }

    def refresh_keys(self) -> None:
        self.keys = self.stream_keys()

    def stream_keys(self) -> list[StreamKey]:
        """Every stream of the units served: their online levels (unless a batch pool) and,
        when batch jobs are taken, their background streams."""
        online = [
            k
            for unit in self.serving
            if self.online
            for k in keys.stream_keys(
                unit,
                self.tier,
                self.configs[unit].priority_levels,
                self.configs[unit].bucket_count,
            )
        ]
        if not self.background:
            return online
        return online + [
            k
            for unit in self.serving
            for k in keys.background_streams(unit, self.tier, self.configs[unit].bucket_count)
        ]
