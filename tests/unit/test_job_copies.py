"""`with_` on the request path's value types: the copy `dataclasses.replace` would make."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.tensors import TensorData

JOB = Job(
    request_id="r1",
    model="m",
    inputs=(TensorData("x", "FP32", (1, 2), bytes(8)),),
    gateway="g:1",
    priority=2,
    timing=Timing(received_ns=5),
    annotations={"a": "b"},
)
RESULT = JobResult.for_job(JOB, code=grpc.StatusCode.ABORTED, message="m", batch_size=3)


@pytest.mark.parametrize(
    ("value", "changes"),
    [
        (JOB, {"version": "2", "bucket": 1}),
        (JOB, {"timing": Timing(received_ns=5, routed_ns=6)}),
        (JOB, {}),
        (RESULT, {"direct": True, "worker": "w"}),
        (Timing(1, 2, 3), {"delivered_ns": 9}),
    ],
)
def test_with_is_replace(value: Job | JobResult | Timing, changes: dict[str, object]) -> None:
    copy = value.with_(**changes)  # type: ignore[arg-type]
    assert copy == dataclasses.replace(value, **changes)  # type: ignore[arg-type]
    assert copy is not value
    assert type(copy) is type(value)


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(TypeError, match="verison"):
        JOB.with_(verison="2")
    with pytest.raises(TypeError, match="queued_ns"):
        Timing().with_(queued_ns=1)


def test_a_copy_stays_frozen() -> None:
    copy = JOB.with_(version="2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.version = "3"  # type: ignore[misc]
    assert hash(copy.timing) == hash(JOB.timing)
