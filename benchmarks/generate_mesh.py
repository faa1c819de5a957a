"""Continuous batching through the whole mesh (issues 11 and 23), SmolLM2-135M-Instruct.

Starts `tiermesh up` (center worker only) on a repository holding the fetched smollm2
(models/smollm2, `tiermesh models fetch smollm2`), then, over tritonclient's gRPC streams,
greedy, for each round:

1. solo: the requests one at a time (each waits for the previous one's final response);
   each request's end-to-end time and time to first token, as the client sees them.
2. streams: `--streams N` client streams at once (8 by default), each sending all the
   requests one after another (stream k starts at the k-th, so every stream asks for the
   same tokens in all): N concurrent closed-loop callers, the same times per request.
3. probe (issue 23, acceptance 4): a short answer (`--probe-tokens`, 16) alone, `--probes`
   times; then N long answers (`--long-tokens`) kept running by N closed-loop streams, and,
   once every one of them has its first token, the same short answer `--probes` times, one
   after another: its time to first token beside the N streams against alone.

The requests ask for very different max_new_tokens (`--lengths`). Prints per request the
median solo and streams times, the generated tokens/s of solo and streams and their ratio,
and the probe's TTFT alone, beside the N streams, and their ratio (medians over `--rounds`;
the probe's per round is the median of its probes). Solo and streams generate the same
tokens (greedy): the counts are checked equal. Asserts nothing else.

    .venv/bin/python benchmarks/generate_mesh.py [--rounds 3] [--streams 8]
        [--lengths 8,96,16,64,32,128,12,48] [--probes 5] [--set step_tokens=128 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import InferInput

from tiermesh.core.model_files import mirror_model
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2"
QUESTIONS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Describe the water cycle in detail, step by step.",
    "Explain what a hash table is and how collisions are handled.",
    "Give me ten tips for learning a new language, with examples.",
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle works, part by part.",
    "Describe a busy market in a city at dawn.",
    "Tell me about the history of the printing press.",
]
PROBE_QUESTION = "What is the capital of France? Answer in one sentence."
DEFAULT_LENGTHS = "8,96,16,64,32,128,12,48"
PROBE_TOKENS = 16

Ask = tuple[str, str, int]  # request id, prompt, max_new_tokens


@dataclass
class Timed:
    sent: float
    first: float = 0.0
    end: float = 0.0
    tokens: int = 0

    @property
    def ttft_ms(self) -> float:
        return (self.first - self.sent) * 1000


@dataclass
class Phase:
    wall_s: float
    times: dict[str, Timed] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.times.values())


@dataclass
class Probe:
    alone_ms: float  # median TTFT of the short answer alone
    beside_ms: float  # median TTFT of the short answer beside the long streams


def request(rid: str, prompt: str, n: int) -> dict[str, Any]:
    t = InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    return {
        "model_name": MODEL,
        "inputs": [t],
        "request_id": rid,
        "parameters": {"max_new_tokens": n},
    }


async def caller(
    client: grpcaio.InferenceServerClient,
    asks: AsyncIterator[Ask],
    times: dict[str, Timed],
    on_first: asyncio.Event | None = None,
) -> None:
    """One closed-loop caller on one gRPC stream: sends the next ask once the previous one's
    final response came; records each ask's times in `times`. `on_first` is set at the
    first token of the first ask."""
    done = asyncio.Event()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        async for rid, prompt, n in asks:
            done.clear()
            times[rid] = Timed(time.perf_counter())
            yield request(rid, prompt, n)
            await done.wait()

    async for result, error in client.stream_infer(requests()):
        if error is not None:
            raise RuntimeError(str(error))
        now = time.perf_counter()
        resp = result.get_response()
        timed = times[resp.id]
        if not timed.first and result.as_numpy("text_output")[0]:
            timed.first = now
            if on_first is not None:
                on_first.set()
        final = resp.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            timed.end = now
            timed.tokens = int(resp.parameters["tiermesh.generated_tokens"].int64_param)
            done.set()


async def listed(asks: list[Ask]) -> AsyncIterator[Ask]:
    for ask in asks:
        yield ask


async def run(client: grpcaio.InferenceServerClient, streams: list[list[Ask]]) -> Phase:
    """Each list of asks on a stream of its own, all streams at once; their times."""
    phase = Phase(0.0)
    start = time.perf_counter()
    await asyncio.gather(*(caller(client, listed(asks), phase.times) for asks in streams))
    phase.wall_s = time.perf_counter() - start
    return phase


async def probe(
    client: grpcaio.InferenceServerClient, streams: int, long_tokens: int, probes: int, tag: str
) -> Probe:
    """The short answer's TTFT alone, then beside `streams` running long answers."""
    short = [(f"probe{tag}.{i}", PROBE_QUESTION, PROBE_TOKENS) for i in range(probes)]
    alone = Phase(0.0)
    for ask in short:
        alone.times.update((await run(client, [[ask]])).times)
    stop = asyncio.Event()
    started = [asyncio.Event() for _ in range(streams)]
    long_times: dict[str, Timed] = {}

    async def endless(k: int) -> AsyncIterator[Ask]:
        i = 0
        while not stop.is_set():
            yield (f"long{tag}.{k}.{i}", QUESTIONS[(k + i) % len(QUESTIONS)], long_tokens)
            i += 1

    longs = [
        asyncio.create_task(caller(client, endless(k), long_times, started[k]))
        for k in range(streams)
    ]
    try:
        for event in started:
            await event.wait()
        beside = Phase(0.0)
        for ask in [(f"{rid}b", q, n) for rid, q, n in short]:
            beside.times.update((await run(client, [[ask]])).times)
    finally:
        stop.set()
        await asyncio.gather(*longs)
    return Probe(
        statistics.median(t.ttft_ms for t in alone.times.values()),
        statistics.median(t.ttft_ms for t in beside.times.values()),
    )


