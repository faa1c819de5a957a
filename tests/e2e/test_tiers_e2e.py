"""Both tiers: light texts on edge, heavy ones on center, both FP32; when the edge
workers stop, light traffic moves to center without failures, and comes back after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import UpProcess, _environ
from tests.polling import eventually
from tiermesh.bench.calls import values_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SHORT = "a short sentence"
LONG = " ".join(["tiered routing sends heavy work to the center"] * 12)  # > 64 tokens


def served_by(client: grpcclient.InferenceServerClient, text: str) -> tuple[str, str]:
    inp = grpcclient.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    params = client.infer("minilm-l3", [inp], timeout=5_000_000).get_response(as_json=True)[
        "parameters"
    ]
    return params["tiermesh.tier"]["string_param"], params["tiermesh.variant"]["string_param"]


def restart_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tiermesh.worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_tiers_by_cost_and_edge_failover(
    new_up: Callable[..., UpProcess], fetched_models: tuple[str, ...]
) -> None:
    up = new_up(
        fetched=fetched_models,
        tiers=("center", "edge"),
        extra_env={"TIERMESH_HEARTBEAT_TTL_MS": "2000"},
    )
    client = grpcclient.InferenceServerClient(up.url)
    assert served_by(client, SHORT) == ("edge", "fp32")
    assert served_by(client, LONG) == ("center", "fp32")

    edge_pid = up.children()["worker-edge"]
    edge_env = _environ(Path(f"/proc/{edge_pid}"))
    os.kill(edge_pid, signal.SIGTERM)  # the edge tier stops (drains, deregisters)
    tiers: list[str] = []
    failures = 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(tiers) < 40:
        try:
            tiers.append(served_by(client, SHORT)[0])
        except Exception:  # every light request still had deadline room: none may fail
            failures += 1
    assert failures == 0
    assert tiers[-10:] == ["center"] * 10  # moved within the heartbeat TTL

    replacement = restart_worker(edge_env)
    try:
        eventually(lambda: served_by(client, SHORT)[0] == "edge", "light traffic back on edge")
        assert served_by(client, LONG)[0] == "center"
    finally:
        replacement.send_signal(signal.SIGTERM)
        replacement.wait(timeout=30)


def test_an_unsure_edge_answer_is_rerun_on_center(new_up: Callable[..., UpProcess]) -> None:
    """mlp_cascade: edge takes everything; a top-1 softmax under 0.99 goes to center."""
    up = new_up(tiers=("center", "edge"))
    client = grpcclient.InferenceServerClient(up.url)

    def ask(row: list[float]) -> tuple[dict[str, Any], np.ndarray]:
        inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(np.array([row], np.float32))
        res = client.infer("mlp_cascade", [inp])
        return values_of(res.get_response().parameters), res.as_numpy("OUTPUT0")

    sure, _ = ask([1, 2, 3, 4])  # logits ~ [24, 4.8, -29.7]: top-1 ~ 1.0
    assert sure["tier"] == "edge" and "cascaded" not in sure
    unsure, unsure_out = ask([0, 0, 0, 1])  # logits ~ [-0.2, 0.07, -5.8]: top-1 ~ 0.57
    assert unsure["tier"] == "center" and unsure["cascaded"] is True
    assert 0.5 < unsure["edge_confidence"] < 0.99
    logits = unsure_out[0].astype(np.float64)
    assert abs(np.exp(logits).max() / np.exp(logits).sum() - unsure["edge_confidence"]) < 1e-3
