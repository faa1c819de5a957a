"""The capture writer against a real Redis: by default nothing of a request's text or tensor
bytes reaches Redis (every key and stream entry is searched for them); with contents enabled
for a tenant they are stored encrypted, with a TTL, and decrypt back."""

from __future__ import annotations

import numpy as np
import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from tiermesh.core import keys
from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.tensors import TensorData, join_bytes
from tiermesh.gateway.capture import Capture, CaptureState, Observed, open_contents

pytestmark = pytest.mark.integration
TEXT = b"zebra unicorn marmalade telescope"
FLOATS = np.array([[3.14159, 2.71828, 1.41421, 1.73205]], dtype=np.float32)


def observed(tenant: str, request_id: str) -> Observed:
    job = Job(
        request_id=request_id,
        model="echo",
        inputs=(
            TensorData("TEXT", "BYTES", (1, 1), join_bytes([TEXT])),
            TensorData("X", "FP32", (1, 4), FLOATS.tobytes()),
        ),
        gateway="g",
        tenant=tenant,
        priority=1,
        timing=Timing(received_ns=1),
    )
    return Observed(request_id, "echo", tenant, "OK", 1, 2, job, JobResult.for_job(job))


async def everything(client: aioredis.Redis) -> bytes:
    """Every key's name and value in the database, as one blob to search."""
    blob = b""
    async for key in client.scan_iter():
        kind = await client.type(key)
        blob += key
        if kind == b"stream":
            for _, fields in await client.xrange(key):
                blob += b"".join(k + v for k, v in fields.items())
        elif kind == b"string":
            blob += await client.get(key) or b""
        elif kind == b"hash":
            blob += b"".join(k + v for k, v in (await client.hgetall(key)).items())
    return blob


async def test_no_text_or_tensor_bytes_are_stored_by_default(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        cap = Capture(client, CaptureState(1.0), max_len=100)
        cap.observe(observed("acme", "r1"))
        assert await cap.flush() == 1
        assert await client.xlen(keys.CAPTURE_STREAM) == 1
        blob = await everything(client)
        assert b"zebra" not in blob and b"telescope" not in blob
        assert FLOATS.tobytes() not in blob and FLOATS[0, :2].tobytes() not in blob
        assert b'"words":4' in blob  # the size is there
    finally:
        await client.aclose()


async def test_contents_of_an_enabled_tenant_are_encrypted_with_a_ttl(redis_url: str) -> None:
    key = Fernet.generate_key()
    client = aioredis.Redis.from_url(redis_url)
    try:
        cap = Capture(
            client,
            CaptureState(1.0),
            max_len=100,
            contents_tenants={"acme"},
            contents_key=key.decode(),
            contents_ttl_s=60,
        )
        cap.observe(observed("acme", "r1"))
        cap.observe(observed("other", "r2"))
        assert await cap.flush() == 2
        blob = await everything(client)
        assert b"zebra" not in blob and FLOATS.tobytes() not in blob
        sealed_key = keys.capture_content_key("r1")
        assert 0 < await client.ttl(sealed_key) <= 60
        assert not await client.exists(keys.capture_content_key("r2"))
        inputs = open_contents(await client.get(sealed_key), Fernet(key))
        assert inputs[0]["raw"] == join_bytes([TEXT])
        assert inputs[1]["raw"] == FLOATS.tobytes()
    finally:
        await client.aclose()


async def test_the_control_hash_starts_and_stops_capture(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        cap = Capture(client, CaptureState(0.0), max_len=100)
        cap.observe(observed("", "r0"))
        await cap.flush()
        assert await client.xlen(keys.CAPTURE_STREAM) == 0
        await client.hset(keys.CAPTURE_CONTROL, mapping={"rate": 1, "until_ms": 0})
        await cap.flush()  # reads the control hash
        cap.observe(observed("", "r1"))
        assert await cap.flush() == 1
    finally:
        await client.aclose()
