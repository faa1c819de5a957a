"""summary.md: the report's figures as markdown tables, for a person to read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tiermesh.bench.records import STAGES
from tiermesh.bench.stats import OUTSIDE

DASH = "-"
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


def fmt(value: Any, digits: int | str = 2) -> str:
    if value is None:
        return DASH
    if digits == "%":
        return f"{float(value):.2%}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if digits == 0 or isinstance(value, int):
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def figures_table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    headers = [*keys, *(h for h, _, _ in LATENCY_COLUMNS)]
    body = [
        [*(fmt(row.get(k)) for k in keys), *(fmt(row.get(f), d) for _, f, d in LATENCY_COLUMNS)]
        for row in rows
    ]
    return table(headers, body)


def _shares(shares: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.2f}" for k, v in shares.items())


def _header(doc: dict[str, Any]) -> list[str]:
    cfg = doc["config"]
    lines = [
        f"# tiermesh bench: {doc['scenario']} on `{doc['model']}`",
        "",
        f"- target `{doc['url']}`, started {doc['started_at']}, wall {fmt(doc['wall_s'])} s"
        + (" (**interrupted**)" if doc.get("interrupted") else ""),
        f"- seed {cfg['seed']}, priorities {_shares(cfg['priorities'])}"
        + (
            ""
            if doc["scenario"] == "generate"
            else f", length mix {_shares(cfg['mix'])}"
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
        lines += _generation_header(cfg)
    if doc["scenario"] == "burst":
        b = cfg["burst"]
        lines.append(
            f"- open loop: {fmt(b['rate_rps'], 1)}/s, spikes of {fmt(b['spike_rate_rps'], 1)}/s "
            f"for {fmt(b['spike_len_s'], 1)} s every {fmt(b['spike_every_s'], 1)} s "
            f"({'Poisson' if b['poisson'] else 'uniform'} arrivals)"
        )
    return lines


def _generation_header(cfg: dict[str, Any]) -> list[str]:
    g = cfg["generation"]
    sampling = "greedy" if not g["temperature"] else f"temperature {fmt(g['temperature'])}"
    if g["top_p"] != 1:
        sampling += f", top_p {fmt(g['top_p'])}"
    lines = [
        f"- generation: {g['prompts']:,} prompts ({g['prompts_source']}), max_new_tokens "
        f"{_shares(g['max_new_tokens'])}, {sampling}"
        + (f", stop {g['stop']!r}" if g["stop"] else "")
        + (", streamed" if g["stream"] else ", not streamed (one response per request)"),
    ]
    if g["rate_rps"]:
        lines.append(
            f"- open loop: {fmt(g['rate_rps'], 2)}/s "
            f"({'Poisson' if g['poisson'] else 'uniform'} arrivals)"
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


GEN_ROWS = (
    ("TTFT (client)", "ttft_ms"),
    ("TPOT (client)", "tpot_ms"),
    ("TTFT (server)", "server_ttft_ms"),
    ("TPOT (server)", "server_tpot_ms"),
    ("end to end", "e2e_ms"),
)
GEN_HEADERS = ("ms", "n", "p50", "p90", "p99", "mean", "max")
GEN_CLASS_HEADERS = (
    *("max_new_tokens", "ok", "mean tokens", "tokens /s"),
    *("TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99"),
    *("e2e p50", "e2e p99"),
)


def _generation_rows(g: dict[str, Any]) -> list[list[str]]:
    return [
        [name, fmt(g[key]["n"], 0), *(fmt(g[key][k]) for k in ("p50", "p90", "p99", "mean", "max"))]
        for name, key in GEN_ROWS
    ]


def _tokens_line(g: dict[str, Any]) -> str:
    out = g["generated_tokens"]
    return (
        f"**{fmt(g['tokens_per_s'], 1)} tokens/s** generated ({fmt(out['total'], 0)} tokens, "
        f"mean {fmt(out['mean'], 1)} per answer); prompts {fmt(g['prompt_tokens']['total'], 0)} "
        f"tokens (mean {fmt(g['prompt_tokens']['mean'], 1)})."
    )


def generation(doc: dict[str, Any]) -> list[str]:
    """The generation section: TTFT / TPOT percentiles, tokens/s, per answer length."""
    g = doc.get("generation")
    if not g:
        return []
    lines = ["", "## Generation", ""]
    lines += table(GEN_HEADERS, _generation_rows(g))
    lines += ["", _tokens_line(g)]
    if not g["streaming"]:
        lines += [
            "",
            "Not streamed: the client's TTFT is the whole call and it has no TPOT of its own.",
        ]
    reasons = ", ".join(f"{k} {v:,}" for k, v in g["finish_reasons"].items())
    lines += ["", f"Finish reasons: {reasons or DASH}."]
    if g.get("without_text") or g.get("without_token_count"):
        lines.append(
            f"{g['without_text']:,} answers had no text (no TTFT); {g['without_token_count']:,} "
            "final responses left out generated_tokens (no TPOT)."
        )
    if g["by_max_new_tokens"]:
        lines += ["", "### Per answer length (max_new_tokens asked; ms)", ""]
        lines += table(
            GEN_CLASS_HEADERS,
            [
                [
                    r["max_new_tokens"],
                    fmt(r["ok"], 0),
                    fmt(r["mean_generated_tokens"], 1),
                    fmt(r["tokens_per_s"], 1),
                    *(fmt(r[f"{m}_p{q}_ms"]) for m in ("ttft", "tpot") for q in (50, 90, 99)),
                    fmt(r["e2e_p50_ms"]),
                    fmt(r["e2e_p99_ms"]),
                ]
                for r in g["by_max_new_tokens"]
            ],
        )
    if g["errors"]:
        lines += ["", "### Most frequent failures", ""]
        lines += table(
            ("code", "message", "count"),
            [[e["code"], e["message"] or DASH, fmt(e["count"], 0)] for e in g["errors"]],
        )
    return lines


def console_generation(doc: dict[str, Any]) -> str:
    """TTFT / TPOT percentiles and tokens/s as a plain-text table for the terminal."""
    g = doc.get("generation")
    if not g:
        return ""
    rows = [[GEN_HEADERS[0], *GEN_HEADERS[1:]], *_generation_rows(g)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]
    text.append(_tokens_line(g).replace("**", ""))
    return "\n".join(text) + "\n"


def render(doc: dict[str, Any]) -> str:
    """The whole summary of a (JSON-clean) report document."""
    lines = _header(doc) + _overall(doc) + generation(doc)
    lines += ["", "## Per bucket x priority", ""]
    lines += figures_table(doc["by_bucket_priority"], ["bucket", "priority"])
    if doc["workload"]["text_model"]:
        lines += ["", "## Per length class", ""]
        lines += figures_table(doc["by_length"], ["length"])
    lines += ["", "## Per priority", ""]
    lines += figures_table(doc["by_priority"], ["priority"])
    lines += _breakdown(doc) + _server(doc) + _ladder(doc) + _cpu(doc) + _cost(doc) + _extras(doc)
    return "\n".join(lines) + "\n"
