"""summary.md: the report's figures as markdown tables, for a person to read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tiermesh.bench import genmarkdown

# Re-exported: callers format report figures and print the console table through here.
from tiermesh.bench.genmarkdown import console_generation as console_generation
from tiermesh.bench.mdtable import fmt as fmt
from tiermesh.bench.mdtable import shares, table
from tiermesh.bench.records import STAGES
from tiermesh.bench.stats import OUTSIDE

LATENCY_COLUMNS = (
    ("sent", "sent", 0),
    ("ok", "ok", 0),
    ("error rate", "error_rate", "%"),
    ("throughput /s", "throughput_rps", 1),
    ("p50 ms", "p50_ms", 2),
    ("p95 ms", "p95_ms", 2),
    ("p99 ms", "p99_ms", 2),
)
OVERALL_HEADERS = (
    *("sent", "ok", "errors", "error rate", "throughput /s"),
    *("p50 ms", "p95 ms", "p99 ms", "mean ms", "max ms", "mean in flight"),
)
LADDER_HEADERS = (
    *("step", "concurrency", "sent", "throughput /s", "p50 ms", "p95 ms", "p99 ms"),
    *("error rate", "client cores"),
)
CPU_HEADERS = (
    *("cpu s", "user s", "system s", "wall s"),
    *("cpu s / request", "cpu ms / request", "cores used"),
)


def figures_table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    headers = [*keys, *(h for h, _, _ in LATENCY_COLUMNS)]
    body = [
        [*(fmt(row.get(k)) for k in keys), *(fmt(row.get(f), d) for _, f, d in LATENCY_COLUMNS)]
        for row in rows
    ]
    return table(headers, body)


def _header(doc: dict[str, Any]) -> list[str]:
    cfg = doc["config"]
    lines = [
        f"# tiermesh bench: {doc['scenario']} on `{doc['model']}`",
        "",
        f"- target `{doc['url']}`, started {doc['started_at']}, wall {fmt(doc['wall_s'])} s"
        + (" (**interrupted**)" if doc.get("interrupted") else ""),
        f"- seed {cfg['seed']}, priorities {shares(cfg['priorities'])}"
        + (
            ""
            if doc["scenario"] == "generate"
            else f", length mix {shares(cfg['mix'])}"
            if doc["workload"]["text_model"]
            else " (numeric inputs: random values, no length mix)"
        ),
        f"- bounds: {cfg['requests']:,} requests or {fmt(cfg['duration_s'], 1)} s, "
        f"timeout {fmt(cfg['timeout_s'], 1)} s per request, warm-up {cfg['warmup']}",
    ]
    if doc.get("concurrency") is not None:
        lines.append(f"- closed loop at concurrency {doc['concurrency']}")
    if doc["scenario"] == "replay":
        lines.append(
            f"- replay of `{cfg['capture']}` at x{fmt(cfg['speed'], 1)} speed, open loop on the "
            f"captured arrival times ({cfg['skipped']} unreplayable records left out)"
        )
    if doc["scenario"] == "generate":
        lines += genmarkdown.header(cfg)
    if doc["scenario"] == "burst":
        b = cfg["burst"]
        lines.append(
            f"- open loop: {fmt(b['rate_rps'], 1)}/s, spikes of {fmt(b['spike_rate_rps'], 1)}/s "
            f"for {fmt(b['spike_len_s'], 1)} s every {fmt(b['spike_every_s'], 1)} s "
            f"({'Poisson' if b['poisson'] else 'uniform'} arrivals)"
        )
    return lines


def _overall(doc: dict[str, Any]) -> list[str]:
    o = doc["overall"]
    lines = ["", "## Overall", ""]
    lines += table(
        OVERALL_HEADERS,
        [
            [
                fmt(o["sent"], 0),
                fmt(o["ok"], 0),
                fmt(o["errors"], 0),
                fmt(o["error_rate"], "%"),
                fmt(o["throughput_rps"], 1),
                fmt(o["p50_ms"]),
                fmt(o["p95_ms"]),
                fmt(o["p99_ms"]),
                fmt(o["mean_ms"]),
                fmt(o["max_ms"]),
                fmt(doc.get("mean_in_flight"), 1),
            ]
        ],
    )
    if o.get("not_sent"):
        lines += ["", f"{o['not_sent']:,} arrivals were not sent: the client's in-flight cap."]
    if doc["errors_by_code"]:
        lines += ["", "### Errors by code", ""]
        lines += table(
            ["code", "count"], [[k, fmt(v, 0)] for k, v in doc["errors_by_code"].items()]
        )
        ra = doc.get("retry_after") or {}
        if ra.get("count"):
            lines += ["", f"retry-after-ms: mean {fmt(ra['mean_ms'])}, max {fmt(ra['max_ms'])}"]
    return lines


def _breakdown(doc: dict[str, Any]) -> list[str]:
    lines = ["", "## Time breakdown per bucket (mean ms, answered requests)", ""]
    data = doc["breakdown_ms"]
    if not any(any(s in row for s in STAGES) for row in data.values()):
        return [*lines, "The responses carried no timing parameters."]
    headers = ["bucket", "n", *STAGES, f"{OUTSIDE} (client, network)", "server total", "latency"]
    parts = (*STAGES, OUTSIDE, "server_total", "latency")
    rows = [
        [bucket, fmt(row.get("n"), 0), *(fmt(row.get(s)) for s in parts)]
        for bucket, row in data.items()
    ]
    return lines + table(headers, rows)


def _server(doc: dict[str, Any]) -> list[str]:
    s = doc["server"]
    parts = [f"mean batch size {fmt(s['mean_batch_size'])}"]
    if s.get("padding_ratio") is not None:
        parts.append(f"padded / real tokens {fmt(s['padding_ratio'])}")
    for key in ("tiers", "variants", "workers"):
        if s.get(key):
            parts.append(f"{key} " + ", ".join(f"{k}: {v:,}" for k, v in s[key].items()))
    return ["", "## Server", "", "- " + "; ".join(parts)]


def _ladder(doc: dict[str, Any]) -> list[str]:
    lad = doc.get("ladder")
    if not lad:
        return []
    lines = ["", "## Ladder", ""]
    lines += table(
        LADDER_HEADERS,
        [
            [
                str(s["index"]),
                str(s["concurrency"]),
                fmt(s["sent"], 0),
                fmt(s["throughput_rps"], 1),
                fmt(s["p50_ms"]),
                fmt(s["p95_ms"]),
                fmt(s["p99_ms"]),
                fmt(s["error_rate"], "%"),
                fmt(s["cores_used"]),
            ]
            for s in lad["steps"]
        ],
    )
    lines += ["", f"Stopped: {lad['stop_reason']}."]
    k = lad.get("knee")
    if k:
        lines.append(
            f"**Knee: concurrency {k['concurrency']}**, {fmt(k['throughput_rps'], 1)}/s at "
            f"p99 {fmt(k['p99_ms'])} ms ({k['reason']})."
        )
    else:
        lines.append("No knee: no step kept the SLO and the error limit.")
    return lines


def _cpu(doc: dict[str, Any]) -> list[str]:
    c = doc["cpu"]
    per_request_ms = c["cpu_s_per_request"] * 1e3 if c.get("cpu_s_per_request") else None
    lines = ["", "## Load generator CPU", ""]
    lines += table(
        CPU_HEADERS,
        [
            [
                fmt(c["cpu_s"]),
                fmt(c["user_s"]),
                fmt(c["system_s"]),
                fmt(c["wall_s"]),
                fmt(c["cpu_s_per_request"], 6),
                fmt(per_request_ms, 3),
                fmt(c["cores_used"]),
            ]
        ],
    )
    if c.get("client_busy"):
        lines += [
            "",
            "**The load generator kept most of a core busy: its own limit may be in these "
            "figures.** Run several bench processes or lower the load.",
        ]
    return lines


def _cost(doc: dict[str, Any]) -> list[str]:
    c = doc.get("cost")
    if not c:
        return []
    lines = ["", "## Cost", ""]
    if c.get("per_1k_requests") is None and not c.get("tiers"):
        return [*lines, f"Not measured: {c.get('note', 'no mesh metrics')}."]
    cur = c.get("currency", "")
    lines += table(
        ("tier", "replicas", "cpu s", "cores used", "price", "cost"),
        [
            [
                r["tier"],
                fmt(r["replicas"]),
                fmt(r["cpu_s"]),
                fmt(r["cores_used"]),
                f"{fmt(r['price'], 4)} {cur} / {r['unit'].replace('_', '-')}"
                if r.get("unit")
                else "not priced",
                fmt(r["cost"], 6),
            ]
            for r in c["tiers"]
        ],
    )
    lines += [
        "",
        f"**Cost per 1,000 requests: {fmt(c['per_1k_requests'], 6)} {cur}**; "
        f"per million tokens: {fmt(c['per_million_tokens'], 4)} {cur} "
        f"(run total {fmt(c['total'], 6)} {cur}).",
    ]
    return lines


def _extras(doc: dict[str, Any]) -> list[str]:
    lines = []
    drift = doc["timeline"]["drift"]
    if drift.get("throughput_ratio") is not None:
        lines += [
            "",
            "## Over time",
            "",
            f"Last third / first third of the run: throughput x"
            f"{fmt(drift['throughput_ratio'])}, p99 x{fmt(drift['p99_ratio'])}.",
        ]
    if doc.get("open_loop"):
        lag = doc["open_loop"]["send_lag"]
        lines += [
            "",
            "## Open loop",
            "",
            f"Send lag behind schedule: p50 {fmt(lag['p50_ms'])} ms, "
            f"p99 {fmt(lag['p99_ms'])} ms, max {fmt(lag['max_ms'])} ms.",
        ]
    lines += ["", "## Queue depth", "", doc["queue_depth"]["note"] + "."]
    if doc.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({name})" for name in doc["plots"]]
    return lines


def render(doc: dict[str, Any]) -> str:
    """The whole summary of a (JSON-clean) report document."""
    lines = _header(doc) + _overall(doc) + genmarkdown.section(doc)
    lines += ["", "## Per bucket x priority", ""]
    lines += figures_table(doc["by_bucket_priority"], ["bucket", "priority"])
    if doc["workload"]["text_model"]:
        lines += ["", "## Per length class", ""]
        lines += figures_table(doc["by_length"], ["length"])
    lines += ["", "## Per priority", ""]
    lines += figures_table(doc["by_priority"], ["priority"])
    lines += _breakdown(doc) + _server(doc) + _ladder(doc) + _cpu(doc) + _cost(doc) + _extras(doc)
    return "\n".join(lines) + "\n"
