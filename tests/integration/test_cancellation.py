"""A caller who leaves while its job is still on the router stream is marked as gone: the router may
already have queued the job (it XADDs before it replies), so workers must skip it. (A race
seen in CI: the caller cancelled between the XADD and the gateway reading the reply, no mark
was set, and the worker computed the request.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient

from tests.integration.conftest import start_mesh
from tests.polling import until
from tiermesh.core import keys
from tiermesh.core.jobs import Job
from tiermesh.gateway.upstream import Routed, RouterClient

pytestmark = pytest.mark.integration


async def test_leaving_while_the_route_call_is_out_marks_the_request_gone(
    redis_url: str, model_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = asyncio.Event()
    request_ids: list[str] = []

    async def held(self: RouterClient, job: Job, timeout_s: float) -> Routed:
        request_ids.append(job.request_id)
        sent.set()
        await asyncio.Event().wait()  # the router's reply never comes back in time
        raise AssertionError("unreachable")

    monkeypatch.setattr(RouterClient, "route", held)
    mesh = await start_mesh(redis_url, model_repo)
    redis = aioredis.Redis.from_url(redis_url)
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.ones((1, 4), np.float32))
        call = asyncio.ensure_future(client.infer("mlp", [inp]))
        await asyncio.wait_for(sent.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        (request_id,) = request_ids

        async def marked() -> bool:
            return bool(await redis.exists(keys.cancel_key(request_id)))

        await until(marked, "the gateway to mark the request as gone", 10)
    finally:
        await client.close()
        await redis.aclose()
        await mesh.close()
