"""The response parameters the README documents, read off real responses of the default
mesh (both tiers): each situation sends exactly the names its table rows say, by gRPC and
by REST (the generative model's are checked in test_generation_e2e)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.documented_parameters import PREFIX, documented, documented_for
from tests.e2e.conftest import UpProcess, start_up

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def up(
    tmp_path_factory: pytest.TempPathFactory, fetched_models: tuple[str, ...]
) -> Iterator[UpProcess]:
    mesh = start_up(
        tmp_path_factory.mktemp("params"), fetched=fetched_models, tiers=("center", "edge")
    )
    try:
        yield mesh
    finally:
        if mesh.proc.poll() is None:
            mesh.interrupt()


def names(result: Any) -> set[str]:
    """The mesh's parameters of a response (a caller's own would not carry the prefix)."""
    return {k for k in result.get_response().parameters if k.startswith(PREFIX)}


def mlp(client: grpcclient.InferenceServerClient, model: str, row: list[float]) -> Any:
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.array([row], np.float32))
    return client.infer(model, [inp], timeout=10_000_000)


def test_computed_and_text_answers(up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(up.url)
    assert names(mlp(client, "mlp", [1, 2, 3, 4])) == documented_for("always", "computed")
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"one text, one vector"]], dtype=np.object_))
    embedded = client.infer("minilm-l6", [text], timeout=10_000_000)
    assert names(embedded) == documented_for("always", "computed", "text")


def test_cache_hit_and_cascade(up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(up.url)
    mlp(client, "mlp_cached", [0.5, 1.5, -2.0, 3.0])
    hit = mlp(client, "mlp_cached", [0.5, 1.5, -2.0, 3.0])
    assert names(hit) == documented_for("always", "cache hit")
    unsure = mlp(client, "mlp_cascade", [0, 0, 0, 1])  # top-1 softmax ~0.57: re-run on center
    assert names(unsure) == documented_for("always", "computed", "cascade")


def test_rest_sends_the_same_names_with_the_documented_types(up: UpProcess) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }
    request = urllib.request.Request(
        f"http://{up.rest_url()}/v2/models/mlp/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        params = json.loads(resp.read())["parameters"]
    assert set(params) == documented_for("always", "computed")
    python_type = {"double": float, "int64": int, "string": str, "bool": bool}
    table = documented()
    assert {k: type(v) for k, v in params.items()} == {k: python_type[table[k][0]] for k in params}
