"""Internal messages within gRPC's message limit: a message that carries many requests
(a worker's batch, a hand-off, a delivery) is bounded by bytes as well as count, and a part
that alone exceeds the limit fails alone instead of failing the message it would travel in.

Sizes come from lengths the parts already have (a job's stream entry, a tensor's raw
bytes, a result's strings), never from serializing: with upb, `ByteSize()` serializes the
whole message (~42 ms for 35 MiB), where `result_bytes` takes about a microsecond."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import grpc
import structlog

from tiermesh.core.controls import NO_CONTROLS
from tiermesh.core.jobs import JobResult
from tiermesh.core.tensors import TensorData

log = structlog.get_logger("tiermesh.messages")
T = TypeVar("T")

# gRPC's message limit inside the mesh (send and receive, every internal channel and server).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A length-delimited field's framing at most: its tag (field numbers below 2048: 2 bytes)
# and its length (a varint, below 2**35: 5 bytes).
_FIELD = 7
# A varint field at most: its tag and 10 bytes (a negative int64).
_VARINT = 12
# A result's fields whose size does not depend on its contents: five integers, two bools,
# its Timing (eight int64), and the framing of its ten strings.
_RESULT_FIXED = 5 * _VARINT + 2 * 3 + _FIELD + 8 * _VARINT + 10 * _FIELD
# A batch message's own fields besides its results (batch_id).
MESSAGE_OVERHEAD = _VARINT


def count_within(sizes: Sequence[int], max_bytes: int) -> int:
    """How many items (in order) fit in `max_bytes`: at least one when there are any, so an
    item bigger than the budget still goes (alone)."""
    total = 0
    for i, n in enumerate(sizes):
        total += n
        if total > max_bytes and i > 0:
            return i
    return len(sizes)


def split_by_bytes(items: Sequence[T], sizes: Sequence[int], max_bytes: int) -> list[list[T]]:
    """`items` in order, in groups of at most `max_bytes` (`sizes` are theirs, same order);
    an item bigger than the budget forms a group of its own. One group when all fit."""
    groups: list[list[T]] = []
    start = 0
    while start < len(items):
        n = count_within(sizes[start:], max_bytes)
        groups.append(list(items[start : start + n]))
        start += n
    return groups


def _text(s: str) -> int:
    """Bytes of `s` in UTF-8 (for ASCII, which `isascii` tells in O(1), without encoding)."""
    return len(s) if s.isascii() else len(s.encode())


def tensor_bytes(t: TensorData) -> int:
    """The serialized size of a tensor inside a message, at most."""
    return 5 * _FIELD + _text(t.name) + _text(t.datatype) + 10 * len(t.shape) + len(t.raw)


def result_bytes(r: JobResult) -> int:
    """The serialized size of a result inside a batch message (its framing included), at
    most: exact up to a few bytes for each field. ~1 us (the request path pays it for every
    result it hands on: its strings are measured in one piece)."""
    meta, tags = r.trace_context, r.annotations
    text = "".join(
        (
            r.request_id,
            r.client_request_id,
            r.model,
            r.version,
            r.gateway,
            r.message,
            r.tier,
            r.variant,
            r.worker,
            r.batch_traceparent,
            *meta,
            *meta.values(),
            *tags,
            *tags.values(),
        )
    )
    n = _RESULT_FIXED + _FIELD + _text(text) + 3 * _FIELD * (len(meta) + len(tags))
    if r.controls is not NO_CONTROLS:
        controls = r.controls.to_wire()
        n += _text("".join((*controls, *controls.values()))) + 3 * _FIELD * len(controls)
    for t in r.outputs:
        n += tensor_bytes(t)
    for t in r.aux:
        n += tensor_bytes(t)
    return n


def too_large(r: JobResult, size: int, max_message_bytes: int) -> JobResult:
    """The answer for a result that alone exceeds the message limit: RESOURCE_EXHAUSTED,
    no tensors, its identity kept so that its caller gets it."""
    return r.with_(
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
        message=(
            f"the answer is {size} bytes, over the {max_message_bytes}-byte limit of a "
            "message inside the mesh"
        ),
        outputs=(),
        aux=(),
    )


def result_messages(results: Sequence[JobResult], max_message_bytes: int) -> list[list[JobResult]]:
    """`results` in messages of at most `max_message_bytes` each, in order (one message when
    they fit together, the common case). A result that alone does not fit is replaced by its
    `too_large` answer: it fails alone, the others travel."""
    budget = max_message_bytes - MESSAGE_OVERHEAD
    sizes = [result_bytes(r) for r in results]
    if sum(sizes) <= budget:
        return [list(results)]
    fitting = list(results)
    for i, size in enumerate(sizes):
        if size > budget:
            log.warning(
                "answer over the message limit fails alone",
                request_id=results[i].request_id,
                bytes=size,
                limit=max_message_bytes,
            )
            fitting[i] = too_large(results[i], size, max_message_bytes)
            sizes[i] = result_bytes(fitting[i])
    return split_by_bytes(fitting, sizes, budget)
