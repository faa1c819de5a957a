"""One bench run's settings, built once by the CLI and passed down."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tiermesh.bench.arrivals import BurstPlan
from tiermesh.bench.genwork import GenerationPlan
from tiermesh.bench.ladder import LadderPlan
from tiermesh.bench.workload import DEFAULT_LENGTHS, DEFAULT_MIX, DEFAULT_PRIORITIES

SCENARIOS = ("single", "steady", "ladder", "burst", "soak", "generate")
# (requests, duration_s) when the command line gives none: whichever comes first ends
# the run. A soak is meant to end on time; its count is only a safety bound.
SCENARIO_BOUNDS: dict[str, tuple[int, float]] = {
    "single": (200, 60.0),
    "steady": (2000, 60.0),
    "ladder": (20000, 300.0),
    "burst": (10000, 30.0),
    "soak": (1_000_000, 300.0),
    "generate": (200, 120.0),
}
# Per request, when the command line gives none: an answer of a few hundred tokens takes
# seconds where a classification takes milliseconds.
DEFAULT_TIMEOUT_S = 10.0
SCENARIO_TIMEOUT_S = {"generate": 120.0}
REPORTS_DIR = Path("bench-reports")


@dataclass(frozen=True)
class BenchConfig:
    scenario: str
    out_dir: Path
    url: str = "127.0.0.1:8001"
    model: str = "mlp"
    seed: int = 0
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    priorities: tuple[tuple[int, float], ...] = DEFAULT_PRIORITIES
    lengths: dict[str, tuple[int, int]] = field(default_factory=lambda: dict(DEFAULT_LENGTHS))
    requests: int = 2000
    duration_s: float = 60.0
    timeout_s: float = 10.0
    concurrency: int = 8
    warmup: int = 10
    variant: str = ""
    ladder: LadderPlan = field(default_factory=LadderPlan)
    burst: BurstPlan = field(default_factory=lambda: BurstPlan(rate_rps=50.0))
    max_in_flight: int = 1024
    metrics_url: str = ""
    metrics_interval_s: float = 0.5
    window_s: float = 1.0
    progress: bool = True
    # The mesh's Prometheus endpoints by tier, for the run's cost (bench/cost.py).
    mesh_metrics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    prices_file: Path | None = None
    generation: GenerationPlan = field(default_factory=GenerationPlan)

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; one of {SCENARIOS}")
        if self.requests < 1 or self.duration_s <= 0 or self.timeout_s <= 0:
            raise ValueError("--requests, --duration-s and --timeout-s must be positive")
        if self.concurrency < 1 or self.max_in_flight < 1 or self.warmup < 0:
            raise ValueError("--concurrency and --max-in-flight must be >= 1, --warmup >= 0")
        if self.window_s <= 0 or self.metrics_interval_s <= 0:
            raise ValueError("--window-s and --metrics-interval-s must be positive")

    @property
    def callers(self) -> int:
        """Closed-loop callers of the single, steady, soak and (closed-loop) generate
        scenarios."""
        return 1 if self.scenario == "single" else self.concurrency

    @property
    def arrival_plan(self) -> BurstPlan | None:
        """The open-loop arrivals of the burst scenario and of generate at a `--rate` (that
        rate, no spikes); None where callers run in a closed loop or a ladder."""
        if self.scenario == "burst":
            return self.burst
        if self.scenario == "generate" and self.generation.open_loop:
            return BurstPlan(self.generation.rate_rps, poisson=self.generation.poisson)
        return None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["out_dir"] = str(self.out_dir)
        out["mesh_metrics"] = {k: list(v) for k, v in self.mesh_metrics.items()}
        out["prices_file"] = str(self.prices_file) if self.prices_file else None
        out["mix"] = dict(self.mix)
        out["priorities"] = {str(k): v for k, v in self.priorities}
        out["lengths"] = {k: list(v) for k, v in self.lengths.items()}
        out["ladder"]["concurrencies"] = list(self.ladder.concurrencies)
        gen = out["generation"]
        # The prompts themselves stay out of the report: their source and count say enough.
        gen["prompts"] = len(self.generation.prompts)
        gen["max_new_tokens"] = dict(self.generation.max_new_tokens)
        return out


def timeout_for(scenario: str, timeout_s: float | None) -> float:
    return SCENARIO_TIMEOUT_S.get(scenario, DEFAULT_TIMEOUT_S) if timeout_s is None else timeout_s


def bounds_for(scenario: str, requests: int | None, duration_s: float | None) -> tuple[int, float]:
    default_requests, default_duration = SCENARIO_BOUNDS[scenario]
    return (
        default_requests if requests is None else requests,
        default_duration if duration_s is None else duration_s,
    )


def default_out_dir(scenario: str, now: float | None = None, root: Path = REPORTS_DIR) -> Path:
    """bench-reports/<YYYYmmdd-HHMMSS>-<scenario>, with -2, -3 ... if it already exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    path = root / f"{stamp}-{scenario}"
    n = 2
    while path.exists():
        path = root / f"{stamp}-{scenario}-{n}"
        n += 1
    return path
