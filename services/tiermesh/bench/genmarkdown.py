"""The generate scenario in summary.md (its plan in the header, the Generation section) and
on the console: TTFT / TPOT percentiles, tokens/s, figures per answer length, failures."""

from __future__ import annotations

from typing import Any

from tiermesh.bench.mdtable import DASH, fmt, shares, table

ROWS = (
    ("TTFT (client)", "ttft_ms"),
    ("TPOT (client)", "tpot_ms"),
    ("TTFT (server)", "server_ttft_ms"),
    ("TPOT (server)", "server_tpot_ms"),
    ("end to end", "e2e_ms"),
)
HEADERS = ("ms", "n", "p50", "p90", "p99", "mean", "max")
CLASS_HEADERS = (
    *("max_new_tokens", "ok", "mean tokens", "tokens /s"),
    *("TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99"),
    *("e2e p50", "e2e p99"),
)


def header(cfg: dict[str, Any]) -> list[str]:
    """The header lines of a generate run: its plan."""
    g = cfg["generation"]
    sampling = "greedy" if not g["temperature"] else f"temperature {fmt(g['temperature'])}"
    if g["top_p"] != 1:
        sampling += f", top_p {fmt(g['top_p'])}"
    lines = [
        f"- generation: {g['prompts']:,} prompts ({g['prompts_source']}), max_new_tokens "
        f"{shares(g['max_new_tokens'])}, {sampling}"
        + (f", stop {g['stop']!r}" if g["stop"] else "")
        + (", streamed" if g["stream"] else ", not streamed (one response per request)"),
    ]
    if g["rate_rps"]:
        lines.append(
            f"- open loop: {fmt(g['rate_rps'], 2)}/s "
            f"({'Poisson' if g['poisson'] else 'uniform'} arrivals)"
        )
    return lines


def _rows(g: dict[str, Any]) -> list[list[str]]:
    return [
        [name, fmt(g[key]["n"], 0), *(fmt(g[key][k]) for k in ("p50", "p90", "p99", "mean", "max"))]
        for name, key in ROWS
    ]


def _tokens_line(g: dict[str, Any]) -> str:
    out = g["generated_tokens"]
    return (
        f"**{fmt(g['tokens_per_s'], 1)} tokens/s** generated ({fmt(out['total'], 0)} tokens, "
        f"mean {fmt(out['mean'], 1)} per answer); prompts {fmt(g['prompt_tokens']['total'], 0)} "
        f"tokens (mean {fmt(g['prompt_tokens']['mean'], 1)})."
    )


def section(doc: dict[str, Any]) -> list[str]:
    """The generation section: TTFT / TPOT percentiles, tokens/s, per answer length."""
    g = doc.get("generation")
    if not g:
        return []
    lines = ["", "## Generation", ""]
    lines += table(HEADERS, _rows(g))
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
            CLASS_HEADERS,
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
    rows = [list(HEADERS), *_rows(g)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    text = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]
    text.append(_tokens_line(g).replace("**", ""))
    return "\n".join(text) + "\n"