async def one_round(
    client: grpcaio.InferenceServerClient, args: argparse.Namespace, r: int
) -> tuple[Phase, Phase, Probe]:
    lengths = [int(x) for x in args.lengths.split(",")]
    asks = [(f"r{i}", QUESTIONS[i % len(QUESTIONS)], n) for i, n in enumerate(lengths)]
    solo = Phase(0.0)
    for ask in asks:
        phase = await run(client, [[ask]])
        solo.wall_s += phase.wall_s
        solo.times.update(phase.times)
    rotated = [
        [(f"{rid}.{k}", q, n) for rid, q, n in asks[k % len(asks) :] + asks[: k % len(asks)]]
        for k in range(args.streams)
    ]
    together = await run(client, rotated)
    probed = await probe(client, args.streams, args.long_tokens, args.probes, str(r))
    return solo, together, probed


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="tiermesh-gen-") as tmp:
        repo = mirror_model(
            ROOT / "models" / MODEL,
            Path(tmp) / "models",
            lambda raw: raw["generation"].update(args.set),
        )
        port = free_port()
        mesh = Mesh(
            UpOptions(
                port=port,
                data_dir=Path(tmp) / "data",
                model_repository=repo,
                http_port=-1,
                metrics_port=0,
                tiers=("center",),
                grace_s=5.0,
            )
        )
        mesh.start()
        client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
        rounds = []
        try:
            await run(client, [[("warmup", QUESTIONS[0], 4)]])
            for r in range(args.rounds):
                rounds.append(await one_round(client, args, r))
                solo, together, probed = rounds[-1]
                print(
                    f"round {r + 1}: solo {solo.tokens / solo.wall_s:.1f} tok/s, "
                    f"{args.streams} streams {together.tokens / together.wall_s:.1f} tok/s; "
                    f"probe TTFT alone {probed.alone_ms:.0f} ms, beside "
                    f"{probed.beside_ms:.0f} ms",
                    file=sys.stderr,
                )
        finally:
            with contextlib.suppress(Exception):
                await client.close()
            mesh.stop()
    report(rounds, args)


def report(rounds: list[tuple[Phase, Phase, Probe]], args: argparse.Namespace) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    lengths = [int(x) for x in args.lengths.split(",")]
    n = args.streams
    print(
        f"generate_mesh {time.strftime('%Y-%m-%d %H:%M')}, {len(rounds)} rounds, "
        f"{n} streams, settings {args.set or 'as configured'}"
    )
    print(
        "| request | max_new_tokens | tokens | solo e2e s | streams e2e s | solo TTFT ms |"
        " streams TTFT ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, length in enumerate(lengths):
        rid = f"r{i}"
        solo = [s.times[rid] for s, _, _ in rounds]
        together = [t.times[f"{rid}.{k}"] for _, t, _ in rounds for k in range(n)]
        print(
            f"| {rid} | {length} | {solo[0].tokens} "
            f"| {med([x.end - x.sent for x in solo]):.2f} "
            f"| {med([x.end - x.sent for x in together]):.2f} "
            f"| {med([x.ttft_ms for x in solo]):.0f} "
            f"| {med([x.ttft_ms for x in together]):.0f} |"
        )
    solo_rate = [s.tokens / s.wall_s for s, _, _ in rounds]
    together_rate = [t.tokens / t.wall_s for _, t, _ in rounds]
    ratios = [b / a for a, b in zip(solo_rate, together_rate, strict=True)]
    same = all(t.tokens == n * s.tokens for s, t, _ in rounds)
    print(
        f"\ngenerated tokens/s: one at a time {med(solo_rate):.1f}, {n} streams "
        f"{med(together_rate):.1f}: **{med(ratios):.2f}x** (rounds: "
        + " / ".join(f"{r:.2f}" for r in ratios)
        + f"; issue 23 target >= 3x); same token counts: {same}"
    )
    alone = [p.alone_ms for _, _, p in rounds]
    beside = [p.beside_ms for _, _, p in rounds]
    probe_ratios = [b / a for a, b in zip(alone, beside, strict=True)]
    print(
        f"{PROBE_TOKENS}-token answer's TTFT: alone {med(alone):.0f} ms, beside {n} running "
        f"{args.long_tokens}-token answers {med(beside):.0f} ms: **{med(probe_ratios):.2f}x** "
        "(rounds: " + " / ".join(f"{r:.2f}" for r in probe_ratios) + "; issue 23 target <= 2x)"
    )


def _setting(text: str) -> tuple[str, int]:
    key, _, value = text.partition("=")
    return key, int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=8, help="concurrent callers")
    parser.add_argument("--probes", type=int, default=5, help="short answers per round")
    parser.add_argument("--long-tokens", type=int, default=128, help="the long answers' length")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS)
    parser.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        help="KEY=INT: override a generation setting of the config (e.g. step_tokens=128)",
    )
    args = parser.parse_args()
    args.set = dict(args.set)
    if not (ROOT / "models" / MODEL / "1" / "model.onnx").is_file():
        sys.exit("models/smollm2 is not fetched: run `tiermesh models fetch smollm2` first")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
