"""Faults under load on a real `tiermesh up`: a worker killed (and restarted by the
supervisor), redis-server killed and restarted, the public port's process (the Go front
door, the Python gateway) stopped with requests in flight. Each ends with every accepted
request answered exactly once; each prints its figures."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import UpProcess, gateway_counts, scrape_metrics, single_redis, stop_counts
from tests.e2e.load import Load

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
FAST_RECOVERY = {
    "TIERMESH_RECLAIM_MIN_IDLE_MS": "1000",
    "TIERMESH_RECLAIM_INTERVAL_MS": "200",
    "TIERMESH_HEARTBEAT_TTL_MS": "3000",
}


def log_events(up: UpProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in up.log.read_text().splitlines():
        if f'"{event}"' in line and line.startswith("{"):
            out.append(json.loads(line))
    return out


def wait_replaced(up: UpProcess, name: str, old_pid: int, timeout_s: float = 30) -> float:
    """Block until the supervisor runs a new `name` process; returns when it saw it."""
    deadline = time.monotonic() + timeout_s
    while up.children().get(name, old_pid) == old_pid:
        assert time.monotonic() < deadline, (
            f"{name} was not restarted:\n{up.log.read_text()[-3000:]}"
        )
        time.sleep(0.02)
    return time.monotonic()


def strike(
    up: UpProcess,
    load: Load,
    name: str,
    sig: int,
    ready: Callable[[], bool] = lambda: True,
    struck_hook: Callable[[], None] = lambda: None,
) -> tuple[float, float, float]:
    """Once traffic flows (and `ready` holds, polled with a deadline), send `sig` to the
    `name` process, call `struck_hook`, and wait until the supervisor runs its successor and
    50 calls started after the strike have succeeded. Returns when it struck, when the
    successor appeared, and how long until the first success after."""
    load.wait_for(50)
    deadline = time.monotonic() + 30
    while not ready():
        assert time.monotonic() < deadline, f"{name}: the moment to strike never came"
        time.sleep(0.002)
    victim = up.children()[name]
    os.kill(victim, sig)
    struck = time.monotonic()
    struck_hook()
    replaced = wait_replaced(up, name, victim)
    recovered_s = load.wait_for(1, after=struck) - struck
    load.wait_for(50, after=struck)
    return struck, replaced, recovered_s


def report(scenario: str, load: Load, stops: list[dict[str, int]], recover_s: float) -> str:
    codes = load.codes()
    refused = ", ".join(f"{k} {v}" for k, v in sorted(codes.items()) if k != "OK") or "none"
    accepted = sum(g["accepted"] for g in stops)
    answered = sum(g["answered"] for g in stops)
    duplicates = sum(g["late_results"] for g in stops)
    return (
        f"\n{scenario}: sent {len(load.calls)}, answered OK {codes['OK']}, "
        f"lost {accepted - answered}, duplicates suppressed {duplicates}, "
        f"refused: {refused}, time to recover {recover_s:.2f} s"
    )


def test_a_killed_worker_is_restarted_and_picks_up_where_it_left_off(
    new_up: Callable[..., UpProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    """The only worker of the mesh dies mid-batch: `tiermesh up` starts it again, the new
    one reclaims what the dead one had read, and nothing accepted is lost."""
    up = new_up(extra_env=FAST_RECOVERY)
    with Load(up.url, callers=8) as load:
        _, _, recovered = strike(up, load, "worker", signal.SIGKILL)
    assert up.interrupt() == 0
    text = up.log.read_text()
    assert "worker exited with code -9; restarting in" in text
    assert "worker restarted (pid" in text
    stops = stop_counts(up)
    reclaimed = sum(e["n"] for e in log_events(up, "reclaimed entries of a dead worker"))
    with capsys.disabled():
        print(report("kill -9 the only worker", load, stops, recovered), end="")
        print(f", entries reclaimed by its successor {reclaimed}")
    # The router refuses while no worker is live (UNAVAILABLE); nothing accepted is lost.
    assert set(load.codes()) <= {"OK", "UNAVAILABLE"}, load.codes()
    counts = gateway_counts(up)
    assert counts["accepted"] == counts["answered"] == load.codes()["OK"]


@single_redis
def test_redis_killed_and_restarted_under_load(
    new_up: Callable[..., UpProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL redis-server: calls arriving meanwhile get UNAVAILABLE at once; the supervisor
    restarts it on its port, it replays its AOF, every service reconnects by itself, and
    every request it had accepted is still answered."""
    up = new_up(extra_env=FAST_RECOVERY)
    timeout_s = 10.0
    with Load(up.url, callers=8, timeout_s=timeout_s) as load:
        _, _, recovered = strike(up, load, "redis", signal.SIGKILL)
    assert up.interrupt() == 0
    assert "redis-server restarted (pid" in up.log.read_text()
    stops = stop_counts(up)
    unavailable = sorted(c.seconds for c in load.calls if c.code == "UNAVAILABLE")
    with capsys.disabled():
        print(report("SIGKILL redis-server", load, stops, recovered), end="")
        if unavailable:
            print(f", UNAVAILABLE answered in at most {unavailable[-1] * 1000:.0f} ms")
    # Every call ended within its deadline with a documented code ...
    assert set(load.codes()) <= {"OK", "UNAVAILABLE", "DEADLINE_EXCEEDED"}, load.codes()
    assert max(c.seconds for c in load.calls) < timeout_s + 1
    # ... refusals while redis was down came fast, not at the deadline ...
    assert not unavailable or unavailable[-1] < 2.0
    # ... and nothing the mesh had accepted was lost.
    counts = gateway_counts(up)
    assert counts["accepted"] == counts["answered"] == load.codes()["OK"]


