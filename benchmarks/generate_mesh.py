"""Continuous batching through the whole mesh (issue 11, acceptance 2), SmolLM2-135M-Instruct.

Starts `tiermesh up` (center worker only) on a repository holding the fetched smollm2
(models/smollm2, `tiermesh models fetch smollm2`), then, over tritonclient's gRPC stream,
greedy, for each round:

1. solo: the requests one at a time (each waits for the previous one's final response);
   each request's end-to-end time and time to first token, as the client sees them.
2. together: all of them sent at once on one stream; the same times, from the send.

The requests ask for very different max_new_tokens (`--lengths`); `--copies K` sends K
copies of each in the together phase (8K requests for the 8 slots, new ones joining as
others finish: sustained load). Prints per request the median solo and together times,
and generated tokens/s of both phases and their ratio (median over `--rounds`). Both phases
generate the same tokens (greedy), and the counts are checked equal. Asserts nothing else.

    .venv/bin/python benchmarks/generate_mesh.py [--rounds 3] [--copies 1]
        [--lengths 8,96,16,64,32,128,12,48] [--set step_tokens=128 ...]
"""

from __future__ import annotations

import argparse
import asyncio
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
import yaml
from tritonclient.grpc import InferInput

from tiermesh.core.model_files import mirror_files
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
DEFAULT_LENGTHS = "8,96,16,64,32,128,12,48"


@dataclass
class Timed:
    sent: float
    first: float = 0.0
    end: float = 0.0
    tokens: int = 0


@dataclass
class Phase:
    wall_s: float
    times: dict[str, Timed] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(t.tokens for t in self.times.values())


def request(rid: str, prompt: str, n: int) -> dict[str, Any]:
    t = InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    return {
        "model_name": MODEL,
        "inputs": [t],
        "request_id": rid,
        "parameters": {"max_new_tokens": n},
    }


async def run(client: grpcaio.InferenceServerClient, asks: list[tuple[str, str, int]]) -> Phase:
    """Send `asks` (id, prompt, max_new_tokens) on one stream at once; their times."""
    times: dict[str, Timed] = {}
    start = time.perf_counter()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for rid, prompt, n in asks:
            times[rid] = Timed(time.perf_counter())
            yield request(rid, prompt, n)

    pending = len(asks)
    async for result, error in client.stream_infer(requests()):
        if error is not None:
            raise RuntimeError(str(error))
        now = time.perf_counter()
        resp = result.get_response()
        timed = times[resp.id]
        if not timed.first and result.as_numpy("text_output")[0]:
            timed.first = now
        final = resp.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            timed.end = now
            timed.tokens = int(resp.parameters["tiermesh.generated_tokens"].int64_param)
            pending -= 1
            if not pending:
                break
    return Phase(time.perf_counter() - start, times)


async def one_round(
    client: grpcaio.InferenceServerClient, lengths: list[int], copies: int
) -> tuple[Phase, Phase]:
    asks = [(f"r{i}", QUESTIONS[i % len(QUESTIONS)], n) for i, n in enumerate(lengths)]
    solo = Phase(0.0)
    for ask in asks:
        phase = await run(client, [ask])
        solo.wall_s += phase.wall_s
        solo.times.update(phase.times)
    together = await run(
        client, [(f"{rid}.{c}", q, n) for c in range(copies) for rid, q, n in asks]
    )
    return solo, together


async def bench(args: argparse.Namespace) -> None:
    lengths = [int(x) for x in args.lengths.split(",")]
    with tempfile.TemporaryDirectory(prefix="tiermesh-gen-") as tmp:
        repo = Path(tmp) / "models"
        (repo / MODEL).mkdir(parents=True)
        raw = yaml.safe_load((ROOT / "models" / MODEL / "config.yaml").read_text())
        raw["generation"].update(args.set)
        (repo / MODEL / "config.yaml").write_text(yaml.safe_dump(raw))
        mirror_files(ROOT / "models" / MODEL / "1", repo / MODEL / "1")
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
            await run(client, [("warmup", QUESTIONS[0], 4)])
            for r in range(args.rounds):
                rounds.append(await one_round(client, lengths, args.copies))
                solo, together = rounds[-1]
                print(
                    f"round {r + 1}: solo {solo.tokens / solo.wall_s:.1f} tok/s, together "
                    f"{together.tokens / together.wall_s:.1f} tok/s",
                    file=sys.stderr,
                )
        finally:
            await client.close()
            mesh.stop()
    report(rounds, lengths, args.copies, args.set)


def report(
    rounds: list[tuple[Phase, Phase]], lengths: list[int], copies: int, settings: dict[str, int]
) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    print(
        f"generate_mesh {time.strftime('%Y-%m-%d %H:%M')}, {len(rounds)} rounds, "
        f"copies {copies}, settings {settings or 'as configured'}"
    )
    print(
        "| request | max_new_tokens | tokens | solo e2e s | together e2e s | solo TTFT ms |"
        " together TTFT ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, n in enumerate(lengths):
        rid = f"r{i}"
        solo = [s.times[rid] for s, _ in rounds]
        together = [t.times[f"{rid}.0"] for _, t in rounds]
        print(
            f"| {rid} | {n} | {solo[0].tokens} "
            f"| {med([x.end - x.sent for x in solo]):.2f} "
            f"| {med([x.end - x.sent for x in together]):.2f} "
            f"| {med([(x.first - x.sent) * 1000 for x in solo]):.0f} "
            f"| {med([(x.first - x.sent) * 1000 for x in together]):.0f} |"
        )
    solo_rate = [s.tokens / s.wall_s for s, _ in rounds]
    together_rate = [t.tokens / t.wall_s for _, t in rounds]
    ratios = [b / a for a, b in zip(solo_rate, together_rate, strict=True)]
    same = all(t.tokens == copies * s.tokens for s, t in rounds)
    print(
        f"\ngenerated tokens/s: one at a time {med(solo_rate):.1f}, together "
        f"{med(together_rate):.1f}: **{med(ratios):.2f}x** (rounds: "
        + " / ".join(f"{r:.2f}" for r in ratios)
        + f"); same token counts: {same}"
    )


def _setting(text: str) -> tuple[str, int]:
    key, _, value = text.partition("=")
    return key, int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--copies", type=int, default=1)
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
