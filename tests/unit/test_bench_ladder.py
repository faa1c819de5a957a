"""bench ladder: stop rules and knee detection on synthetic curves, and the ladder loop
driven by a fake mesh on a fake clock."""

from __future__ import annotations

import math

import pytest

from tiermesh.bench import runner
from tiermesh.bench.ladder import LadderPlan, Step, knee, stop_reason, within_slo
from tiermesh.bench.records import OK, Outcome
from tiermesh.bench.workload import InputSpec, RequestSpec, Workload


def curve(points: list[tuple[int, float, float]], error_rate: float = 0.0) -> list[Step]:
    """Steps from (concurrency, throughput, p99)."""
    return [
        Step(i, c, 100, 100, 1.0, tput, p99 / 2, p99 * 0.9, p99, error_rate)
        for i, (c, tput, p99) in enumerate(points)
    ]


SATURATING = [(1, 100.0, 5.0), (2, 190.0, 6.0), (4, 350.0, 8.0), (8, 400.0, 12.0)]
SATURATING += [(16, 405.0, 25.0), (32, 398.0, 50.0)]


def test_climbing_continues_while_throughput_grows() -> None:
    plan = LadderPlan()
    for n in range(1, 5):
        assert stop_reason(curve(SATURATING[:n]), plan) is None


def test_stops_after_two_steps_without_gain_and_the_knee_is_before_the_plateau() -> None:
    plan = LadderPlan()
    assert stop_reason(curve(SATURATING[:5]), plan) is None  # one flat step only
    reason = stop_reason(curve(SATURATING), plan)
    assert reason is not None and "2 steps in a row" in reason
    found = knee(curve(SATURATING), plan)
    assert found is not None
    assert (found.concurrency, found.throughput_rps) == (8, 400.0)


def test_patience_one_stops_at_the_first_flat_step() -> None:
    reason = stop_reason(curve(SATURATING[:5]), LadderPlan(patience=1))
    assert reason is not None and "1 steps" in reason


def test_a_dip_then_recovery_past_the_best_resets_the_count() -> None:
    points = [(1, 100.0, 5.0), (2, 200.0, 5.0), (4, 190.0, 5.0), (8, 300.0, 5.0)]
    assert stop_reason(curve(points), LadderPlan()) is None


def test_slo_stops_and_bounds_the_knee() -> None:
    plan = LadderPlan(slo_ms=20.0)
    assert stop_reason(curve(SATURATING[:4]), plan) is None
    reason = stop_reason(curve(SATURATING[:5]), plan)
    assert reason is not None and "SLO" in reason
    found = knee(curve(SATURATING[:5]), plan)
    assert found is not None and found.concurrency == 8  # 16 passed the SLO


def test_knee_picks_the_lowest_concurrency_near_the_best() -> None:
    points = [(1, 100.0, 5.0), (2, 390.0, 6.0), (4, 400.0, 8.0), (8, 401.0, 30.0)]
    found = knee(curve(points), LadderPlan(slo_ms=10.0))
    assert found is not None and found.concurrency == 2  # within 5% of the best in SLO (400)


def test_no_knee_when_no_step_keeps_the_slo() -> None:
    assert knee(curve([(1, 100.0, 50.0)]), LadderPlan(slo_ms=10.0)) is None
    assert knee([], LadderPlan()) is None


def test_errors_stop_climbing_and_disqualify_steps() -> None:
    steps = curve([(1, 100.0, 5.0), (2, 200.0, 6.0)], error_rate=0.05)
    reason = stop_reason(steps, LadderPlan())
    assert reason is not None and "error rate" in reason
    assert not within_slo(steps[0], LadderPlan())
    silent = [Step(0, 1, 10, 0, 1.0, 0.0, math.nan, math.nan, math.nan, 1.0)]
    assert "no answers" in (stop_reason(silent, LadderPlan()) or "")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"concurrencies": ()},
        {"concurrencies": (2, 1)},
        {"concurrencies": (0, 1)},
        {"step_requests": 0},
        {"patience": 0},
    ],
)
def test_plan_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        LadderPlan(**kwargs)  # type: ignore[arg-type]


class FakeMesh:
    """Answers at once, advancing a fake clock: capacity grows with concurrency up to 8
    requests served per millisecond-slot, then stays flat (latency grows instead)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.concurrency = 1

    def clock(self) -> float:
        return self.now

    async def send(self, spec: RequestSpec) -> Outcome:
        capacity = min(self.concurrency, 8) * 1000.0  # requests / s
        self.now += 1.0 / capacity
        return Outcome(OK, 1000.0 * self.concurrency / capacity)


async def test_ladder_loop_finds_the_knee_of_a_fake_mesh() -> None:
    mesh = FakeMesh()
    recorder = runner.RunRecorder(clock=mesh.clock)
    work = Workload([InputSpec("INPUT0", "FP32", (-1, 4))], seed=1)
    plan = LadderPlan(step_requests=50, step_duration_s=60.0)

    def on_step(index: int, concurrency: int) -> None:
        mesh.concurrency = concurrency

    result = await runner.ladder(
        mesh.send, work, recorder, plan, limit=10_000, until=3600.0, on_step=on_step
    )
    assert [s.concurrency for s in result.steps] == [1, 2, 4, 8, 16, 32]
    assert "steps in a row" in result.stop_reason
    assert [s.sent for s in result.steps] == [50] * 6
    found = knee(result.steps, plan)
    assert found is not None and found.concurrency == 8
    assert result.steps[3].throughput_rps == pytest.approx(8000.0)


async def test_ladder_loop_stops_at_the_request_bound() -> None:
    mesh = FakeMesh()
    recorder = runner.RunRecorder(clock=mesh.clock)
    work = Workload([InputSpec("INPUT0", "FP32", (-1, 4))], seed=1)
    result = await runner.ladder(
        mesh.send,
        work,
        recorder,
        LadderPlan(step_requests=40),
        limit=100,
        until=3600.0,
        on_step=lambda index, concurrency: setattr(mesh, "concurrency", concurrency),
    )
    assert [s.sent for s in result.steps] == [40, 40, 20]
    assert "bound" in result.stop_reason
    assert len(recorder.records) == 100