# Each door on the public port: its process's name under `tiermesh up`, the line it logs
# when SIGTERM begins its drain, and how that line says how many calls it holds.
DOORS = {
    "python": ("gateway", '"gateway draining"', re.compile(r'"pending": (\d+)')),
    "go": ("frontdoor", "frontdoor: draining:", re.compile(r"draining: (\d+) calls in flight")),
}


@pytest.mark.parametrize("door", sorted(DOORS))
def test_sigterm_on_the_public_port_answers_the_requests_in_flight(
    new_up: Callable[..., UpProcess], capsys: pytest.CaptureFixture[str], door: str
) -> None:
    """SIGTERM the process on the public port under load (the Go front door, or the Python
    gateway serving alone): it stops taking calls (UNAVAILABLE), answers every call it had
    taken, exits; the supervisor starts a new one on the same port."""
    name, mark, pending = DOORS[door]
    up = new_up(extra_env={"TIERMESH_FRONT_DOOR": door})
    metrics = up.metrics_urls()[name]
    worker = up.children()["worker"]

    def draining() -> list[int]:
        text = up.log.read_text().splitlines()
        return [int(m.group(1)) for line in text if mark in line and (m := pending.search(line))]

    def paused_with_calls_waiting() -> bool:
        # Calls inside the door as it is struck, for certain: at a random instant there
        # were sometimes none (a call takes a few ms; the 16 callers spend most of the time
        # in their own code), so the worker is paused until several wait on it.
        os.kill(worker, signal.SIGSTOP)
        samples = scrape_metrics(metrics).items()
        return sum(v for (n, _), v in samples if n == "tiermesh_requests_in_flight") >= 4

    def resume_once_draining() -> None:
        # The worker resumes only after the door counted what it holds, so the count
        # cannot race the answers.
        deadline = time.monotonic() + 30
        while not draining():
            assert time.monotonic() < deadline, f"{name} never began to drain"
            time.sleep(0.005)
        os.kill(worker, signal.SIGCONT)

    try:
        with Load(up.url, callers=16) as load:
            stopped, replaced, recovered = strike(
                up, load, name, signal.SIGTERM, paused_with_calls_waiting, resume_once_draining
            )
    finally:
        os.kill(worker, signal.SIGCONT)
    assert up.interrupt() == 0
    held = draining()
    stops = stop_counts(up)
    # The one stopped under load, then its successor (behind the door, the gateway too).
    assert len(stops) == (2 if door == "python" else 3)
    with capsys.disabled():
        print(report(f"{name} SIGTERM", load, stops, recovered), end="")
        print(f", in flight at SIGTERM {held[0]}")
    assert held[0] > 0, "nothing was in flight: the test proved nothing"
    assert set(load.codes()) <= {"OK", "UNAVAILABLE", "CANCELLED"}, load.codes()
    # Calls that reach the port at the instant the server closes are cancelled by gRPC
    # itself; the door never took them (its counts below), and no other call is.
    cancelled = [c for c in load.calls if c.code == "CANCELLED"]
    assert all(stopped <= c.end <= replaced for c in cancelled), cancelled
    for g in stops:
        assert g["accepted"] == g["answered"]
    assert sum(g["answered"] for g in stops) == load.codes()["OK"]
