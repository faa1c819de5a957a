"""A batch never exceeds the hand-off message (issue 22, acceptance 4): a real worker against
the real redis-server, onnxruntime on a tiny model whose answers are 16 times its requests
(tests/tile_model.py), a real postprocess and a real Delivery server on port 0, all of them
with a 64 KiB message limit. And the dead-letter stream's bounds, on the real Redis."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis

from tests.integration.conftest import Downstream, serve_downstream
from tests.tile_model import NAME, REPEATS, write_tile
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.delivery_client import GatewayClients
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import make_channel
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tensors import from_numpy, to_numpy
from tiermesh.core.wire import decode_job, encode_job
from tiermesh.gateway.delivery import DeliveryServicer
from tiermesh.gateway.pending import PendingRequests
from tiermesh.v1 import delivery_pb2
from tiermesh.worker.handoff import DirectHandoff, Handoff, PostprocessClient
from tiermesh.worker.loop import Worker
from tiermesh.worker.runner import ModelRunner
from tiermesh.worker.streams import Entry, StreamClient

pytestmark = pytest.mark.integration
LIMIT = 64 * 1024  # the message limit of every hop in these tests
UNIT = ComputeUnit(NAME, "1", "fp32")
STREAM = StreamKey(UNIT, "center", 2, 0)


class CountingDelivery(DeliveryServicer):
    """The gateway's Delivery servicer, noting the size of each message it took."""

    def __init__(self, pending: PendingRequests) -> None:
        super().__init__(pending)
        self.sizes: list[int] = []

    async def _deliver(self, request: delivery_pb2.Deliveries) -> delivery_pb2.DeliverReply:
        self.sizes.append(request.ByteSize())
        return await super()._deliver(request)


@dataclass
class Limited:
    """Postprocess delivering to a Delivery server, both on port 0 with a LIMIT message."""

    down: Downstream
    delivery: CountingDelivery


@pytest.fixture
async def limited() -> AsyncIterator[Limited]:
    servicers: list[CountingDelivery] = []

    def counting(pending: PendingRequests) -> CountingDelivery:
        servicers.append(CountingDelivery(pending))
        return servicers[-1]

    async with serve_downstream(LIMIT, counting) as down:
        yield Limited(down, servicers[0])


def handoff(kind: str, down: Downstream) -> Handoff:
    """Through postprocess (worker -> postprocess -> gateway), or straight to the gateway."""
    channel = make_channel(down.postprocess_address, LIMIT)
    client = PostprocessClient(channel, timeout_s=5, max_message_bytes=LIMIT)
    if kind == "postprocess":
        return client
    return DirectHandoff(client, GatewayClients(5, max_message_bytes=LIMIT))


def tile_job(request_id: str, tenant: str, width: int, gateway: str) -> bytes:
    x = np.arange(width, dtype=np.float32).reshape(1, width)
    return encode_job(
        Job(
            request_id=request_id,
            model=NAME,
            inputs=(from_numpy("INPUT0", x, "FP32"),),
            gateway=gateway,
            deadline_ns=time.time_ns() + 60 * 10**9,
            tenant=tenant,
            priority=STREAM.priority,
            tier=STREAM.tier,
        )
    )


