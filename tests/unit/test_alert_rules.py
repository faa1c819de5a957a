"""The alerting and cost rules of deploy/prometheus, checked and evaluated by promtool.

Every alert gets synthetic series of its own: one set that fires it and one that must stay
quiet (promtool fails a test when an alert fires that was not expected). The promtool test
file is generated from the cases below, with the expected annotations rendered from the
rules themselves, so a reworded runbook line needs no edit here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
ALERTS = PROM / "alerts.yml"
COST = PROM / "cost.yml"
COST_TEST = PROM / "tests" / "cost_test.yml"
EVAL = "20m"

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (scripts/ensure_promtool.sh installs Debian's prometheus)",
)

UNIT = {"model": "m", "version": "1", "variant": "fp32", "tier": "center"}


def hist(model: str, priority: str, le_counts: dict[str, int]) -> list[dict[str, str]]:
    """A latency histogram whose every request lands in one bucket (cumulative counts)."""
    return [
        {
            "series": f'tiermesh_request_duration_seconds_bucket{{model="{model}",'
            f'priority="{priority}",le="{le}"}}',
            "values": f"0+{per_min}x30",
        }
        for le, per_min in le_counts.items()
    ]


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def unit(model: str) -> dict[str, str]:
    return {**UNIT, "model": model}


# alert -> (input series, labels of each alert expected to fire). Series of other cases are
# present too: each case's quiet series must stay quiet for every alert.
CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, str]]]] = {
    # p99 = 0.4975 s: twice... almost (SLO of priority 1: 0.25 s): warning only.
    "TiermeshP99OverSLO": (
        hist("slow", "1", {"0.25": 0, "0.5": 10, "+Inf": 10})
        + hist("slower", "1", {"0.5": 0, "1": 10, "+Inf": 10})
        # quiet: the same latency at priority 2, whose SLO is 1 s
        + hist("fast", "2", {"0.25": 0, "0.5": 10, "+Inf": 10}),
        [{"model": "slow", "priority": "1"}, {"model": "slower", "priority": "1"}],
    ),
    "TiermeshP99FarOverSLO": ([], [{"model": "slower", "priority": "1"}]),
    "TiermeshErrorRatio": (
        [
            series("tiermesh_requests_total", {"model": "a", "code": "OK"}, "0+100x30"),
            series("tiermesh_requests_total", {"model": "a", "code": "UNAVAILABLE"}, "0+3x30"),
            series("tiermesh_requests_total", {"model": "b", "code": "OK"}, "0+100x30"),
            series("tiermesh_requests_total", {"model": "b", "code": "INTERNAL"}, "0+10x30"),
            # quiet: 0.5% UNAVAILABLE, and caller-caused codes do not count
            series("tiermesh_requests_total", {"model": "c", "code": "OK"}, "0+100x30"),
            series("tiermesh_requests_total", {"model": "c", "code": "UNAVAILABLE"}, "0+0.5x30"),
            series(
                "tiermesh_requests_total", {"model": "c", "code": "INVALID_ARGUMENT"}, "0+50x30"
            ),
        ],
        [{"model": "a", "code": "UNAVAILABLE"}, {"model": "b", "code": "INTERNAL"}],
    ),
    "TiermeshErrorRatioHigh": ([], [{"model": "b", "code": "INTERNAL"}]),
    "TiermeshQueueOldestEntry": (
        [
            series(
                "tiermesh_queue_oldest_age_seconds",
                {**unit("q1"), "priority": "1", "bucket": "0"},
                "10x30",
            ),
            series(
                "tiermesh_queue_oldest_age_seconds",
                {**unit("q2"), "priority": "2", "bucket": "1"},
                "60x30",
            ),
            # quiet: a one-second-old entry
            series(
                "tiermesh_queue_oldest_age_seconds",
                {**unit("q3"), "priority": "1", "bucket": "0"},
                "1x30",
            ),
        ],
        [{**unit("q1"), "priority": "1"}, {**unit("q2"), "priority": "2"}],
    ),
    "TiermeshQueueStuck": ([], [{**unit("q2"), "priority": "2"}]),
    "TiermeshDeadLetters": (
        [
            series("tiermesh_dead_letters", unit("d1"), "0+1x30"),
            series("tiermesh_dead_letters", unit("d2"), "0+10x30"),
            # quiet: old dead letters, none new
            series("tiermesh_dead_letters", unit("d3"), "5x30"),
        ],
        [unit("d1"), unit("d2")],
    ),
    "TiermeshDeadLettersGrowing": ([], [unit("d2")]),
    "TiermeshWorkerHeartbeatMissing": (
        [
            # one of two workers stops heartbeating at minute 15
            series("tiermesh_workers_live", unit("w1"), "2x14 1x16"),
            # quiet: steady
            series("tiermesh_workers_live", unit("w2"), "2x30"),
        ],
        [unit("w1")],
    ),
    "TiermeshNoWorkers": (
        [
            series("tiermesh_workers_live", unit("w3"), "0x30"),
            series("tiermesh_queue_depth", {**unit("w3"), "priority": "1", "bucket": "0"}, "5x30"),
            # quiet: no worker, but nothing is waiting either (a tier nobody uses)
            series("tiermesh_workers_live", unit("w4"), "0x30"),
            series("tiermesh_queue_depth", {**unit("w4"), "priority": "1", "bucket": "0"}, "0x30"),
        ],
        [unit("w3")],
    ),
    "TiermeshRedisMemory": (
        [
            series("tiermesh_redis_memory_used_bytes", {"instance": "r1"}, "85x30"),
            series("tiermesh_redis_maxmemory_bytes", {"instance": "r1"}, "100x30"),
            series("tiermesh_redis_memory_used_bytes", {"instance": "r2"}, "97x30"),
            series("tiermesh_redis_maxmemory_bytes", {"instance": "r2"}, "100x30"),
            # quiet: half full, and no maxmemory configured at all
            series("tiermesh_redis_memory_used_bytes", {"instance": "r3"}, "50x30"),
            series("tiermesh_redis_maxmemory_bytes", {"instance": "r3"}, "100x30"),
            series("tiermesh_redis_memory_used_bytes", {"instance": "r4"}, "1000x30"),
            series("tiermesh_redis_maxmemory_bytes", {"instance": "r4"}, "0x30"),
        ],
        [{"instance": "r1"}, {"instance": "r2"}],
    ),
    "TiermeshRedisMemoryFull": ([], [{"instance": "r2"}]),
    "TiermeshCanaryRolledBack": (
        [
            series(
                "tiermesh_rollout_rollbacks_total", {"model": "c1", "reason": "errors"}, "0x14 1x16"
            ),
            series(
                "tiermesh_rollout_rollbacks_total", {"model": "c2", "reason": "latency"}, "0+1x30"
            ),
            # quiet: rollbacks long ago
            series("tiermesh_rollout_rollbacks_total", {"model": "c3", "reason": "drift"}, "3x30"),
        ],
        [{"model": "c1", "reason": "errors"}, {"model": "c2", "reason": "latency"}],
    ),
    "TiermeshCanaryRollbacksRepeated": ([], [{"model": "c2", "reason": "latency"}]),
}


def alert_rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def render(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def promtool_tests() -> dict[str, Any]:
    rules = alert_rules()
    inputs = [s for found, _ in CASES.values() for s in found]
    tests = []
    for name, (_, firing) in CASES.items():
        rule = rules[name]
        exp = []
        for labels in firing:
            full = {**labels, **rule["labels"]}
            exp.append(
                {
                    "exp_labels": full,
                    "exp_annotations": {k: render(v, full) for k, v in rule["annotations"].items()},
                }
            )
        tests.append({"eval_time": EVAL, "alertname": name, "exp_alerts": exp})
    return {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": tests}],
    }


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_every_alert_has_a_level_a_runbook_and_a_case() -> None:
    rules = alert_rules()
    assert set(rules) == set(CASES)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert len(rule["annotations"]["runbook"]) > 40, name
        assert CASES[name][1], f"{name}: no series fires it"
    levels = {r["labels"]["severity"] for r in rules.values()}
    assert levels == {"warning", "critical"}


def test_prometheus_config_loads_the_rules() -> None:
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    # Relative to the config file: deploy/prometheus/ here, /etc/prometheus/ in compose.
    assert set(cfg["rule_files"]) >= {"alerts.yml", "cost.yml"}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    volumes = compose["services"]["prometheus"]["volumes"]
    for name in ("alerts.yml", "cost.yml"):
        assert f"./deploy/prometheus/{name}:/etc/prometheus/{name}:ro" in volumes


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(ALERTS), str(COST))
    assert done.returncode == 0, done.stdout + done.stderr
    done = promtool("check", "config", str(PROM / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_every_alert_fires_on_its_series_and_stays_quiet_on_the_others(tmp_path: Path) -> None:
    """Each case's firing series fire exactly the expected alerts at EVAL, and no quiet
    series fires anything (an unexpected alert fails the promtool test)."""
    test_file = tmp_path / "alerts_test.yml"
    test_file.write_text(yaml.safe_dump(promtool_tests(), sort_keys=False))
    done = promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_cost_rules_turn_prices_and_cpu_into_cost_per_request() -> None:
    done = promtool("test", "rules", str(COST_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
