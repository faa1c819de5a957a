"""`tiermesh bench replay CAPTURE`: a captured trace (tiermesh bench capture export) driven
against the mesh again, open loop, with the captured inter-arrival times (divided by
`--speed`) and synthesised inputs of the captured sizes: text of the captured token count
(the bench's words are one token each: tokens - [CLS] - [SEP] words per text), numeric
tensors of the captured shapes. Requests keep their captured model and priority; the
router chooses tier and variant again, so a change under judgement (a new variant, batch
settings, tier thresholds) shows. The report is the bench's own (`replay` scenario) and
`tiermesh bench compare` judges two replays of one capture.

The pure parts (`load`, `replayable`, `schedule`, `size_label`, `CaptureWorkload`) take no
network; `measure` runs it.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio

from tiermesh.bench import cost, cpu, report, runner
from tiermesh.bench.calls import Sender
from tiermesh.bench.records import Outcome
from tiermesh.bench.workload import (
    _DTYPES,
    DEFAULT_LENGTHS,
    NUMERIC,
    RequestSpec,
    WorkloadTensor,
    make_text,
)

# Special tokens a WordPiece encoder adds around each text ([CLS] ... [SEP]).
SPECIAL_TOKENS = 2


def load(path: Path) -> list[dict[str, Any]]:
    """The records of a capture export (JSON lines), in arrival order; ValueError when the
    file is not one."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the capture ({exc})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{path}:{n}: not a capture record") from None
        if not isinstance(rec, dict) or "t_ms" not in rec or "model" not in rec:
            raise ValueError(f"{path}:{n}: not a capture record")
        out.append(rec)
    return sorted(out, key=lambda r: float(r["t_ms"]))


def replayable(
    records: Sequence[dict[str, Any]], model: str = ""
) -> tuple[list[dict[str, Any]], int]:
    """The records that can be sent again (their inputs are known: the request got past
    validation), of `model` when given; and how many were left out."""
    keep = [
        r
        for r in records
        if r.get("inputs") and r.get("priority") is not None and (not model or r["model"] == model)
    ]
    return keep, len(records) - len(keep)


def schedule(records: Sequence[dict[str, Any]], speed: float = 1.0) -> list[float]:
    """Send times (s from the start) with the captured gaps divided by `speed`."""
    if speed <= 0:
        raise ValueError("--speed must be positive")
    if not records:
        return []
    t0 = float(records[0]["t_ms"])
    return [(float(r["t_ms"]) - t0) / 1000.0 / speed for r in records]