@pytest.mark.parametrize("kind", ["postprocess", "direct"])
async def test_a_batch_whose_answers_sum_past_the_limit_delivers_every_small_answer(
    redis_url: str, tmp_path: Path, limited: Limited, kind: str
) -> None:
    """One batch of eleven requests, ~11 KiB of them in all, whose answers add up to ~146
    KiB against a 64 KiB message: six tiny ones (256 B answers) of one tenant, four of 16 KiB
    answers and one of 80 KiB of another. Every answer that fits a message is delivered,
    in as many messages as they need (none over the limit); the 80 KiB one fails alone with
    RESOURCE_EXHAUSTED naming its size and the limit. Nothing is redelivered or
    dead-lettered: every entry is acknowledged."""
    write_tile(tmp_path)
    repo = ModelRepository(tmp_path)
    cfg = repo.load()[NAME]
    redis = aioredis.Redis.from_url(redis_url)
    widths = {f"tiny{i}": 4 for i in range(6)} | {f"mid{i}": 256 for i in range(4)}
    widths["big"] = 1280
    answers = {rid: limited.down.pending.register(rid) for rid in widths}
    for rid, width in widths.items():
        tenant = "t-small" if rid.startswith("tiny") else "t-large"
        entry = tile_job(rid, tenant, width, limited.down.delivery_address)
        await redis.xadd(STREAM.name, {keys.JOB_FIELD: entry})
    worker = Worker(
        tier="center",
        configs={UNIT: cfg},
        runners={UNIT: ModelRunner(cfg, repo.checked_file(NAME))},
        streams=StreamClient(redis, "w1"),
        handoff=handoff(kind, limited.down),
        telemetry=Telemetry("worker-test"),
        poll_block_ms=50,
        max_batch_bytes=LIMIT // 4,
    )
    task = asyncio.create_task(worker.run())
    try:
        got: dict[str, JobResult] = dict(
            zip(answers, await asyncio.wait_for(asyncio.gather(*answers.values()), 10), strict=True)
        )
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert {r.batch_size for r in got.values()} == {len(widths)}, "not one batch"
    big = got.pop("big")
    assert big.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not big.outputs
    said = re.fullmatch(r"the answer is (\d+) bytes, over the (\d+)-byte limit .*", big.message)
    assert said is not None, big.message
    raw = widths["big"] * REPEATS * 4  # its FP32 answer; the rest is the result's own fields
    assert raw < int(said[1]) < raw + 1024 and int(said[2]) == LIMIT
    for rid, result in got.items():
        assert result.code == grpc.StatusCode.OK, (rid, result.message)
        out = to_numpy(result.outputs[0])
        x = np.arange(widths[rid], dtype=np.float32).reshape(1, -1)
        np.testing.assert_array_equal(out, np.tile(x, (1, REPEATS)))
    # The answers that travel (~66 KiB: the big one's is its status) took two messages.
    sizes = limited.delivery.sizes
    assert len(sizes) >= 2 and sum(sizes) > LIMIT and max(sizes) <= LIMIT
    assert worker.dead_lettered == 0 and worker.computed_rows == len(widths)
    assert await redis.xlen(STREAM.name) == 0
    assert (await redis.xpending(STREAM.name, keys.GROUP))["pending"] == 0
    assert await redis.xlen(keys.dead_letter_key(STREAM.unit, STREAM.tier)) == 0
    await redis.aclose()


async def test_the_dead_letter_stream_is_trimmed_and_keeps_no_big_payload(
    redis_url: str,
) -> None:
    """Eight dead letters into a stream bounded at five, with a 1 KiB payload bound: the
    newest five stay; a small job is kept whole, a big one (two 35 KiB requests) only by its
    ids, its size and the reason."""
    redis = aioredis.Redis.from_url(redis_url)
    streams = StreamClient(redis, "w1", dead_letter_max_len=5, dead_letter_max_payload_bytes=1024)
    await streams.ensure_groups([STREAM])
    jobs = {f"r{i}": tile_job(f"r{i}", "t", 4, "gw:1") for i in range(6)}
    jobs |= {f"big{i}": tile_job(f"big{i}", "t", 9000, "gw:1") for i in range(2)}
    for job in jobs.values():
        await redis.xadd(STREAM.name, {keys.JOB_FIELD: job, keys.TRACEPARENT_FIELD: ""})
    entries = await streams.read([STREAM], 10, None)
    assert len(entries) == len(jobs)
    order = ["r0", "r1", "r2", "big0", "r3", "big1", "r4", "r5"]
    by_request = {decode_job(e.fields[keys.JOB_FIELD.encode()]).request_id: e for e in entries}
    for rid in order:
        await streams.dead_letter(by_request[rid], "model execution failed on this request")
    dlq = cast(
        list[tuple[bytes, dict[bytes, bytes]]],
        await redis.xrange(keys.dead_letter_key(STREAM.unit, STREAM.tier)),
    )
    assert [f[b"request_id"].decode() for _, f in dlq] == order[-5:]
    for _, fields in dlq:
        rid = fields[b"request_id"].decode()
        entry: Entry = by_request[rid]
        assert fields[b"reason"] == b"model execution failed on this request"
        assert fields[b"stream"] == STREAM.name.encode()
        assert fields[b"entry_id"] == entry.entry_id.encode()
        if rid.startswith("big"):
            assert b"job" not in fields
            assert int(fields[b"dropped:job"]) == len(jobs[rid]) > 35_000
        else:
            assert fields[b"job"] == jobs[rid]
        assert sum(len(k) + len(v) for k, v in fields.items()) < 2048
    assert await redis.xlen(STREAM.name) == 0  # each was acknowledged with its dead letter
    await redis.aclose()
