"""Model control (Triton's explicit mode) against `tiermesh up --model-control explicit`,
which starts only with API keys: tritonclient unmodified, with the admin tenant's key for
load and unload (refused without a key, and for a tenant not marked admin). Unload reaches
the workers (sessions closed, worker set left), load serves again, a model copied in after
the start loads, a tampered one is refused; the same over REST."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.conftest import copy_model
from tests.e2e.conftest import UpProcess, running
from tests.e2e.test_triton_clients_e2e import (
    UNKNOWN_MODEL,
    X0,
    X1,
    check_sums,
    grpc_inputs,
    http_inputs,
)
from tests.polling import eventually
from tests.tenants import ADMIN, USER, write_tenants
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.redis_client import connect_sync

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("control")
    tenants = write_tenants(tmp / "tenants.yaml")
    with running(
        tmp,
        extra_env={"TIERMESH_TENANTS_FILE": str(tenants)},
        up_args=["--model-control", "explicit"],
    ) as up:
        yield up


def test_only_the_admin_tenant_may_load_or_unload(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    for headers, code in [({}, "UNAUTHENTICATED"), (USER, "PERMISSION_DENIED")]:
        for control in (client.unload_model, client.load_model):
            with pytest.raises(InferenceServerException) as err:
                control("simple", headers=headers)
            assert err.value.status() == f"StatusCode.{code}", err.value
    assert client.is_model_ready("simple", headers=USER)
    check_sums(client.infer("simple", grpc_inputs(X0, X1), headers=USER))


def test_grpc_model_control(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    index = client.get_model_repository_index(headers=ADMIN, as_json=True)["models"]
    assert {"name": "simple", "version": "1", "state": "READY"} in index
    client.unload_model("simple_string", headers=ADMIN)
    try:
        assert not client.is_model_ready("simple_string", headers=ADMIN)
        a = np.array([["1"] * 16], dtype=np.object_)
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple_string", grpc_inputs(a, a), headers=ADMIN)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        entry = next(
            m
            for m in client.get_model_repository_index(headers=ADMIN, as_json=True)["models"]
            if m["name"] == "simple_string"
        )
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded"
    finally:
        client.load_model("simple_string", headers=ADMIN)
    assert client.is_model_ready("simple_string", headers=ADMIN)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("nope", headers=ADMIN)
    assert err.value.status() == "StatusCode.NOT_FOUND"
    assert err.value.message().startswith(f"failed to load 'nope': {UNKNOWN_MODEL}")


def _loaded_gauge(metrics_url: str, model: str) -> float | None:
    """The worker's tiermesh_worker_model_loaded for (model, version 1, center)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "tiermesh_worker_model_loaded" and s.labels.get("model") == model:
                return float(s.value)
    return None


def test_model_control_reaches_the_workers(mesh: UpProcess) -> None:
    """Unload closes the worker's session and deregisters it; load serves again; a model
    copied in after the start is loadable; a tampered one is refused."""
    client = grpcclient.InferenceServerClient(mesh.url)
    r = connect_sync(mesh.redis_url())
    worker_set = keys.workers_key(ComputeUnit("simple", "1", "fp32"), "center")
    metrics = mesh.metrics_urls()["worker"]
    assert r.zcard(worker_set) == 1 and _loaded_gauge(metrics, "simple") == 1.0
    client.unload_model("simple", headers=ADMIN)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("simple", grpc_inputs(X0, X1), headers=ADMIN)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        eventually(lambda: r.zcard(worker_set) == 0, "the worker left simple's worker set")
        eventually(lambda: _loaded_gauge(metrics, "simple") == 0.0, "the worker closed the session")
        eventually(
            lambda: (
                '"model unloaded; session closed"' in mesh.log.read_text()
                and '"unit": "simple@1.fp32"' in mesh.log.read_text()
            ),
            "the worker logged the closed session",
        )
    finally:
        client.load_model("simple", headers=ADMIN)
    assert client.is_model_ready("simple", headers=ADMIN) and r.zcard(worker_set) == 1
    assert _loaded_gauge(metrics, "simple") == 1.0
    check_sums(client.infer("simple", grpc_inputs(X0, X1), headers=ADMIN))

    repo = mesh.log.parent / "models"
    copy_model(repo, "simple", "simple_added")
    client.load_model("simple_added", headers=ADMIN)
    assert client.is_model_ready("simple_added", headers=ADMIN)
    check_sums(client.infer("simple_added", grpc_inputs(X0, X1), headers=ADMIN))

    copy_model(repo, "simple", "simple_tampered", tamper=True)
    with pytest.raises(InferenceServerException, match="do not match the sha256") as err:
        client.load_model("simple_tampered", headers=ADMIN)
    assert "nothing changed" in str(err.value)
    assert not client.is_model_ready("simple_tampered", headers=ADMIN)
    r.close()


def test_http_model_control(mesh: UpProcess) -> None:
    client = httpclient.InferenceServerClient(mesh.rest_url())
    with pytest.raises(InferenceServerException) as err:
        client.unload_model("simple", headers=USER)
    assert err.value.status() == "403"
    client.unload_model("simple", headers=ADMIN)
    try:
        assert not client.is_model_ready("simple", headers=ADMIN)
        with pytest.raises(InferenceServerException) as err:
            # A copy: tritonclient.http adds its Inference-Header-Content-Length (an int) to
            # the headers it is given, and ADMIN is shared by every test of the session.
            client.infer("simple", http_inputs(X0, X1), headers=dict(ADMIN))
        assert err.value.status() == "503"
    finally:
        client.load_model("simple", headers=ADMIN)
    assert client.is_model_ready("simple", headers=ADMIN)
    index = client.get_model_repository_index(headers=ADMIN)
    assert {"name": "simple", "version": "1", "state": "READY"} in index
