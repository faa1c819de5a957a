"""Raw onnxruntime on the converted MiniLM models: FP32 against INT8, L3 against L6.

For every model (--models) and variant (fp32 = model.onnx, int8 = model.int8.onnx) it
prints the file size, the session load time (median of --load-repeats creations) and the
sequences/s of direct `session.run` calls at batch 1 and batch 32 for 16, 64 and 256
tokens. Inputs are real token ids: one fixed English text, tokenized with the model's
tokenizer.json to exactly n tokens (text repeated, then truncated; [CLS] and [SEP]
included), attention mask all ones, the same row repeated to fill a batch.

Each of --repeats rounds measures every cell once (odd rounds in reverse order, so slow
drift of a shared machine does not favour one side): one warm-up call, then calls until
about --target-s seconds have passed and at least --min-calls were made. The table shows
the median over the rounds and the spread (min-max). Ratios (batch 32 / batch 1,
int8 / fp32, each model / the first model) are computed within each round, then the
median is taken. It asserts nothing: the numbers are for reading.

Every session is built with the worker's own `session_options` (intra-op spinning off).

    .venv/bin/python benchmarks/minilm_onnxruntime.py [--threads 2] [--repeats 3]
        [--models minilm-l6,minilm-l3] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from tiermesh.core.repository import ModelRepository
from tiermesh.worker.runner import session_options

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("minilm-l6", "minilm-l3")
DEFAULT_VARIANTS = ("fp32", "int8")
DEFAULT_LENGTHS = (16, 64, 256)
DEFAULT_BATCHES = (1, 32)
# Written for this benchmark; repeated until it yields enough tokens, then truncated.
TEXT = (
    "The harbour master counted the boats twice every morning, once when the fog was "
    "still lying on the water and once after the sun had burned it away. Fishermen "
    "argued about the price of diesel, the weather in the north, and whether the new "
    "breakwater would change the way the tide ran past the old lighthouse. Children "
    "sold lemonade near the ferry ramp while tourists photographed nets drying on "
    "wooden racks, and nobody seemed to notice the gulls stealing bread from the bakery."
)

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Cell:
    model: str
    variant: str
    tokens: int
    batch: int


@dataclass
class Measured:
    """All rounds of one cell: sequences/s and the number of timed calls per round."""

    seq_per_s: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)


@dataclass
class Loaded:
    """One model variant: its session (the last one created) and how it was loaded."""

    path: Path
    size_mb: float
    load_s: list[float]
    session: ort.InferenceSession
    input_names: tuple[str, ...]


# --- helpers ------------------------------------------------------------------------


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max); NaNs when there is nothing to summarise."""
    clean = [v for v in values if v == v]
    if not clean:
        nan = float("nan")
        return nan, nan, nan
    return statistics.median(clean), min(clean), max(clean)


def fmt_num(value: float) -> str:
    """Throughput figures: integers when large, a few significant digits when small."""
    if value != value:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_spread(values: Sequence[float], num: Callable[[float], str] = fmt_num) -> str:
    med, lo, hi = spread(values)
    if med != med:
        return "-"
    if len(values) == 1:
        return num(med)
    return f"{num(med)} [{num(lo)}-{num(hi)}]"


