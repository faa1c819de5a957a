"""Ctrl-C on `tiermesh up` under load: every accepted request is answered, nothing is left."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, gateway_counts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONCURRENCY = 16
MAX_REQUESTS = 3000


def test_ctrl_c_under_load_loses_nothing_and_leaves_no_process(
    new_up: Callable[..., UpProcess],
) -> None:
    up = new_up(grace_s=10)
    children = up.children()
    # The default: the Go front door on the public port, the Python gateway behind it (and
    # the private redis-server, unless the mesh uses a Redis of its environment).
    private = () if up.external_redis else ("redis",)
    assert set(children) == {"frontdoor", "gateway", "router", "worker", "postprocess", *private}
    model = up.log.parent / "models" / "mlp" / "1" / "model.onnx"
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    outcomes: list[tuple[str, bool]] = []  # (status, output correct)
    warmed_up = threading.Event()
    interrupted = threading.Event()
    ok_after_interrupt: list[int] = []

    async def client_loop(client: aioclient.InferenceServerClient, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while len(outcomes) < MAX_REQUESTS:
            x = rng.standard_normal((1, 4)).astype(np.float32)
            inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            try:
                result = await client.infer("mlp", [inp], client_timeout=30)
            except InferenceServerException as exc:
                outcomes.append((str(exc.status()), False))
                if exc.status() == str(grpc.StatusCode.UNAVAILABLE):
                    return  # the gateway is draining or gone: stop sending
                continue
            want = sess.run(["OUTPUT0"], {"INPUT0": x})[0]
            outcomes.append(("OK", bool(np.allclose(result.as_numpy("OUTPUT0"), want))))
            if interrupted.is_set():
                ok_after_interrupt.append(1)
            if len(outcomes) >= 100:
                warmed_up.set()

    async def load() -> None:
        client = aioclient.InferenceServerClient(up.url)
        try:
            await asyncio.gather(*(client_loop(client, i) for i in range(CONCURRENCY)))
        finally:
            await client.close()

    loader = threading.Thread(target=asyncio.run, args=(load(),))
    loader.start()
    assert warmed_up.wait(timeout=60), f"no traffic flowed: {outcomes[:5]}"
    interrupted.set()
    assert up.interrupt(timeout_s=60) == 0
    loader.join(timeout=60)
    assert not loader.is_alive()

    statuses = {status for status, _ in outcomes}
    # Refused at intake: UNAVAILABLE from the draining gateway or a closed port, or CANCELLED
    # by gRPC itself for a call that raced the server's stop and never reached a handler.
    assert statuses <= {"OK", str(grpc.StatusCode.UNAVAILABLE), str(grpc.StatusCode.CANCELLED)}
    assert all(correct for status, correct in outcomes if status == "OK")
    assert ok_after_interrupt, "requests in flight at Ctrl-C were not answered"
    # Every request the gateway accepted was answered, and the client got each answer.
    stopped = gateway_counts(up)
    assert stopped["accepted"] == stopped["answered"] == statuses_ok(outcomes)
    assert stopped["late_results"] == 0
    for name, pid in children.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) is still running"


def statuses_ok(outcomes: list[tuple[str, bool]]) -> int:
    return sum(1 for status, _ in outcomes if status == "OK")
