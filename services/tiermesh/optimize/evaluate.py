"""How good and how fast one variant is: accuracy against the FP32 baseline on the eval
texts (cosine of mean-pooled embeddings), size on disk, peak RSS of a process that loads and
runs it, cold start, latency per length at batch 1 and throughput at the best batch size."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from tiermesh.core.sessions import open_session, session_options
from tiermesh.core.text import TextEncoder

Floats = npt.NDArray[np.float32]
OUTPUT = "last_hidden_state"


@dataclass(frozen=True)
class Accuracy:
    mean: float
    p1: float
    min: float


@dataclass(frozen=True)
class Speed:
    # tokens -> (p50 ms, p95 ms) at batch 1
    batch1_ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    best_batch: int = 1
    best_seq_per_s: float = 0.0


def session(path: Path, threads: int = 0) -> ort.InferenceSession:
    return open_session(path, session_options(threads)).session


def embed(
    sess: ort.InferenceSession, encoder: TextEncoder, texts: Sequence[str], batch: int = 16
) -> Floats:
    """Mean-pooled, L2-normalised embeddings, the way the mesh answers."""
    out = []
    for i in range(0, len(texts), batch):
        enc = encoder.encode(list(texts[i : i + batch]))
        hidden = sess.run(
            [OUTPUT], {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask}
        )[0]
        mask = enc.attention_mask.astype(np.float32)[:, :, None]
        pooled = (hidden.astype(np.float32) * mask).sum(axis=1) / np.clip(
            mask.sum(axis=1), 1e-9, None
        )
        out.append(pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None))
    return np.concatenate(out).astype(np.float32)


def accuracy(baseline: Floats, candidate: Floats) -> Accuracy:
    cos = (baseline.astype(np.float64) * candidate.astype(np.float64)).sum(axis=1)
    return Accuracy(float(cos.mean()), float(np.percentile(cos, 1)), float(cos.min()))


def _ids(tokens: int, batch: int) -> dict[str, npt.NDArray[np.int64]]:
    ids = np.full((batch, tokens), 1000, dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def speed(
    sess: ort.InferenceSession,
    lengths: Sequence[int] = (16, 64, 128),
    batches: Sequence[int] = (1, 8, 32),
    repeats: int = 20,
) -> Speed:
    """p50/p95 at batch 1 per length; the best sequences/s over batch sizes at the middle
    length. Short loops with a warm-up; the caller repeats the whole run for medians."""
    batch1 = {}
    for n in lengths:
        feeds = _ids(n, 1)
        sess.run([OUTPUT], feeds)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sess.run([OUTPUT], feeds)
            times.append((time.perf_counter() - t0) * 1000)
        batch1[n] = (float(np.percentile(times, 50)), float(np.percentile(times, 95)))
    mid = lengths[len(lengths) // 2]
    best = (1, 0.0)
    for b in batches:
        feeds = _ids(mid, b)
        sess.run([OUTPUT], feeds)
        t0 = time.perf_counter()
        calls = max(2, repeats // b)
        for _ in range(calls):
            sess.run([OUTPUT], feeds)
        rate = b * calls / (time.perf_counter() - t0)
        if rate > best[1]:
            best = (b, rate)
    return Speed(batch1, best[0], best[1])


_RSS_PROBE = """
import json, sys, time
import numpy as np, onnxruntime as ort
from tiermesh.core.sessions import open_session, session_options
opts = session_options(0)
if sys.argv[3] == "preoptimized":  # saved after graph optimisation: do not redo it
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
t0 = time.perf_counter()
s = open_session(sys.argv[1], opts).session
for n in json.loads(sys.argv[2]):
    ids = np.full((1, n), 1000, dtype=np.int64)
    s.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
cold = time.perf_counter() - t0
# VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child of a big parent reports its size.
status = open("/proc/self/status").read().split("\\n")
peak = int(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
print(json.dumps({"peak_rss_kb": peak, "cold_s": cold}))
"""


def process_footprint(
    path: Path, lengths: Sequence[int] = (16, 64, 128), preoptimized: bool = False
) -> tuple[float, float]:
    """(peak RSS in MB, cold start in s: load + one warm-up per length) of a fresh process.
    A `preoptimized` model (saved after graph optimisation) loads with optimisation off."""
    mode = "preoptimized" if preoptimized else "optimize"
    done = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(path), json.dumps(list(lengths)), mode],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got["peak_rss_kb"] / 1024, float(got["cold_s"])