def fmt_ratio(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text columns, two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- inputs -------------------------------------------------------------------------


def token_rows(tokenizer_path: Path, lengths: Sequence[int]) -> dict[int, Ints]:
    """For each length n, the token ids of TEXT (repeated, truncated) as one [1, n] row."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    rows: dict[int, Ints] = {}
    for n in lengths:
        tokenizer.enable_truncation(n)
        text = TEXT
        ids = tokenizer.encode(text).ids
        while len(ids) < n:
            text = f"{text} {TEXT}"
            ids = tokenizer.encode(text).ids
        if len(ids) != n:
            raise SystemExit(f"{tokenizer_path}: got {len(ids)} tokens, wanted {n}")
        rows[n] = np.asarray(ids, dtype=np.int64).reshape(1, n)
    return rows


def feed_for(loaded: Loaded, row: Ints, batch: int) -> dict[str, Ints]:
    ids = np.ascontiguousarray(np.repeat(row, batch, axis=0))
    feeds: dict[str, Ints] = {}
    for name in loaded.input_names:
        if name == "input_ids":
            feeds[name] = ids
        elif name == "attention_mask":
            feeds[name] = np.ones_like(ids)
        elif name == "token_type_ids":
            feeds[name] = np.zeros_like(ids)
        else:
            raise SystemExit(f"{loaded.path}: unexpected input {name!r}")
    return feeds


# --- measuring ----------------------------------------------------------------------


def load_variant(path: Path, threads: int, repeats: int) -> Loaded:
    """Create the session `repeats` times (timing each); keep the last one."""
    times: list[float] = []
    session: ort.InferenceSession | None = None
    for _ in range(repeats):
        session = None  # let the previous session go before timing the next one
        t0 = time.perf_counter()
        session = ort.InferenceSession(
            str(path), session_options(threads), providers=["CPUExecutionProvider"]
        )
        times.append(time.perf_counter() - t0)
    assert session is not None
    return Loaded(
        path=path,
        size_mb=path.stat().st_size / 1e6,
        load_s=times,
        session=session,
        input_names=tuple(i.name for i in session.get_inputs()),
    )


def time_cell(
    session: ort.InferenceSession,
    feeds: dict[str, Ints],
    batch: int,
    target_s: float,
    min_calls: int,
) -> tuple[float, int]:
    """One warm-up call, then calls until target_s passed and min_calls were made.
    Returns (sequences/s, timed calls)."""
    session.run(None, feeds)
    calls = 0
    start = time.perf_counter()
    elapsed = 0.0
    while calls < min_calls or elapsed < target_s:
        session.run(None, feeds)
        calls += 1
        elapsed = time.perf_counter() - start
    return calls * batch / elapsed, calls


# --- ratios -------------------------------------------------------------------------


def per_round_ratio(num: Measured, den: Measured) -> list[float]:
    return [
        a / b if b > 0 else float("nan") for a, b in zip(num.seq_per_s, den.seq_per_s, strict=True)
    ]


def ratio_entry(values: list[float]) -> dict[str, Any]:
    med, lo, hi = spread(values)
    return {"per_round": values, "median": med, "min": lo, "max": hi}


# --- main ---------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--threads",
        type=int,
        default=2,
        help="intra-op threads per session (default 2, this machine's cores; 0 = ort default)",
    )
    p.add_argument("--repeats", type=int, default=None, help="rounds (default 3; --quick 2)")
    p.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help="comma-separated; ratios are against the first (default minilm-l6,minilm-l3)",
    )
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    p.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)))
    p.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    p.add_argument(
        "--target-s", type=float, default=None, help="timed seconds per cell and round (1.0)"
    )
    p.add_argument("--min-calls", type=int, default=None, help="timed calls per cell (2)")
    p.add_argument("--load-repeats", type=int, default=None, help="session creations (3)")
    p.add_argument("--quick", action="store_true", help="shorter run: 2 rounds, ~0.25 s cells")
    p.add_argument("--repo", type=Path, default=REPO_ROOT / "models")
    p.add_argument("--json", type=Path, default=None, help="write machine-readable results")
    args = p.parse_args(argv)
    quick = bool(args.quick)
    if args.repeats is None:
        args.repeats = 2 if quick else 3
    if args.target_s is None:
        args.target_s = 0.25 if quick else 1.0
    if args.min_calls is None:
        args.min_calls = 1 if quick else 2
    if args.load_repeats is None:
        args.load_repeats = 1 if quick else 3
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wall_start = time.perf_counter()
    models = [m for m in args.models.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    batches = [int(x) for x in args.batches.split(",") if x]
    threads: int = args.threads
    load_before = os.getloadavg()

    repo = ModelRepository(args.repo)
    repo.load()
    max_length: dict[str, int] = {}
    rows: dict[str, dict[int, Ints]] = {}
    loaded: dict[tuple[str, str], Loaded] = {}
    for model in models:
        cfg = repo.get(model)
        if cfg is None or cfg.tokenize is None:
            raise SystemExit(f"{model}: no such text model in {args.repo}")
        progress(f"checking {model} files against their sha256 ...")
        folder = repo.checked_folder(model)
        max_length[model] = cfg.tokenize.max_length
        rows[model] = token_rows(folder / cfg.tokenize.tokenizer_file, lengths)
        for variant in variants:
            if variant not in cfg.variants:
                raise SystemExit(f"{model}: no variant {variant!r}")
            progress(f"loading {model} {variant} x{args.load_repeats} ...")
            loaded[model, variant] = load_variant(
                folder / cfg.variants[variant], threads, args.load_repeats
            )

    cells = [Cell(m, v, n, b) for m in models for v in variants for n in lengths for b in batches]
    feeds = {
        c: feed_for(loaded[c.model, c.variant], rows[c.model][c.tokens], c.batch) for c in cells
    }
    results = {c: Measured() for c in cells}
    for r in range(args.repeats):
        progress(f"round {r + 1}/{args.repeats} ...")
        order = cells if r % 2 == 0 else list(reversed(cells))
        for c in order:
            rate, calls = time_cell(
                loaded[c.model, c.variant].session, feeds[c], c.batch, args.target_s, args.min_calls
            )
            results[c].seq_per_s.append(rate)
            results[c].calls.append(calls)

    # Ratios, each computed within a round, then summarised over the rounds.
    b_lo, b_hi = min(batches), max(batches)
    batch_ratio = {
        (m, v, n): per_round_ratio(results[Cell(m, v, n, b_hi)], results[Cell(m, v, n, b_lo)])
        for m in models
        for v in variants
        for n in lengths
    }
    base_v, other_vs = variants[0], variants[1:]
    variant_ratio = {
        (m, v, n, b): per_round_ratio(results[Cell(m, v, n, b)], results[Cell(m, base_v, n, b)])
        for m in models
        for v in other_vs
        for n in lengths
        for b in batches
    }
    base_m, other_ms = models[0], models[1:]
    model_ratio = {
        (m, v, n, b): per_round_ratio(results[Cell(m, v, n, b)], results[Cell(base_m, v, n, b)])
        for m in other_ms
        for v in variants
        for n in lengths
        for b in batches
    }
    load_after = os.getloadavg()
    wall_s = time.perf_counter() - wall_start

    # --- the report ---------------------------------------------------------------
    def len_label(model: str, n: int) -> str:
        return f"{n}*" if n > max_length[model] else str(n)

    print(
        f"MiniLM on raw onnxruntime {ort.__version__} (CPUExecutionProvider), "
        f"intra-op threads {threads or 'ort default'} (spinning off), {os.cpu_count()} CPUs; "
        f"{args.repeats} rounds, ~{args.target_s:g} s and >= {args.min_calls} calls per cell"
    )
    print(
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
        f"wall time {wall_s:.0f} s"
    )
    print()
    print(f"Files and session load time (s, median of {args.load_repeats} [min-max])")
    print(
        table(
            ["model", "variant", "file MB", "load s", "max_length"],
            [
                [
                    m,
                    v,
                    f"{loaded[m, v].size_mb:.1f}",
                    fmt_spread(loaded[m, v].load_s, lambda x: f"{x:.2f}"),
                    str(max_length[m]),
                ]
                for m in models
                for v in variants
            ],
        )
    )
    print()
    print(f"Sequences/s, median [min-max] over {args.repeats} rounds")
    headers = ["model", "variant", "tokens", *(f"batch {b}" for b in batches)]
    if len(batches) > 1:
        headers.append(f"b{b_hi}/b{b_lo}")
    tp_rows = []
    for m in models:
        for v in variants:
            for n in lengths:
                row = [m, v, len_label(m, n)]
                row += [fmt_spread(results[Cell(m, v, n, b)].seq_per_s) for b in batches]
                if len(batches) > 1:
                    row.append(fmt_spread(batch_ratio[m, v, n], fmt_ratio))
                tp_rows.append(row)
    print(table(headers, tp_rows))
    past = [m for m in models if any(n > max_length[m] for n in lengths)]
    for m in past:
        print(
            f"  * {m}: past its configured max_length {max_length[m]} "
            "(the graph accepts up to 512 positions; the mesh never sends this)"
        )

    ratio_headers = ["model", "tokens", *(f"batch {b}" for b in batches)]
    for v in other_vs:
        print()
        print(f"{v} / {base_v} sequences/s, per-round ratio, median [min-max]")
        print(
            table(
                ratio_headers,
                [
                    [m, len_label(m, n)]
                    + [fmt_spread(variant_ratio[m, v, n, b], fmt_ratio) for b in batches]
                    for m in models
                    for n in lengths
                ],
            )
        )
    for m in other_ms:
        print()
        print(f"{m} / {base_m} sequences/s, per-round ratio, median [min-max]")
        print(
            table(
                ["variant", "tokens", *(f"batch {b}" for b in batches)],
                [
                    [v, len_label(m, n)]
                    + [fmt_spread(model_ratio[m, v, n, b], fmt_ratio) for b in batches]
                    for v in variants
                    for n in lengths
                ],
            )
        )

    if args.json:
        doc: dict[str, Any] = {
            "onnxruntime": ort.__version__,
            "threads": threads,
            "cpus": os.cpu_count(),
            "repeats": args.repeats,
            "target_s": args.target_s,
            "min_calls": args.min_calls,
            "load_average_before": load_before,
            "load_average_after": load_after,
            "wall_s": wall_s,
            "variants": [
                {
                    "model": m,
                    "variant": v,
                    "path": str(loaded[m, v].path),
                    "size_mb": loaded[m, v].size_mb,
                    "load_s": loaded[m, v].load_s,
                    "load_s_median": statistics.median(loaded[m, v].load_s),
                    "max_length": max_length[m],
                }
                for m in models
                for v in variants
            ],
            "cells": [
                {
                    "model": c.model,
                    "variant": c.variant,
                    "tokens": c.tokens,
                    "batch": c.batch,
                    "past_max_length": c.tokens > max_length[c.model],
                    "seq_per_s": results[c].seq_per_s,
                    "calls": results[c].calls,
                    "median": spread(results[c].seq_per_s)[0],
                }
                for c in cells
            ],
            "ratios": {
                "batch": [
                    {"model": m, "variant": v, "tokens": n, "num_batch": b_hi, "den_batch": b_lo}
                    | ratio_entry(vals)
                    for (m, v, n), vals in batch_ratio.items()
                ],
                "variant": [
                    {"model": m, "variant": v, "base": base_v, "tokens": n, "batch": b}
                    | ratio_entry(vals)
                    for (m, v, n, b), vals in variant_ratio.items()
                ],
                "model": [
                    {"model": m, "base": base_m, "variant": v, "tokens": n, "batch": b}
                    | ratio_entry(vals)
                    for (m, v, n, b), vals in model_ratio.items()
                ],
            },
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        progress(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
