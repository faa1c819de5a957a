"""The cascade decision: is an edge answer confident enough, or should center re-run it?
Pure: outputs in, a score and a verdict out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tiermesh.core.model_config import CascadeSpec, ModelConfig
from tiermesh.core.tensors import TensorData, to_numpy


def top1_softmax(logits: TensorData) -> float:
    """The least confident row's top-class probability (a request is as sure as its
    least sure row)."""
    x = to_numpy(logits).astype(np.float64)
    x = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1)
    x = x - x.max(axis=1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=1, keepdims=True)
    return float(p.max(axis=1).min())


def score(spec: CascadeSpec, outputs: Sequence[TensorData]) -> float | None:
    out = next((o for o in outputs if o.name == spec.output), None)
    return None if out is None else top1_softmax(out)


def escalates(cfg: ModelConfig, tier: str, outputs: Sequence[TensorData]) -> float | None:
    """The confidence of an answer that must be re-run on the last tier, else None."""
    if cfg.cascade is None or not cfg.tiers or tier == cfg.tiers[-1].name:
        return None
    confidence = score(cfg.cascade, outputs)
    if confidence is None or confidence >= cfg.cascade.threshold:
        return None
    return confidence
