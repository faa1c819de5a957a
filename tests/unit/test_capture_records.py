"""Capture records hold request shapes, never contents; the sampling state and control hash."""

from __future__ import annotations

import math

import grpc

from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.tensors import TensorData, join_bytes
from tiermesh.gateway.capture import (
    Capture,
    CaptureState,
    Observed,
    build_record,
    initial_state,
    state_from_control,
)

SECRET = "zebra unicorn marmalade telescope"


def text_job(text: str = SECRET) -> Job:
    raw = join_bytes([text.encode()])
    return Job(
        request_id="r1",
        model="echo",
        inputs=(TensorData("TEXT", "BYTES", (1, 1), raw),),
        gateway="g",
        deadline_ns=1_000_000_000 + 500_000_000,
        tenant="acme",
        priority=2,
        timing=Timing(received_ns=1_000_000_000),
    )


def test_a_record_holds_sizes_and_timings_not_the_text() -> None:
    job = text_job()
    result = JobResult.for_job(job, tier="center", bucket=1, batch_size=4).with_(
        annotations={"tokens": "6"},
        timing=Timing(received_ns=1_000_000_000, routed_ns=1_001_000_000),
    )
    rec = build_record(
        Observed("r1", "echo", "acme", "OK", 1_000_000_000, 1_010_000_000, job, result)
    )
    assert rec["model"] == "echo" and rec["priority"] == 2 and rec["tenant"] == "acme"
    assert rec["deadline_ms"] == 500.0 and rec["code"] == "OK"
    assert rec["inputs"] == [
        {
            "name": "TEXT",
            "datatype": "BYTES",
            "shape": [1, 1],
            "bytes": len(job.inputs[0].raw),
            "words": 4,
        }
    ]
    assert rec["tokens"] == 6 and rec["tier"] == "center" and rec["bucket"] == 1
    assert rec["timing_ms"]["total"] == 10.0
    assert "zebra" not in repr(rec)


def test_a_refused_request_keeps_its_outcome_and_total_time() -> None:
    rec = build_record(Observed("r2", "mlp", "", "UNAUTHENTICATED", 0, 2_000_000))
    assert rec["inputs"] == [] and rec["priority"] is None
    assert rec["code"] == "UNAUTHENTICATED" and rec["timing_ms"] == {"total": 2.0}


def test_sampling_follows_rate_and_window() -> None:
    assert not CaptureState().sampling(0)
    state = initial_state(0.5, 10, now_ms=1000)
    assert state.sampling(10_999) and not state.sampling(11_000)
    assert initial_state(1, 0, now_ms=0).until_ms == math.inf


def test_the_control_hash_overrides_settings() -> None:
    assert state_from_control({}) is None
    assert state_from_control({b"rate": b"0.25", b"until_ms": b"0"}) == CaptureState(0.25)
    assert state_from_control({"rate": "2", "until_ms": "5"}) == CaptureState(1.0, 5.0)


def test_observe_queues_only_sampled_requests() -> None:
    draws = iter([0.1, 0.9, 0.3])
    cap = Capture(
        None,  # type: ignore[arg-type]  # observe never touches Redis
        CaptureState(0.5),
        max_len=10,
        clock_ms=lambda: 0.0,
        sample=lambda: next(draws),
    )
    obs = Observed("r", "mlp", "", grpc.StatusCode.OK.name, 0, 1)
    for _ in range(3):
        cap.observe(obs)
    assert len(cap._queue) == 2
