"""Messages of results within the message limit (core/message_bytes.py): the bound on a
result's size against what protobuf really writes, and the split of a batch's results."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tiermesh.core.jobs import JobResult, Timing
from tiermesh.core.message_bytes import (
    count_within,
    result_bytes,
    result_messages,
    split_by_bytes,
)
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import delivery_pb2, postprocess_pb2

BIG_ID = 2**64 - 1  # the largest batch_id: its varint is the longest


def result(request_id: str, values: int, **fields: object) -> JobResult:
    x = np.ones((1, values), np.float32)
    base: dict[str, object] = dict(
        request_id=request_id,
        model="mlp",
        gateway="127.0.0.1:8011",
        outputs=(from_numpy("OUTPUT0", x, "FP32"),),
        timing=Timing(*(2**62 + i for i in range(8))),
        trace_context={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
        annotations={"tokens": "16", "padded_tokens": "16"},
        worker="host-center-123",
        batch_size=32,
        priority=2,
    )
    base.update(fields)
    return JobResult(**base)  # type: ignore[arg-type]


def test_count_within_takes_in_order_and_at_least_one() -> None:
    assert count_within([3, 3, 3], 7) == 2
    assert count_within([3, 3, 3], 9) == 3
    assert count_within([10, 1], 7) == 1  # too big for any budget: alone
    assert count_within([], 7) == 0


def test_split_by_bytes_keeps_order_and_puts_an_oversize_item_alone() -> None:
    items = ["a", "b", "big", "c", "d", "e"]
    sizes = [2, 3, 20, 4, 4, 1]
    assert split_by_bytes(items, sizes, 8) == [["a", "b"], ["big"], ["c", "d"], ["e"]]
    assert split_by_bytes(items[:2], sizes[:2], 8) == [["a", "b"]]
    assert split_by_bytes([], [], 8) == []


@pytest.mark.parametrize(
    "r",
    [
        result("r1", 3),
        result("r2", 100_000, aux=(from_numpy("mask", np.ones((1, 7), np.int64), "INT64"),)),
        result("ünï-cödé", 5, message="fehlgeschlagen: größe", annotations={"ключ": "значение"}),
        result("neg", 1, code=grpc.StatusCode.INTERNAL, text_offset=2**31, partial=True),
        result("empty", 0, outputs=(), trace_context={}, annotations={}, worker=""),
    ],
    ids=["small", "large+aux", "non-ascii", "scalars", "bare"],
)
def test_result_bytes_bounds_what_protobuf_writes_in_a_batch_message(r: JobResult) -> None:
    """The bound is never below the result's share of a message, and above it by little."""
    alone = postprocess_pb2.ResultBatch(results=[result_to_proto(r)])
    written = len(alone.SerializeToString())
    assert written <= result_bytes(r) <= written + 300


def test_results_that_fit_together_go_in_one_message() -> None:
    results = [result(f"r{i}", 3) for i in range(32)]
    assert result_messages(results, 64 * 1024) == [results]


def test_results_over_the_limit_together_go_in_several_messages_none_over_it() -> None:
    limit = 64 * 1024
    results = [result(f"r{i}", 4096) for i in range(10)]  # ~16 KiB answers, ~160 KiB in all
    parts = result_messages(results, limit)
    assert [r for part in parts for r in part] == results  # all of them, in order
    for part in parts:
        msg = delivery_pb2.Deliveries(results=[result_to_proto(r) for r in part], batch_id=BIG_ID)
        assert len(msg.SerializeToString()) <= limit
    assert [len(part) for part in parts] == [3, 3, 3, 1]  # four would be over 64 KiB


def test_an_answer_over_the_limit_alone_fails_alone_and_its_batch_mates_travel() -> None:
    limit = 64 * 1024
    small = [result(f"s{i}", 8) for i in range(6)]
    big = result("big", 20_000, client_request_id="mine")  # an 80 KB answer
    parts = result_messages([*small[:3], big, *small[3:]], limit)
    assert parts == [[*small[:3], parts[0][3], *small[3:]]]  # one message, order kept
    failed = parts[0][3]
    assert failed.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failed.outputs == () and failed.aux == ()
    assert failed.message == (
        f"the answer is {result_bytes(big)} bytes, over the {limit}-byte limit of a message "
        "inside the mesh"
    )
    # Its caller's identity stays: the gateway resolves it like any answer.
    assert (failed.request_id, failed.client_request_id, failed.gateway) == (
        "big",
        "mine",
        big.gateway,
    )
    assert failed.timing == big.timing and failed.batch_size == big.batch_size
