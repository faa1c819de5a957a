"""The public port with a tenants file, through tritonclient and raw gRPC against
`tiermesh up`: API keys, allowed models, quotas, the audit stream, the size limits, and no
key or payload in the logs or spans.

Observed on grpcio 1.85.4 (tritonclient 2.73 and a raw grpc client alike), both produced by
gRPC itself before any handler runs, so neither carries a retry-after-ms trailer:
- a request message over TIERMESH_MAX_MESSAGE_BYTES: RESOURCE_EXHAUSTED
  ("Received message larger than max (N vs. M)");
- request headers over TIERMESH_MAX_METADATA_BYTES: RESOURCE_EXHAUSTED
  ("received metadata size exceeds hard limit ...").
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, running, start_up
from tests.polling import eventually
from tiermesh.core.keys import AUDIT_STREAM
from tiermesh.core.redis_client import connect_sync

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ACME = "acme-" + secrets.token_urlsafe(24)  # mlp and echo, generous limits
GLOBEX = "globex-" + secrets.token_urlsafe(24)  # echo only
TINY = "tiny-" + secrets.token_urlsafe(24)  # every model, two requests then none
OPS = "ops-admin-key-0123456789"
WRONG = "wrong-" + secrets.token_urlsafe(24)
MAX_MESSAGE_BYTES = 1024 * 1024
# Distinctive payloads that must never reach a log line or a span.
TEXT = "zebra-quasar-payload-7781 ünïcödé"
FLOATS = np.array([[31337.4375, -2718.28125, 1618.0339, 4242.4242]], np.float32)


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TENANTS = f"""
tenants:
  - name: acme
    key_sha256: [{sha(ACME)}]
    models: [mlp, echo]
    rate: {{requests_per_s: 1000, burst: 1000}}
    max_in_flight: 64
  - name: globex
    key_sha256: [{sha(GLOBEX)}]
    models: [echo]
    rate: {{requests_per_s: 1000, burst: 1000}}
    max_in_flight: 64
  - name: tiny
    key_sha256: [{sha(TINY)}]
    models: "*"
    rate: {{requests_per_s: 0.01, burst: 2}}
    max_in_flight: 64
  - name: ops
    key_sha256: [{sha(OPS)}]
    models: "*"
    admin: true
    rate: {{requests_per_s: 1000, burst: 1000}}
    max_in_flight: 64
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    tmp = tmp_path_factory.mktemp("secured")
    tenants = tmp / "tenants.yaml"
    tenants.write_text(TENANTS)
    up = start_up(
        tmp,
        extra_env={
            "TIERMESH_TENANTS_FILE": str(tenants),
            "TIERMESH_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
            # Everything any service would say, so the log test sees the most there is.
            "TIERMESH_LOG_LEVEL": "debug",
        },
    )
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def mlp_input(x: np.ndarray = FLOATS) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def text_input(text: str = TEXT) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    return inp


def status_of(call: Any) -> str:
    """The status name a tritonclient call ends with."""
    try:
        call()
    except InferenceServerException as exc:
        return str(exc.status()).removeprefix("StatusCode.")
    return "OK"


