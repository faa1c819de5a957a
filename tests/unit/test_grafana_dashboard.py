"""The Grafana dashboard is well formed and queries only metrics and labels the services define.

The defined names come from the services' own metric classes, built on a fresh registry (and
the process collector of `new_registry()`), so renaming a metric or a label fails here instead
of silently emptying a panel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from tiermesh.core.metrics import new_registry
from tiermesh.core.repository import ModelRepository
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.postprocess.metrics import PostprocessMetrics
from tiermesh.router.metrics import QueueCollector, RouterMetrics
from tiermesh.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tiermesh-dashboard.json"
# Nothing listens there: the queue collector's Redis read fails and it yields empty families.
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"

# The series names Prometheus exports for a family of each type.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
# Labels Prometheus adds at scrape time (and `le`, which histogram buckets add).
TARGET_LABELS = frozenset({"job", "instance"})
GRAFANA_VARIABLES = re.compile(r"__\w+")

METRIC = re.compile(r"(?<![\w:])((?:tiermesh|process)_[a-z_]+)")
SELECTOR = re.compile(r"(?<![\w:])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\s*\)$", re.DOTALL)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


@pytest.fixture(scope="module")
def defined() -> dict[str, frozenset[str]]:
    """Every series name the services export -> the label names it carries."""
    registry = CollectorRegistry()
    owners = (
        GatewayMetrics(registry),
        RouterMetrics(registry),
        WorkerMetrics(registry),
        PostprocessMetrics(registry),
    )
    # Labelled metrics without children export no samples, so their label names come from
    # the metric objects themselves (prometheus_client keeps them in `_labelnames`).
    labels: dict[str, tuple[str, ...]] = {
        metric._name: tuple(metric._labelnames)
        for owner in owners
        for metric in vars(owner).values()
        if isinstance(metric, MetricWrapperBase)
    }
    queues = QueueCollector(UNREACHABLE_REDIS, ModelRepository(ROOT / "models").load())
    registry.register(queues)
    try:
        families = [*registry.collect(), *new_registry().collect()]
    finally:
        queues.close()
    series: dict[str, frozenset[str]] = {}
    for family in families:
        names = labels.get(family.name) or tuple(getattr(family, "_labelnames", ()))
        for suffix in SUFFIXES[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            series[family.name + suffix] = frozenset({*names, *extra})
        for sample in family.samples:
            series.setdefault(sample.name, frozenset(sample.labels))
    return series


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those folded into a collapsed row."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def target_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def variable_queries(dashboard: dict[str, Any]) -> list[str]:
    out = []
    for var in dashboard["templating"]["list"]:
        if var.get("type") == "query":
            query = var["query"]
            out.append(query["query"] if isinstance(query, dict) else query)
    return out


def test_dashboard_parses_with_title_uid_panels_and_templating(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard["title"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["panels"]
    assert dashboard["templating"]["list"]


def test_every_panel_has_a_unique_id_a_grid_position_and_a_query(
    dashboard: dict[str, Any],
) -> None:
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(dashboard):
        where = f"panel {panel.get('id')} {panel.get('title')!r}"
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("h", "w", "x", "y")), where
        assert pos["w"] > 0
        assert pos["h"] > 0
        assert 0 <= pos["x"]
        assert pos["x"] + pos["w"] <= 24, where
        if panel["type"] == "row":  # a row only groups the panels below it
            continue
        exprs = [t.get("expr", "").strip() for t in panel.get("targets", [])]
        assert exprs, f"{where} has no targets"
        assert all(exprs), f"{where} has a target without an expr"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), where


def test_panels_use_the_datasource_variable_and_filter_variables_exist(
    dashboard: dict[str, Any],
) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "model", "tier", "priority"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        sources = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        assert all(s == {"type": "prometheus", "uid": "${datasource}"} for s in sources), panel[
            "title"
        ]
    for expr in target_exprs(dashboard) + variable_queries(dashboard):
        for braced, bare in VARIABLE.findall(expr):
            name = braced or bare
            assert name in variables or GRAFANA_VARIABLES.fullmatch(name), (name, expr)


def test_the_defined_set_is_built_from_the_services(defined: dict[str, frozenset[str]]) -> None:
    # Guards the fixture itself: a collector that stopped yielding would pass everything.
    assert {
        "tiermesh_requests_total",
        "tiermesh_request_duration_seconds_bucket",
        "tiermesh_queue_depth",
        "tiermesh_batch_size_sum",
        "tiermesh_worker_busy_seconds_total",
    } <= set(defined)
    assert "tiermesh_requests" not in defined  # a counter is only queryable as _total


def test_every_tiermesh_metric_queried_is_defined_by_the_services(
    dashboard: dict[str, Any], defined: dict[str, frozenset[str]]
) -> None:
    queried = {
        name
        for expr in target_exprs(dashboard) + variable_queries(dashboard)
        for name in METRIC.findall(expr)
        if name.startswith("tiermesh_")
    }
    assert queried
    assert sorted(queried - set(defined)) == []


@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="the process collector reads /proc"
)
def test_every_process_metric_queried_is_exported(
    dashboard: dict[str, Any], defined: dict[str, frozenset[str]]
) -> None:
    queried = {
        name
        for expr in target_exprs(dashboard)
        for name in METRIC.findall(expr)
        if name.startswith("process_")
    }
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= queried
    assert sorted(queried - set(defined)) == []


def test_matchers_and_groupings_name_labels_the_metrics_carry(
    dashboard: dict[str, Any], defined: dict[str, frozenset[str]]
) -> None:
    wrong: list[str] = []
    for expr in target_exprs(dashboard):
        for name, body in SELECTOR.findall(expr):
            if name not in defined:
                continue  # reported by the tests above
            for label in MATCHER.findall(body):
                if label not in defined[name] | TARGET_LABELS:
                    wrong.append(f"{name} has no label {label!r}: {expr}")
        carried = set(TARGET_LABELS)
        for name in METRIC.findall(expr):
            carried |= defined.get(name, frozenset())
        for grouping in GROUPING.findall(expr):
            for label in filter(None, (g.strip() for g in grouping.split(","))):
                if label not in carried:
                    wrong.append(f"no metric carries {label!r}: {expr}")
    for query in variable_queries(dashboard):
        match = LABEL_VALUES.match(query.strip())
        assert match, query
        metrics, label = METRIC.findall(match.group(1)), match.group(2)
        assert metrics, query
        wrong += [
            f"{m} has no label {label!r}: {query}"
            for m in metrics
            if m in defined and label not in defined[m]
        ]
    assert wrong == []
