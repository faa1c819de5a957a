"""What the OpenAI door's `/v1/embeddings` decides, with no HTTP: which models embed, how a
list input becomes jobs, and the answer's document. Pure.

A list is not sent as one job padded to its longest text: its rows are grouped by length
bucket and each group, cut to its bucket's batch size, is one job, so rows batch and bucket
as other requests do (a 300-token text does not make 99 short ones compute at 256 tokens).
The gateway does not tokenize (the router does, once): a text's bucket here is estimated
from its size in UTF-8 (EST_BYTES_PER_TOKEN, WordPiece's on English prose); the router
buckets each job by its longest text as it tokenizes. Token ids are bucketed by their count.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tiermesh.core.model_config import (
    TEXT_TOKENS,
    TOKEN_IDS,
    TOKEN_MASK,
    ModelConfig,
    bucket_for,
)
from tiermesh.core.tensors import BYTES, TensorData, from_numpy
from tiermesh.gateway.openai_schema import MAX_EMBEDDING_INPUTS, EmbeddingsBody, param_error

EST_BYTES_PER_TOKEN = 4
# [CLS] and [SEP] around every text.
SPECIAL_TOKENS = 2


def embeds(cfg: ModelConfig) -> bool:
    """A text embedder: one text in, its pooled vector out."""
    return cfg.tokenize is not None and cfg.pool is not None and cfg.generation is None


@dataclass(frozen=True, slots=True)
class Rows:
    """A list input as jobs: each job's model, inputs and the positions its rows answer."""

    model: str
    jobs: tuple[tuple[tuple[TensorData, ...], tuple[int, ...]], ...]
    count: int
    # The answer's output that holds the vectors.
    output: str
    # Tokens of token-id input (known here); text's are counted by the router.
    id_tokens: int = 0


def rows(body: EmbeddingsBody, cfg: ModelConfig, ids_model: ModelConfig | None) -> Rows:
    """The jobs of an embeddings body for text embedder `cfg` (`ids_model`: its companion
    taking token ids, if any); INVALID_ARGUMENT naming `input` for an empty or too long
    one, and `dimensions` for a size the model cannot be cut to."""
    check_dimensions(body.dimensions, cfg)
    items = [body.input] if isinstance(body.input, str) else body.input
    if not items:
        raise param_error("input", "empty: give at least one string or token id")
    if isinstance(items[0], int):  # one text as token ids
        items = [items]
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise param_error("input", f"{len(items)} items, over the limit of {MAX_EMBEDDING_INPUTS}")
    if isinstance(items[0], str):
        texts: list[str] = items
        return _text_rows(texts, cfg)
    if ids_model is None:
        raise param_error("input", f"model '{cfg.name}' takes text, not token ids")
    return _id_rows(items, cfg, ids_model)


def check_dimensions(dimensions: int | None, cfg: ModelConfig) -> None:
    assert cfg.pool is not None
    if dimensions is None or dimensions == _size(cfg):
        return
    allowed = cfg.pool.dimensions
    if dimensions not in allowed:
        sizes = ", ".join(str(d) for d in (*allowed, _size(cfg)))
        raise param_error(
            "dimensions",
            f"model '{cfg.name}' gives {_size(cfg)} values and cannot be cut to {dimensions}"
            + (f" (sizes: {sizes})" if allowed else " (it was not trained for shorter ones)"),
        )


def _size(cfg: ModelConfig) -> int:
    assert cfg.pool is not None
    out = next(t for t in cfg.outputs if t.name == cfg.pool.output)
    return out.dims[-1]


def _text_rows(texts: Sequence[str], cfg: ModelConfig) -> Rows:
    encoded = []
    for i, text in enumerate(texts):
        if not text:
            raise param_error(f"input[{i}]", "empty string")
        encoded.append(text.encode("utf-8"))
    estimate = [math.ceil(len(b) / EST_BYTES_PER_TOKEN) + SPECIAL_TOKENS for b in encoded]
    name = cfg.inputs[0].name
    jobs = []
    for positions in _grouped(estimate, cfg):
        column = np.array([encoded[i] for i in positions], dtype=object).reshape(-1, 1)
        jobs.append(((from_numpy(name, column, BYTES),), positions))
    assert cfg.pool is not None
    return Rows(cfg.name, tuple(jobs), len(texts), cfg.pool.output)


def _id_rows(items: Sequence[Sequence[int]], cfg: ModelConfig, ids_model: ModelConfig) -> Rows:
    assert cfg.tokenize is not None
    limit = cfg.tokenize.max_length
    for i, ids in enumerate(items):
        if not ids:
            raise param_error(f"input[{i}]", "empty list of token ids")
        if len(ids) > limit:
            raise param_error(
                f"input[{i}]", f"{len(ids)} tokens, over the model's maximum of {limit}"
            )
    pad = int(ids_model.pad.get(TOKEN_IDS, 0))
    jobs = []
    for positions in _grouped([len(items[i]) for i in range(len(items))], cfg):
        width = max(len(items[i]) for i in positions)
        id_array = np.full((len(positions), width), pad, dtype=np.int64)
        mask = np.zeros((len(positions), width), dtype=np.int64)
        for row, i in enumerate(positions):
            id_array[row, : len(items[i])] = items[i]
            mask[row, : len(items[i])] = 1
        inputs = (from_numpy(TOKEN_IDS, id_array, "INT64"), from_numpy(TOKEN_MASK, mask, "INT64"))
        jobs.append((inputs, positions))
    assert cfg.pool is not None
    return Rows(
        ids_model.name, tuple(jobs), len(items), cfg.pool.output, sum(len(x) for x in items)
    )


def _grouped(lengths: Sequence[int], cfg: ModelConfig) -> list[tuple[int, ...]]:
    """Positions grouped by length bucket, each group cut to its bucket's batch size."""
    bounds = cfg.length_buckets
    groups: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        groups.setdefault(bucket_for(length, bounds), []).append(i)
    out: list[tuple[int, ...]] = []
    for bucket, positions in sorted(groups.items()):
        size = cfg.bucket(bucket).max_batch_size if bounds else cfg.max_batch_size
        size = max(1, min(size, cfg.max_batch_size))
        out.extend(tuple(positions[k : k + size]) for k in range(0, len(positions), size))
    return out


def vectors(
    parts: Sequence[tuple[npt.NDArray[np.float32], tuple[int, ...]]],
    count: int,
    dimensions: int | None,
) -> npt.NDArray[np.float32]:
    """The rows of every job's answer in the caller's order, cut to `dimensions` and then
    normalised again (a cut Matryoshka vector is no longer of length 1)."""
    width = parts[0][0].shape[-1]
    out = np.empty((count, width), dtype=np.float32)
    for values, positions in parts:
        out[list(positions)] = values.reshape(len(positions), width)
    if dimensions is not None and dimensions < width:
        out = out[:, :dimensions]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = (out / np.maximum(norms, 1e-12)).astype(np.float32)
    return out


def text_tokens(annotations: Sequence[Mapping[str, str]]) -> int:
    """The tokens the router counted in the texts of a call's jobs."""
    return sum(int(a.get(TEXT_TOKENS, 0)) for a in annotations)


def document(
    values: npt.NDArray[np.float32], encoding: str, model: str, prompt_tokens: int
) -> dict[str, object]:
    """OpenAI's embeddings answer: base64 is the float32 values' little-endian bytes."""
    if encoding == "base64":
        rows_out: list[object] = [
            base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in values
        ]
    else:
        rows_out = values.tolist()
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows_out)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