def _elements(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def words_per_text(record: dict[str, Any], item: dict[str, Any]) -> int:
    """How many words each text of a BYTES input gets: the router's token count less the
    special tokens when captured, else the captured word count."""
    count = _elements(item["shape"])
    tokens = record.get("tokens")
    if tokens:
        return max(1, round(int(tokens) / count) - SPECIAL_TOKENS)
    return max(1, round(int(item.get("words") or 1) / count))


def size_label(record: dict[str, Any]) -> str:
    """The bench's length class of a request (numeric for models without text input)."""
    texts = [i for i in record["inputs"] if i["datatype"] == "BYTES"]
    if not texts:
        return NUMERIC
    words = words_per_text(record, texts[0])
    for label, (_, hi) in DEFAULT_LENGTHS.items():
        if words <= hi:
            return label
    return list(DEFAULT_LENGTHS)[-1]


def size_class(record: dict[str, Any]) -> str:
    """A size histogram's bin: the token count rounded up to a power of two for text, the
    input shapes otherwise."""
    texts = [i for i in record.get("inputs") or () if i["datatype"] == "BYTES"]
    if texts and record.get("tokens"):
        return f"tokens<={1 << max(0, int(record['tokens']) - 1).bit_length()}"
    if texts:
        return f"words={sum(int(i.get('words') or 0) for i in texts)}"
    return "shape=" + ";".join(
        "x".join(str(d) for d in i["shape"]) for i in record.get("inputs") or ()
    )


def histogram(records: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    """Shares of the records per `size` class or per `priority`."""
    if key == "size":
        counts = Counter(size_class(r) for r in records)
    else:
        counts = Counter(str(r.get(key)) for r in records)
    total = sum(counts.values())
    return {k: v / total for k, v in sorted(counts.items())} if total else {}


class CaptureWorkload:
    """The captured requests in order, with seeded synthetic inputs of their sizes."""

    def __init__(self, records: Sequence[dict[str, Any]], seed: int = 0) -> None:
        self._records = list(records)
        self._rng = np.random.default_rng(seed)
        self._index = 0

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        if self._index >= len(self._records):
            raise StopIteration
        rec = self._records[self._index]
        tensors = tuple(self._tensor(rec, item) for item in rec["inputs"])
        spec = RequestSpec(self._index, size_label(rec), int(rec["priority"]), tensors)
        self._index += 1
        return spec

    def _tensor(self, rec: dict[str, Any], item: dict[str, Any]) -> WorkloadTensor:
        shape = tuple(int(d) for d in item["shape"])
        if item["datatype"] == "BYTES":
            words = words_per_text(rec, item)
            texts = [make_text(self._rng, words).encode() for _ in range(_elements(shape))]
            return WorkloadTensor(
                item["name"], "BYTES", np.array(texts, dtype=np.object_).reshape(shape)
            )
        dtype = np.dtype(_DTYPES[item["datatype"]])
        if np.issubdtype(dtype, np.floating):
            array = self._rng.standard_normal(shape).astype(dtype)
        else:
            array = self._rng.integers(0, 2, size=shape).astype(dtype)
        return WorkloadTensor(item["name"], item["datatype"], array)


@dataclass(frozen=True)
class ReplayConfig:
    capture: Path
    out_dir: Path
    url: str = "127.0.0.1:8001"
    model: str = ""  # "": every model of the capture
    speed: float = 1.0
    seed: int = 0
    timeout_s: float = 10.0
    max_in_flight: int = 1024
    window_s: float = 1.0
    mesh_metrics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    prices_file: Path | None = None


def _config_doc(
    cfg: ReplayConfig, records: Sequence[dict[str, Any]], skipped: int
) -> dict[str, Any]:
    times = schedule(records, cfg.speed)
    models = sorted({r["model"] for r in records})
    sizes = Counter(size_label(r) for r in records)
    prios = Counter(int(r["priority"]) for r in records)
    n = max(1, len(records))
    return {
        "scenario": "replay",
        "out_dir": str(cfg.out_dir),
        "url": cfg.url,
        "model": ",".join(models),
        "seed": cfg.seed,
        "mix": {k: v / n for k, v in sizes.items()},
        "priorities": {str(k): v / n for k, v in sorted(prios.items())},
        "requests": len(records),
        "duration_s": (times[-1] if times else 0.0),
        "timeout_s": cfg.timeout_s,
        "warmup": 0,
        "concurrency": None,
        "max_in_flight": cfg.max_in_flight,
        "window_s": cfg.window_s,
        "capture": str(cfg.capture),
        "speed": cfg.speed,
        "skipped": skipped,
        "mesh_metrics": {k: list(v) for k, v in cfg.mesh_metrics.items()},
        "prices_file": str(cfg.prices_file) if cfg.prices_file else None,
    }


async def measure(cfg: ReplayConfig) -> report.RunResult:
    """Sends the capture's requests on its schedule; returns what the bench reports."""
    records, skipped = replayable(load(cfg.capture), cfg.model)
    if not records:
        raise ValueError(f"{cfg.capture}: no replayable record (model {cfg.model or 'any'})")
    client = grpcaio.InferenceServerClient(cfg.url)
    try:
        senders = {m: Sender(client, m, cfg.timeout_s) for m in {r["model"] for r in records}}
        model_of = [r["model"] for r in records]

        async def send(spec: RequestSpec) -> Outcome:
            return await senders[model_of[spec.index]](spec)

        recorder = runner.RunRecorder()
        started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        mesh_before = await asyncio.to_thread(cost.read_cpu, cfg.mesh_metrics)
        before = cpu.sample()
        await runner.open_loop(
            send,
            CaptureWorkload(records, cfg.seed),
            recorder,
            schedule(records, cfg.speed),
            max_in_flight=cfg.max_in_flight,
        )
        wall_s = recorder.now()
        after = cpu.sample()
        mesh_after = await asyncio.to_thread(cost.read_cpu, cfg.mesh_metrics)
    finally:
        await client.close()
    done = recorder.records
    return report.RunResult(
        config=_config_doc(cfg, records, skipped),
        records=done,
        wall_s=wall_s,
        cpu=cpu.usage(before, after, sum(1 for r in done if r.sent)),
        started_at=started_at,
        text_model=any(i["datatype"] == "BYTES" for r in records for i in r["inputs"]),
        inputs=[
            {"name": i["name"], "datatype": i["datatype"], "shape": i["shape"]}
            for i in records[0]["inputs"]
        ],
        cost=cost.run_cost(
            cfg.mesh_metrics, cfg.prices_file, done, mesh_before, mesh_after, wall_s
        ),
    )
