"""One bench run, from its config to a report directory.

Connects, reads the model's inputs, warms up (not recorded), runs the scenario with a
progress bar, then writes report.json, summary.md and the plots. Ctrl-C once stops new
requests and still writes the report of what was measured; twice abandons the run.
The generate scenario sends generation requests (`GenWorkload`, `GenSender`) to a
generative model, closed loop at `--concurrency` or open loop at `--rate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tqdm import tqdm

from tiermesh.bench import arrivals, cost, cpu, markdown, plots, report, runner
from tiermesh.bench.calls import BenchError, GenSender, Sender, generative_model, model_inputs
from tiermesh.bench.config import BenchConfig
from tiermesh.bench.genwork import WARMUP_MAX_NEW_TOKENS, GenWorkload
from tiermesh.bench.metrics import QueueDepthSampler
from tiermesh.bench.records import Record
from tiermesh.bench.workload import InputSpec, RequestSpec, Workload

# The warm-up's requests come from their own stream, so the measured sequence is the same
# whatever the warm-up count.
WARMUP_SEED_OFFSET = 1_000_003
ARRIVALS_SEED_OFFSET = 2_000_003


@dataclass(frozen=True)
class Written:
    out_dir: Path
    report: dict[str, Any]


class Progress:
    """A tqdm bar on stderr, only when stderr is a terminal."""

    def __init__(self, total: int | None, enabled: bool) -> None:
        self._bar = tqdm(
            total=total,
            file=sys.stderr,
            disable=not (enabled and sys.stderr.isatty()),
            unit="req",
            dynamic_ncols=True,
            leave=True,
        )
        self._errors = 0

    def record(self, rec: Record) -> None:
        self._bar.update(1)
        if not rec.ok:
            self._errors += 1
            self._bar.set_postfix(errors=self._errors, refresh=False)

    def step(self, index: int, concurrency: int) -> None:
        self._bar.set_description(f"step {index} c={concurrency}")

    def close(self) -> None:
        self._bar.close()


def _progress_total(cfg: BenchConfig) -> int | None:
    if cfg.scenario == "soak":
        return None  # ends on time; a count bar would sit near empty
    plan = cfg.arrival_plan
    if plan is not None:
        return min(cfg.requests, round(arrivals.expected_count(plan, cfg.duration_s)))
    return cfg.requests


@contextlib.contextmanager
def _interrupts(recorder: runner.RunRecorder) -> Iterator[None]:
    """First SIGINT: halt the recorder (no new requests); second: cancel the run."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def on_sigint() -> None:
        if recorder.halted and task is not None:
            task.cancel()
        recorder.halt()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        installed = False
    try:
        yield
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)


async def _scenario(
    cfg: BenchConfig,
    send: runner.Send,
    workload: Iterator[RequestSpec],
    recorder: runner.RunRecorder,
    bar: Progress,
) -> runner.LadderResult | None:
    until = recorder.clock() + cfg.duration_s
    if cfg.scenario == "ladder":
        return await runner.ladder(
            send, workload, recorder, cfg.ladder, limit=cfg.requests, until=until, on_step=bar.step
        )
    plan = cfg.arrival_plan
    if plan is not None:
        rng = np.random.default_rng(cfg.seed + ARRIVALS_SEED_OFFSET)
        times = arrivals.arrival_times(plan, cfg.duration_s, cfg.requests, rng)
        await runner.open_loop(send, workload, recorder, times, max_in_flight=cfg.max_in_flight)
        return None
    await runner.closed_loop(
        send, workload, recorder, concurrency=cfg.callers, limit=cfg.requests, until=until
    )
    return None


async def _warm_up(cfg: BenchConfig, send: runner.Send, workload: Iterator[RequestSpec]) -> None:
    if cfg.warmup == 0:
        return
    scratch = runner.RunRecorder()
    await runner.closed_loop(
        send,
        workload,
        scratch,
        concurrency=min(cfg.callers, cfg.warmup),
        limit=cfg.warmup,
        until=scratch.clock() + cfg.duration_s,
    )