def raw_infer(up: UpProcess, model: str, metadata: list[tuple[str, str]]) -> grpc.RpcError:
    """A raw ModelInfer expected to fail; its error (code, details, trailers)."""
    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    req.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    with grpc.insecure_channel(up.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(req, metadata=metadata, timeout=10)
    return info.value


def audit_entries(up: UpProcess) -> list[dict[str, str]]:
    with connect_sync(up.redis_url()) as client:
        return [
            {k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in client.xrange(AUDIT_STREAM)
        ]


def scrape(up: UpProcess) -> str:
    with urllib.request.urlopen(up.metrics_urls()["gateway"], timeout=10) as resp:
        return str(resp.read().decode())


def test_probes_stay_open_without_a_key(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.get_server_metadata(as_json=True)["name"] == "tiermesh"
    with grpc.insecure_channel(secured.url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_no_key_or_a_wrong_key_is_unauthenticated(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    for headers in (None, bearer(WRONG), {"x-api-key": WRONG}, {"authorization": ACME}):
        assert status_of(lambda h=headers: client.infer("mlp", [mlp_input()], headers=h)) == (
            "UNAUTHENTICATED"
        )
    assert status_of(lambda: client.get_model_metadata("mlp")) == "UNAUTHENTICATED"
    assert status_of(lambda: client.get_model_config("mlp")) == "UNAUTHENTICATED"
    assert status_of(lambda: client.is_model_ready("mlp")) == "UNAUTHENTICATED"


def test_a_model_outside_the_tenants_list_is_permission_denied(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    # Whether or not the model exists: the tenant learns nothing about other models.
    for model in ("mlp", "minilm-l6", "no-such-model"):
        assert status_of(
            lambda m=model: client.infer(m, [mlp_input()], headers=bearer(GLOBEX))
        ) == ("PERMISSION_DENIED")
        assert status_of(lambda m=model: client.get_model_metadata(m, headers=bearer(GLOBEX))) == (
            "PERMISSION_DENIED"
        )
    assert status_of(lambda: client.is_model_ready("mlp", headers=bearer(GLOBEX))) == (
        "PERMISSION_DENIED"
    )
    # Only a tenant allowed every model hears that one does not exist.
    assert status_of(lambda: client.infer("no-such-model", [], headers=bearer(TINY))) == (
        "NOT_FOUND"
    )


def test_a_good_key_is_answered(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    out = client.infer("mlp", [mlp_input(np.ones((2, 4), np.float32))], headers=bearer(ACME))
    assert out.as_numpy("OUTPUT0").shape == (2, 3)
    echoed = client.infer("echo", [text_input("hello")], headers={"x-api-key": GLOBEX})
    assert echoed.as_numpy("ECHO")[0][0] == b"hello"
    assert client.get_model_metadata("mlp", headers=bearer(ACME), as_json=True)["name"] == "mlp"
    assert client.get_model_config("echo", headers=bearer(GLOBEX), as_json=True)["config"]
    assert client.is_model_ready("mlp", headers=bearer(ACME))


def test_statistics_count_every_tenant_so_only_an_admin_reads_them(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    client.infer("echo", [text_input("counted")], headers=bearer(GLOBEX))
    for key in (ACME, GLOBEX):  # both may use echo; neither sees the other's calls
        assert status_of(
            lambda k=key: client.get_inference_statistics("echo", headers=bearer(k))
        ) == ("PERMISSION_DENIED")
    doc = client.get_inference_statistics("echo", headers=bearer(OPS), as_json=True)
    assert int(doc["model_stats"][0]["inference_stats"]["success"]["count"]) >= 1


def test_over_quota_is_resource_exhausted_with_retry_after(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    # One refusal of each kind, for the refusal counters below.
    for headers in (None, bearer(WRONG), {"authorization": ACME}, bearer(GLOBEX)):
        status_of(lambda h=headers: client.infer("mlp", [mlp_input()], headers=h))
    for _ in range(2):  # the burst
        client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], headers=bearer(TINY))
    err = raw_infer(secured, "mlp", [("authorization", f"Bearer {TINY}")])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in (err.details() or "")
    # 0.01 requests/s: the next token is about 100 s away.
    trailers = dict(err.trailing_metadata() or ())
    assert 90_000 <= int(trailers["retry-after-ms"]) <= 100_000
    # Other tenants are not affected.
    client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], headers=bearer(ACME))
    metrics = scrape(secured)
    assert 'tiermesh_quota_refusals_total{kind="rate",tenant="tiny"} 1.0' in metrics
    # By reason only: neither keys nor (unknown) tenants become label values.
    for reason in ("missing_key", "unknown_key", "malformed_header", "model_not_allowed"):
        assert f'tiermesh_auth_refusals_total{{reason="{reason}"}}' in metrics


def test_the_audit_stream_records_who_called_what_with_which_outcome(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    status_of(lambda: client.infer("mlp", [mlp_input()]))
    status_of(lambda: client.infer("mlp", [mlp_input()], headers=bearer(GLOBEX)))
    client.infer("mlp", [mlp_input()], headers=bearer(ACME))
    wanted = {("-", "UNAUTHENTICATED"), ("globex", "PERMISSION_DENIED"), ("acme", "OK")}
    deadline = time.monotonic() + 20
    entries = audit_entries(secured)
    while not wanted <= {(e["tenant"], e["outcome"]) for e in entries}:
        assert time.monotonic() < deadline, f"audit entries missing: {entries[-5:]}"
        time.sleep(0.05)
        entries = audit_entries(secured)
    fields = {"time_ms", "operation", "tenant", "model", "variant", "outcome", "request_id", "peer"}
    for e in entries:
        assert set(e) == fields | {"duration_ms"}
        assert e["operation"] == "infer" or e["operation"].startswith("batch.")
        assert e["peer"].startswith("ipv4:127.0.0.1:") or e["peer"].startswith("ipv6:")
        assert float(e["duration_ms"]) >= 0 and int(e["time_ms"]) > 1_600_000_000_000
    ok = [e for e in entries if e["tenant"] == "acme" and e["outcome"] == "OK"]
    assert ok[-1]["model"] == "mlp" and ok[-1]["variant"] == "fp32"
    assert len(ok[-1]["request_id"]) == 32
    assert {e["outcome"] for e in entries if e["tenant"] == "tiny"} >= {"RESOURCE_EXHAUSTED"}


def test_message_and_metadata_size_limits(secured: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(secured.url)
    big = np.zeros((1, MAX_MESSAGE_BYTES // 4 + 1), np.float32)  # over the limit in bytes
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [mlp_input(big)], headers=bearer(ACME))
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in (info.value.message() or "")
    headers = {**bearer(ACME), "x-padding": "p" * 9000}  # default limit: 8192 bytes
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [mlp_input()], headers=headers)
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "metadata size exceeds" in (info.value.message() or "")
    # The same from a raw gRPC client, and a call under both limits still passes.
    err = raw_infer(secured, "mlp", [("authorization", f"Bearer {ACME}"), ("x-pad", "p" * 9000)])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    client.infer("mlp", [mlp_input()], headers={**bearer(ACME), "x-padding": "p" * 4000})


def _forms(secret: bytes) -> dict[str, bytes]:
    """Ways a secret could be written out: raw, hex, base64 (standard and URL-safe)."""
    return {
        "raw": secret,
        "hex": secret.hex().encode(),
        "base64": base64.b64encode(secret).rstrip(b"="),
        "base64url": base64.urlsafe_b64encode(secret).rstrip(b"="),
    }


def test_tiermesh_infer_sends_the_api_key(secured: UpProcess) -> None:
    argv = [sys.executable, "-m", "tiermesh.cli.main", "infer", "--url", secured.url]
    argv += ["--model", "mlp", "--data", "[[1, 2, 3, 4]]"]
    env = {k: v for k, v in os.environ.items() if k != "TIERMESH_API_KEY"}
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**env, "TIERMESH_API_KEY": ACME}
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "mlp"


def test_no_secret_or_payload_in_logs_or_spans(secured: UpProcess) -> None:
    """Last in this module: it stops the mesh so every log line and span is written out."""
    client = grpcclient.InferenceServerClient(secured.url)
    client.infer("echo", [text_input()], headers=bearer(ACME))
    client.infer("mlp", [mlp_input()], headers={"x-api-key": ACME})
    # Refusals and failures carrying the same payloads and keys.
    status_of(lambda: client.infer("echo", [text_input()], headers=bearer(WRONG)))
    status_of(lambda: client.infer("mlp", [mlp_input()], headers=bearer(GLOBEX)))
    status_of(lambda: client.infer("mlp", [mlp_input(FLOATS[:, :3])], headers=bearer(ACME)))
    status_of(lambda: client.infer("echo", [text_input()], headers={"authorization": ACME}))
    assert secured.interrupt() == 0
    log = secured.log.read_bytes()
    spans = b"\n".join(p.read_bytes() for p in sorted(secured.trace_dir.glob("*.jsonl")))
    # The captures are real: the log has the gateway's lines, the spans the tenant.
    assert b"API keys required on the public port" in log
    assert b'"tiermesh.tenant": "acme"' in spans or b'"tiermesh.tenant":"acme"' in spans
    secrets_ = {
        "acme key": ACME.encode(),
        "wrong key": WRONG.encode(),
        "globex key": GLOBEX.encode(),
        "acme key hash": sha(ACME).encode(),
        "text": TEXT.encode(),
        "text (as JSON writes it)": json.dumps(TEXT)[1:-1].encode(),
        "text word": b"zebra-quasar-payload",
        "tensor": FLOATS.tobytes(),
        "tensor slice": FLOATS[:, :3].tobytes(),
    }
    for what, secret in secrets_.items():
        for form, needle in _forms(secret).items():
            for name, haystack in (("log", log), ("spans", spans)):
                assert needle not in haystack, f"{what} ({form}) found in the {name}"
    for number in (b"31337.4", b"2718.28", b"1618.03", b"4242.42"):
        assert number not in log and number not in spans, f"tensor value {number!r} leaked"


def test_bad_tenants_file_stops_the_start(tmp_path: Path) -> None:
    bad = tmp_path / "tenants.yaml"
    bad.write_text(TENANTS.replace("max_in_flight: 64", "max_in_flight: 0", 1))
    with pytest.raises(AssertionError, match="did not start") as info:
        start_up(tmp_path / "up", extra_env={"TIERMESH_TENANTS_FILE": str(bad)})
    assert "bad tenants file" in str(info.value)
    assert "tenants.0.max_in_flight" in str(info.value)


def test_up_beyond_loopback_starts_keyless_only_with_insecure_and_says_so(
    tmp_path: Path,
) -> None:
    """`up --host 0.0.0.0 --insecure` without a tenants file serves without keys, and both
    the banner and the gateway's log say loudly what is open (without --insecure `up`
    refuses before starting anything: tests/unit/test_cli_errors.py)."""
    with running(tmp_path, up_args=["--host", "0.0.0.0", "--insecure"]) as up:
        banner = up.banner()
        port = up.url.rsplit(":", 1)[1]
        assert f"*** INSECURE (--insecure): no API keys on gRPC on 0.0.0.0:{port}, REST on" in (
            banner
        )
        client = grpcclient.InferenceServerClient(up.url)  # loopback reaches 0.0.0.0
        assert client.infer("mlp", [mlp_input()]).as_numpy("OUTPUT0") is not None
        eventually(
            lambda: "INSECURE (TIERMESH_INSECURE=true): no API keys on" in up.log.read_text(),
            "the gateway's own warning",
        )
