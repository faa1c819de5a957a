"""The REST door keeps the gRPC door's rules: API keys (Authorization: Bearer), the tenant's
models and quota (429 with Retry-After), and model control for admin tenants only."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, start_up
from tests.e2e.test_triton_clients_e2e import X0, X1, check_sums, http_inputs
from tiermesh.core import keys
from tiermesh.core.redis_client import connect_sync

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ADMIN = "admin-" + secrets.token_urlsafe(24)
USER = "user-" + secrets.token_urlsafe(24)  # simple only, two requests then none


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TENANTS = f"""
tenants:
  - name: ops
    key_sha256: [{sha(ADMIN)}]
    models: "*"
    rate: {{requests_per_s: 1000, burst: 1000}}
    max_in_flight: 64
    admin: true
  - name: user
    key_sha256: [{sha(USER)}]
    models: [simple]
    rate: {{requests_per_s: 0.01, burst: 3}}
    max_in_flight: 64
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("rest-secured")
    (tmp / "tenants.yaml").write_text(TENANTS)
    up = start_up(
        tmp,
        extra_env={"TIERMESH_TENANTS_FILE": str(tmp / "tenants.yaml")},
        up_args=["--model-control", "explicit"],
    )
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}  # gRPC metadata keys are lower-case


def test_rest_checks_keys_models_quota_and_admin(secured: UpProcess) -> None:
    client = httpclient.InferenceServerClient(secured.rest_url())
    assert client.is_server_live()  # probes need no key, as on gRPC
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", http_inputs(X0, X1))
    assert err.value.status() == "401" and "missing or invalid API key" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple_string", http_inputs(X0, X1), headers=bearer(USER))
    assert err.value.status() == "403"
    # Only the admin tenant may unload; the user tenant's refusal is 403.
    with pytest.raises(InferenceServerException) as err:
        client.unload_model("simple", headers=bearer(USER))
    assert err.value.status() == "403" and "admin" in err.value.message()
    admin = grpcclient.InferenceServerClient(secured.url)
    admin.unload_model("simple", headers=bearer(ADMIN))
    admin.load_model("simple", headers=bearer(ADMIN))
    # The user's burst is 3 requests (refusals by key or model take none of it).
    answered = refused = 0
    for _ in range(5):
        try:
            check_sums(client.infer("simple", http_inputs(X0, X1), headers=bearer(USER)))
            answered += 1
        except InferenceServerException as exc:
            assert exc.status() == "429", exc
            refused += 1
    assert answered >= 1 and refused >= 1
    index = client.get_model_repository_index(headers=bearer(USER))
    assert {m["name"] for m in index} == {"simple"}  # a tenant sees only its models
    # Refused before their bodies were read, still audited as the gRPC door's refusals are.
    r = connect_sync(secured.redis_url())
    wanted = {
        ("infer", "-", "simple", "UNAUTHENTICATED"),
        ("unload", "user", "simple", "PERMISSION_DENIED"),
    }
    deadline = time.monotonic() + 20
    while True:
        entries = [
            {k.decode(): v.decode() for k, v in f.items()} for _, f in r.xrange(keys.AUDIT_STREAM)
        ]
        seen = {(e["operation"], e["tenant"], e["model"], e["outcome"]) for e in entries}
        if wanted <= seen:
            break
        assert time.monotonic() < deadline, f"not audited: {wanted - seen}"
        time.sleep(0.05)


def test_a_429_carries_retry_after(secured: UpProcess) -> None:
    """Past the user's burst (3 requests), curl sees 429 with Retry-After."""
    row = np.zeros(16, int).tolist()
    doc = json.dumps(
        {
            "inputs": [
                {"name": n, "datatype": "INT32", "shape": [1, 16], "data": row}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    )
    url = f"http://{secured.rest_url()}/v2/models/simple/infer"
    head = ""
    for _ in range(5):
        out = subprocess.run(
            [
                "curl",
                "-s",
                "-i",
                "-X",
                "POST",
                "-H",
                f"Authorization: Bearer {USER}",
                "-d",
                doc,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        head = out.split("\r\n\r\n", 1)[0]
        if head.startswith("HTTP/1.1 429"):
            break
    assert head.startswith("HTTP/1.1 429"), head
    assert "Retry-After: " in head and "retry-after-ms: " in head.lower()