async def _prepare(
    client: grpcaio.InferenceServerClient, cfg: BenchConfig
) -> tuple[Sequence[InputSpec], Workload | GenWorkload, Workload | GenWorkload, runner.Send]:
    """The model's inputs, the measured and the warm-up workloads, and the sender;
    BenchError when the model cannot take the scenario's requests."""
    if cfg.scenario == "generate":
        target = await generative_model(client, cfg.model)
        if cfg.generation.stream and target.decoupled is False:
            raise BenchError(
                f"model {cfg.model!r} is not decoupled (its ModelConfig says so): it cannot "
                "stream; use --no-stream"
            )
        gen = cfg.generation
        return (
            [target.prompt],
            GenWorkload(target.prompt, gen, cfg.seed, cfg.priorities),
            GenWorkload(
                target.prompt,
                gen,
                cfg.seed + WARMUP_SEED_OFFSET,
                cfg.priorities,
                cap=WARMUP_MAX_NEW_TOKENS,
            ),
            GenSender(
                client, cfg.model, target, cfg.timeout_s, stream=gen.stream, variant=cfg.variant
            ),
        )
    inputs = await model_inputs(client, cfg.model)
    try:
        workload = Workload(inputs, cfg.seed, cfg.mix, cfg.priorities, cfg.lengths)
        warm = Workload(inputs, cfg.seed + WARMUP_SEED_OFFSET, cfg.mix, cfg.priorities, cfg.lengths)
    except ValueError as exc:
        raise BenchError(f"model {cfg.model!r}: {exc}") from None
    return inputs, workload, warm, Sender(client, cfg.model, cfg.timeout_s, cfg.variant)


async def measure(cfg: BenchConfig) -> report.RunResult:
    """Runs the scenario against the mesh; raises calls.BenchError when it cannot start."""
    client = grpcaio.InferenceServerClient(cfg.url)
    try:
        inputs, workload, warm, send = await _prepare(client, cfg)
        await _warm_up(cfg, send, warm)

        bar = Progress(_progress_total(cfg), cfg.progress)
        recorder = runner.RunRecorder(on_record=bar.record)
        sampler = (
            QueueDepthSampler(
                cfg.metrics_url, cfg.metrics_interval_s, recorder.origin, {"model": cfg.model}
            )
            if cfg.metrics_url
            else None
        )
        started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        mesh_before = await asyncio.to_thread(cost.read_cpu, cfg.mesh_metrics)
        before = cpu.sample()
        try:
            async with asyncio.TaskGroup() as group:
                sampling = group.create_task(sampler.run()) if sampler is not None else None
                with _interrupts(recorder):
                    result = await _scenario(cfg, send, workload, recorder, bar)
                if sampling is not None:
                    sampling.cancel()
        finally:
            bar.close()
        wall_s = recorder.now()
        after = cpu.sample()
        mesh_after = await asyncio.to_thread(cost.read_cpu, cfg.mesh_metrics)
    finally:
        await client.close()
    records = recorder.records
    spent = cost.run_cost(
        cfg.mesh_metrics, cfg.prices_file, records, mesh_before, mesh_after, wall_s
    )
    return report.RunResult(
        config=cfg.as_dict(),
        records=records,
        wall_s=wall_s,
        cpu=cpu.usage(before, after, sum(1 for r in records if r.sent)),
        started_at=started_at,
        text_model=workload.text,
        inputs=[{"name": i.name, "datatype": i.datatype, "shape": list(i.shape)} for i in inputs],
        interrupted=recorder.halted,
        ladder_plan=cfg.ladder if cfg.scenario == "ladder" else None,
        ladder_steps=result.steps if result is not None else [],
        ladder_stop=result.stop_reason if result is not None else "",
        metrics_url=cfg.metrics_url,
        metrics_samples=sampler.samples if sampler is not None else [],
        metrics_error=sampler.error if sampler is not None else "",
        cost=spent,
    )


def write(run: report.RunResult, out_dir: Path) -> Written:
    """report.json, the plots and summary.md into `out_dir`."""
    doc = report.clean(report.build(run))
    doc["plots"] = plots.render_all(doc, out_dir)
    report.write_json(doc, out_dir)
    (out_dir / report.SUMMARY_MD).write_text(markdown.render(doc))
    return Written(out_dir, doc)


def run(cfg: BenchConfig) -> Written:
    """The whole bench: measure, then write the report directory."""
    try:
        measured = asyncio.run(measure(cfg))
    except asyncio.CancelledError:  # a second Ctrl-C cancelled the run
        raise KeyboardInterrupt from None
    return write(measured, cfg.out_dir)
