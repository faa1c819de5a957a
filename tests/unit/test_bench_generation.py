"""bench generate, the pure parts: piece timings, the generation figures and their report
(JSON, summary.md, console), the plan's options and the seeded requests."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiermesh.bench import cost, genstats, markdown, plots, report
from tiermesh.bench.config import BenchConfig, timeout_for
from tiermesh.bench.genwork import (
    GenerationPlan,
    GenWorkload,
    parse_max_new_tokens,
    parse_stop,
    span,
)
from tiermesh.bench.prompts import BUILTIN_PROMPTS, load_prompts
from tiermesh.bench.records import OK, STREAM_ERROR, GenerationRecord, Outcome, Record, Reply
from tiermesh.bench.workload import InputSpec
from tiermesh.cli.main import main

PROMPT = InputSpec("text_input", "BYTES", (1,))


# -- one request's pieces -------------------------------------------------------------------


def test_ttft_is_the_first_piece_with_text_and_tpot_spreads_the_rest() -> None:
    pieces = genstats.Pieces(10.0)
    for at, text in ((10.05, ""), (10.2, "Hel"), (10.25, ""), (10.3, "lo"), (10.6, "!")):
        pieces.add(at, text)
    pieces.add(10.7, "")  # an empty final response: not a token's time
    assert pieces.ttft_ms() == pytest.approx(200.0)
    assert pieces.tpot_ms(5) == pytest.approx((10.6 - 10.2) * 1e3 / 4)
    assert (pieces.count, pieces.chars, pieces.last_s) == (6, 6, 10.7)


def test_tpot_needs_two_tokens_and_a_piece() -> None:
    assert genstats.tpot_ms(1.0, 1.0, 1) is None
    assert genstats.tpot_ms(1.0, 2.0, None) is None
    assert genstats.tpot_ms(None, None, 10) is None
    assert genstats.tpot_ms(1.0, 1.9, 10) == pytest.approx(100.0)
    empty = genstats.Pieces(0.0)
    empty.add(0.5, "")
    assert empty.ttft_ms() is None and empty.tpot_ms(3) is None


def test_generation_from_the_final_values() -> None:
    pieces = genstats.Pieces(0.0)
    pieces.add(0.1, "a")
    pieces.add(0.4, "b")
    final = {
        "prompt_tokens": 9,
        "generated_tokens": 4,
        "ttft_ms": 50.0,
        "tpot_ms": 12.5,
        "finish_reason": "stop_string",
        "queue_ms": 1.0,
    }
    gen = genstats.generation_of(64, pieces, final)
    assert gen.tpot_ms == pytest.approx(100.0)  # (0.4 - 0.1) s over 3 gaps
    assert gen == GenerationRecord(64, 100.0, gen.tpot_ms, 2, 2, 4, 9, 50.0, 12.5, "stop_string")
    unstreamed = genstats.generation_of(64, pieces, final, streamed=False)
    assert unstreamed.tpot_ms is None and unstreamed.ttft_ms == pytest.approx(100.0)
    failed = genstats.generation_of(8, genstats.Pieces(0.0), None, "boom")
    assert failed.generated_tokens is None and failed.finish_reason == "" and failed.error == "boom"


# -- a run's figures ------------------------------------------------------------------------


def gen_rec(
    ttft: float | None,
    tpot: float | None,
    tokens: int | None = 10,
    *,
    e2e: float = 500.0,
    label: str = "16-48",
    code: str = OK,
    reason: str = "length",
    error: str = "",
) -> Record:
    gen = GenerationRecord(
        max_new_tokens=32,
        ttft_ms=ttft,
        tpot_ms=tpot,
        pieces=5,
        text_chars=40,
        generated_tokens=tokens,
        prompt_tokens=20 if code == OK else None,
        server_ttft_ms=ttft / 2 if ttft is not None and code == OK else None,
        server_tpot_ms=tpot * 0.9 if tpot is not None and code == OK else None,
        finish_reason=reason if code == OK else "",
        error=error,
    )
    reply = Reply(stages_ms={"queue": 1.0}) if code == OK else None
    return Record(0.0, label, 0, 0, 2, Outcome(code, e2e, reply, None, gen))


def records() -> list[Record]:
    out = [gen_rec(100.0 + i, 10.0 + i % 5, e2e=300.0 + i) for i in range(40)]
    out += [gen_rec(400.0 + i, 30.0, 100, e2e=3000.0, label="64-128") for i in range(10)]
    out.append(gen_rec(90.0, None, 1, reason="stop"))  # one token: no TPOT
    out.append(gen_rec(None, None, code="UNAVAILABLE", error="no worker"))
    out.append(gen_rec(50.0, None, None, code=STREAM_ERROR, error="bad stop"))
    return out


def test_section_percentiles_count_answered_requests_only() -> None:
    recs = records()
    g = genstats.section(recs, wall_s=10.0, streaming=True)
    ttfts = [100.0 + i for i in range(40)] + [400.0 + i for i in range(10)] + [90.0]
    tpots = [10.0 + i % 5 for i in range(40)] + [30.0] * 10
    for q in (50, 90, 99):
        assert g["ttft_ms"][f"p{q}"] == pytest.approx(float(np.percentile(ttfts, q)))
        assert g["tpot_ms"][f"p{q}"] == pytest.approx(float(np.percentile(tpots, q)))
    assert g["ttft_ms"]["n"] == 51 and g["tpot_ms"]["n"] == 50
    assert g["server_ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttfts, 50)) / 2)
    assert g["e2e_ms"]["max"] == 3000.0
    assert g["answered"] == 51
    assert g["tokens_per_s"] == pytest.approx((400 + 1000 + 1) / 10.0)
    assert g["generated_tokens"]["total"] == 1401 and g["prompt_tokens"]["total"] == 51 * 20
    assert g["finish_reasons"] == {"length": 50, "stop": 1}
    assert [r["max_new_tokens"] for r in g["by_max_new_tokens"]] == ["16-48", "64-128"]
    long = g["by_max_new_tokens"][1]
    assert (long["ok"], long["tokens_per_s"], long["tpot_p99_ms"]) == (10, 100.0, 30.0)
    assert {(e["code"], e["message"]) for e in g["errors"]} == {
        ("UNAVAILABLE", "no worker"),
        (STREAM_ERROR, "bad stop"),
    }
    q = g["quantiles"]["ttft_ms"]
    assert len(q) == 101 and q[0] == [0.0, 90.0] and q[-1] == [100.0, 409.0]


def test_section_of_nothing_answered_is_empty_not_an_error() -> None:
    g = genstats.section([gen_rec(None, None, code="UNAVAILABLE")], 1.0, streaming=True)
    assert g["answered"] == 0 and math.isnan(g["ttft_ms"]["p50"]) and g["tokens_per_s"] == 0
    assert g["quantiles"]["tpot_ms"] == [] and g["by_max_new_tokens"] == []


def test_cost_counts_prompt_and_generated_tokens() -> None:
    assert cost.tokens_of(records()) == 1401 + 51 * 20


# -- the report -----------------------------------------------------------------------------


def gen_config(**plan: Any) -> BenchConfig:
    return BenchConfig(
        scenario="generate", out_dir=Path("x"), model="smollm2", generation=GenerationPlan(**plan)
    )


def document(**plan: Any) -> dict[str, Any]:
    run = report.RunResult(
        config=gen_config(**plan).as_dict(),
        records=records(),
        wall_s=10.0,
        cpu={"cpu_s": 0.3, "user_s": 0.25, "system_s": 0.05, "wall_s": 10.0, "requests": 53}
        | {"cpu_s_per_request": 0.3 / 53, "cores_used": 0.03},
        started_at="2030-01-01T00:00:00+0000",
        text_model=True,
    )
    doc: dict[str, Any] = report.clean(report.build(run))
    return doc


def test_report_json_carries_the_generation_section() -> None:
    doc = document()
    json.dumps(doc, allow_nan=False)
    g = doc["generation"]
    assert g["streaming"] is True and g["ttft_ms"]["p90"] is not None
    assert doc["concurrency"] == 8 and doc["open_loop"] is None
    assert doc["config"]["generation"]["prompts"] == len(BUILTIN_PROMPTS)
    assert doc["overall"]["ok"] == 51 and doc["overall"]["errors"] == 2
    open_loop = document(rate_rps=2.0)
    assert open_loop["concurrency"] is None and open_loop["open_loop"] is not None


def test_summary_and_console_show_ttft_tpot_and_tokens_per_s() -> None:
    doc = document(temperature=0.7, stop="User:")
    text = markdown.render(doc)
    assert "## Generation" in text
    g = doc["generation"]
    ttft = f"| TTFT (client) | 51 | {markdown.fmt(g['ttft_ms']['p50'])} |"
    assert ttft in text and "| TPOT (client) | 50 |" in text
    assert "| TTFT (server) |" in text and "| TPOT (server) |" in text
    assert "**140.1 tokens/s** generated" in text
    assert "Finish reasons: length 50, stop 1." in text
    assert "### Per answer length" in text and "| 64-128 | 10 |" in text
    assert "| UNAVAILABLE | no worker | 1 |" in text
    assert "temperature 0.70" in text and "stop 'User:'" in text and ", streamed" in text
    assert "length mix" not in text
    console = markdown.console_generation(doc).splitlines()
    assert console[0].split() == ["ms", "n", "p50", "p90", "p99", "mean", "max"]
    assert console[1].startswith("TTFT (client)") and console[2].startswith("TPOT (client)")
    assert console[-1].startswith("140.1 tokens/s generated")
    unstreamed = markdown.render(document(stream=False))
    assert "not streamed" in unstreamed and "Not streamed: the client's TTFT" in unstreamed


def test_other_scenarios_have_no_generation_section() -> None:
    from tests.unit.test_bench_report import document as steady_document

    doc = steady_document()
    assert doc["generation"] is None
    assert "## Generation" not in markdown.render(doc)
    assert markdown.console_generation(doc) == ""


def test_generation_plots_draw_from_the_report(tmp_path: Path) -> None:
    doc = document()
    for name, draw in plots.GENERATION_PLOTS.items():
        fig, ax = plots._figure()
        draw(doc, ax)
        fig.savefig(tmp_path / name, dpi=40)
        assert (tmp_path / name).stat().st_size > 0
    labels = ax.get_legend_handles_labels()[1]
    assert labels[:2] == ["client", "server"] and labels[2].startswith("client p50")
    empty = {**doc, "generation": {**doc["generation"], "quantiles": {}}}
    fig, ax = plots._figure()
    plots.ttft_distribution(empty, ax)
    assert "no time to first token values" in ax.texts[0].get_text()


# -- options --------------------------------------------------------------------------------


def test_max_new_tokens_takes_a_number_a_range_or_a_mix() -> None:
    assert parse_max_new_tokens("128") == (("128", 1.0),)
    assert parse_max_new_tokens(" 16-64 ") == (("16-64", 1.0),)
    assert parse_max_new_tokens("16-64=3,256=1") == (("16-64", 0.75), ("256", 0.25))
    assert parse_max_new_tokens("8-8,32") == (("8", 0.5), ("32", 0.5))
    assert span("16-64") == (16, 64) and span("7") == (7, 7)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0", "1 <= MIN <= MAX"),
        ("64-16", "1 <= MIN <= MAX"),
        ("many", "expected N or MIN-MAX"),
        ("16-", "expected N or MIN-MAX"),
        ("16=x", "not a number"),
        ("16=-1", ">= 0"),
        ("16=0", "at least one share"),
        ("16,16", "given twice"),
    ],
)
def test_bad_max_new_tokens_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_max_new_tokens(text)


def test_stop_is_a_string_or_a_json_list() -> None:
    assert parse_stop("User:") == "User:"
    assert parse_stop('["\\n\\n", "User:"]') == '["\\n\\n", "User:"]'
    for bad in ("[", "[]", '["a", 1]', '[""]'):
        with pytest.raises(ValueError, match="--stop"):
            parse_stop(bad)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"temperature": -0.1}, "--temperature"),
        ({"temperature": math.nan}, "--temperature"),
        ({"top_p": 0.0}, "--top-p"),
        ({"top_p": 1.5}, "--top-p"),
        ({"rate_rps": -1.0}, "--rate"),
        ({"prompts": ()}, "--prompts"),
        ({"prompts": ("ok", "  ")}, "--prompts"),
        ({"max_new_tokens": ()}, "--max-new-tokens"),
        ({"stop": "[oops"}, "--stop"),
    ],
)
def test_plan_refuses_bad_values(plan: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GenerationPlan(**plan)


def test_prompts_from_a_text_or_a_jsonl_file(tmp_path: Path) -> None:
    text = tmp_path / "p.txt"
    text.write_text("first prompt\n\n  second prompt  \n")
    assert load_prompts(text) == ("first prompt", "second prompt")
    lines = tmp_path / "p.jsonl"
    lines.write_text('"one"\n{"prompt": "two\\nlines"}\n\n')
    assert load_prompts(lines) == ("one", "two\nlines")
    lines.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:1: expected a non-empty string"):
        load_prompts(lines)
    lines.write_text("not json\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: not a JSON line"):
        load_prompts(lines)
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(tmp_path / "empty.txt")
    with pytest.raises(ValueError, match="cannot read"):
        load_prompts(tmp_path / "missing.txt")


def test_generate_timeout_and_bounds_default_longer() -> None:
    assert timeout_for("generate", None) == 120.0 and timeout_for("steady", None) == 10.0
    assert timeout_for("generate", 3.0) == 3.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--top-p", "2"], "--top-p must be in (0, 1]"),
        (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
        (["--concurrency", "2", "--rate", "1"], "not both"),
        (["--rate", "0"], "--rate must be > 0"),
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--prompts", "/nonexistent/prompts.txt"], "cannot read it"),
    ],
)
def test_cli_refuses_bad_values(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "generate", "--model", "smollm2", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-new-tokens", "0"], "1 <= MIN <= MAX"),
        (["--max-new-tokens", "64-16=1"], "1 <= MIN <= MAX"),
        (["--stop", "[1]"], "JSON list of non-empty strings"),
    ],
)
def test_cli_refuses_bad_option_syntax(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "generate", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# -- the requests ---------------------------------------------------------------------------


def test_workload_is_seeded_and_asks_for_the_plan() -> None:
    plan = GenerationPlan(
        prompts=("a", "b", "c"),
        max_new_tokens=(("16-48", 0.5), ("200", 0.5)),
        temperature=0.7,
        top_p=0.9,
        stop="User:",
    )
    first = [next(w) for w in [GenWorkload(PROMPT, plan, seed=3)] for _ in range(100)]
    again = [next(w) for w in [GenWorkload(PROMPT, plan, seed=3)] for _ in range(100)]
    assert [dict(s.parameters) for s in first] == [dict(s.parameters) for s in again]
    assert [s.inputs[0].array.tolist() for s in first] == [
        s.inputs[0].array.tolist() for s in again
    ]
    assert sum(s.length == "200" for s in first) == 50  # exact shares per block
    for s in first:
        p = s.parameters
        lo, hi = span(s.length)
        assert lo <= int(p["max_new_tokens"]) <= hi and p["temperature"] == 0.7
        assert p["top_p"] == 0.9 and p["stop"] == "User:" and isinstance(p["seed"], int)
        assert s.inputs[0].name == "text_input" and s.inputs[0].array.shape == (1,)
    # Every prompt once per pass through them.
    passes = [sorted(s.inputs[0].array[0] for s in first[i : i + 3]) for i in range(0, 99, 3)]
    assert all(p == [b"a", b"b", b"c"] for p in passes)
    other = [next(w) for w in [GenWorkload(PROMPT, plan, seed=4)] for _ in range(20)]
    assert [s.parameters["seed"] for s in other] != [s.parameters["seed"] for s in first[:20]]


def test_warm_up_workload_caps_answers_and_batched_inputs_get_a_batch_of_one() -> None:
    plan = GenerationPlan(max_new_tokens=(("100-200", 1.0),))
    batched = InputSpec("text_input", "BYTES", (-1, 1))
    spec = next(GenWorkload(batched, plan, seed=0, priorities=((2, 1.0),), cap=8))
    assert spec.parameters["max_new_tokens"] == 8 and spec.priority == 2
    assert spec.inputs[0].array.shape == (1, 1) and "stop" not in spec.parameters
