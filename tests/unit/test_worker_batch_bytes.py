"""The worker's batches are bounded by bytes as well as rows: the pure decisions, and the
loop stepped with test_worker_loop.py's harness (in-memory streams, injected clock, a real
postprocess and Delivery server) on onnxruntime running tests/tile_model.py."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from tests.integration.conftest import Downstream, downstream  # noqa: F401 (a fixture)
from tests.tile_model import NAME, build_tile, config_text
from tests.unit.test_worker_loop import Harness, make  # noqa: F401 (a fixture)
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.keys import StreamKey
from tiermesh.core.model_config import parse_config
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import encode_job
from tiermesh.worker.batching import take_count
from tiermesh.worker.scheduler import Scheduler, StreamView

UNIT = ComputeUnit(NAME, "1", "fp32")
STREAM = StreamKey(UNIT, "center", 2, 0)
CONFIG = parse_config(yaml.safe_load(config_text("0" * 64)), "test")


def test_take_count_stops_at_the_byte_budget_and_takes_an_oversize_job_alone() -> None:
    rows = [1] * 6
    assert take_count(rows, 32, [4, 4, 4, 4, 4, 4], 10) == 2
    assert take_count(rows, 3, [1] * 6, 100) == 3  # rows bind first
    assert take_count(rows, 32, [50, 1, 1, 1, 1, 1], 10) == 1  # alone, not held back
    assert take_count(rows, 32) == 6  # no budget: rows only


def test_a_stream_buffering_a_whole_byte_budget_closes_its_batch_at_once() -> None:
    scheduler = Scheduler({UNIT: CONFIG}, max_batch_bytes=1000)
    now = time.time_ns()

    def view(size: int) -> StreamView:
        return StreamView(STREAM, 2, now, now, 0, size)

    assert scheduler.wait_ms(view(999), now) > 0  # room left: it may wait for company
    assert scheduler.wait_ms(view(1000), now) == 0


def test_the_batch_budget_must_be_below_the_message_limit() -> None:
    with pytest.raises(ValidationError, match="TIERMESH_MAX_BATCH_BYTES"):
        WorkerSettings(max_batch_bytes=64 << 20, max_message_bytes=64 << 20)
    assert WorkerSettings().max_batch_bytes < WorkerSettings().max_message_bytes
    # A smaller message limit and no budget given: the budget follows (a quarter of it).
    assert WorkerSettings(max_message_bytes=1 << 20).max_batch_bytes == 1 << 18


@pytest.fixture
def tile(tmp_path: Path) -> Path:
    path = tmp_path / "tile.onnx"
    path.write_bytes(build_tile())
    return path


def tile_job(request_id: str, width: int, gateway: str, now: int, tenant: str = "t") -> Job:
    """A request of `width` FP32 values (4 bytes each in its stream entry)."""
    return Job(
        request_id=request_id,
        model=NAME,
        inputs=(from_numpy("INPUT0", np.ones((1, width), np.float32), "FP32"),),
        gateway=gateway,
        tenant=tenant,
        deadline_ns=now + 60 * 10**9,
        priority=STREAM.priority,
        tier=STREAM.tier,
        timing=Timing(routed_ns=now),
    )


def add(h: Harness, request_id: str, width: int, tenant: str = "t") -> str:
    """Queue a request (its caller waits at the Delivery server); its entry id."""
    h.answers[request_id] = h._down.pending.register(request_id)
    job = tile_job(request_id, width, h._down.delivery_address, h.clock.now, tenant)
    return h.streams.add(STREAM, job)


async def test_big_requests_compute_alone_and_never_hold_back_small_ones(
    make: Callable[..., Awaitable[Harness]],  # noqa: F811
    tile: Path,
) -> None:
    """The issue's batch, scaled down: two 35 KiB requests of one tenant among six tiny ones
    of another, with a 16 KiB budget. Each big one computes alone; the tiny ones around
    them batch together; every one of them is answered."""
    h = await make(CONFIG, onnx=tile, unit=UNIT, max_batch_bytes=16 * 1024)
    order = ["tiny0", "big0", "tiny1", "tiny2", "big1", "tiny3", "tiny4", "tiny5"]
    for rid in order:
        if rid.startswith("big"):
            add(h, rid, 9000, "t-large")  # 36 KB of FP32
        else:
            add(h, rid, 4, "t-small")
    await h.steps(5)
    assert h.runner.runs == [["tiny0"], ["big0"], ["tiny1", "tiny2"], ["big1"], order[5:]]
    for rid in order:
        result = h.result(rid)
        assert result.code == grpc.StatusCode.OK
        assert result.outputs[0].shape == (1, (9000 if rid.startswith("big") else 4) * 16)
    assert not h.streams.entries[STREAM]  # all acknowledged


async def test_a_stream_holding_two_byte_budgets_reads_no_more(
    make: Callable[..., Awaitable[Harness]],  # noqa: F811
    tile: Path,
    downstream: Downstream,  # noqa: F811
) -> None:
    """Its rows leave room, its bytes do not: what comes meanwhile stays in the stream (for
    other workers) until the buffer is below two budgets again."""
    size = len(encode_job(tile_job("r0", 150, downstream.delivery_address, time.time_ns())))
    # One request a batch; two budgets: three requests.
    h = await make(CONFIG, onnx=tile, unit=UNIT, max_batch_bytes=size * 3 // 2)
    first = [add(h, f"r{i}", 150) for i in range(6)]
    await h.steps()
    assert h.runner.runs == [["r0"]]
    later = [add(h, f"l{i}", 150) for i in range(2)]
    await h.steps(3)  # each read comes with five, four, three buffered: none
    read = {i for _, ids in h.streams.named("read") for i in ids}
    assert set(first) <= read and not read & set(later)
    await h.steps()  # two buffered: it reads again
    read = {i for _, ids in h.streams.named("read") for i in ids}
    assert set(later) <= read
    await h.steps(3)
    assert h.runner.runs == [[f"r{i}"] for i in range(6)] + [["l0"], ["l1"]]
    assert all(h.result(rid).code == grpc.StatusCode.OK for rid in h.answers)
