"""`tiermesh up` with TLS on the public port and mutual TLS between its services."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, _environ, start_up
from tests.e2e.test_requests_e2e import mlp_input, reference
from tiermesh.core.tls import channel_credentials
from tiermesh.up.certs import DevCerts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def tls_up(tmp_path_factory: pytest.TempPathFactory, certs: DevCerts) -> Iterator[UpProcess]:
    up = start_up(
        tmp_path_factory.mktemp("tls-up"),
        up_args=[
            *("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)),
            *("--internal-tls-ca", str(certs.ca)),
            *("--internal-tls-cert", str(certs.internal_cert)),
            *("--internal-tls-key", str(certs.internal_key)),
        ],
        credentials=channel_credentials(certs.ca),
    )
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def health(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """One health Check that fails fast: OK (SERVING) or the code it failed with."""
    channel = (
        grpc.insecure_channel(address)
        if credentials is None
        else grpc.secure_channel(address, credentials)
    )
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


def test_tritonclient_over_tls_gets_the_right_answer(tls_up: UpProcess, certs: DevCerts) -> None:
    client = grpcclient.InferenceServerClient(tls_up.url, ssl=True, root_certificates=str(certs.ca))
    assert client.is_server_ready()
    x = np.random.default_rng(8).standard_normal((3, 4)).astype(np.float32)
    result = client.infer("mlp", [mlp_input(x)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(tls_up, x), rtol=1e-6)


def test_plaintext_to_the_tls_port_fails(tls_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(tls_up.url)
    x = np.ones((1, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("mlp", [mlp_input(x)], client_timeout=10)
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert health(tls_up.url, None) == grpc.StatusCode.UNAVAILABLE


def test_internal_ports_refuse_clients_without_a_certificate(
    tls_up: UpProcess, certs: DevCerts
) -> None:
    env = {name: _environ(Path(f"/proc/{pid}")) for name, pid in tls_up.children().items()}
    ports = {
        "router": env["router"]["TIERMESH_ROUTER_PORT"],
        "postprocess": env["postprocess"]["TIERMESH_POSTPROCESS_PORT"],
        "worker": env["worker"]["TIERMESH_WORKER_HEALTH_PORT"],
        "delivery": env["gateway"]["TIERMESH_DELIVERY_PORT"],
    }
    with_cert = channel_credentials(certs.ca, certs.internal_cert, certs.internal_key)
    for name, port in ports.items():
        address = f"127.0.0.1:{port}"
        assert health(address, None) == grpc.StatusCode.UNAVAILABLE, name
        assert health(address, channel_credentials(certs.ca)) == grpc.StatusCode.UNAVAILABLE, name
        # The same port answers a client that presents the internal certificate.
        assert health(address, with_cert) == grpc.StatusCode.OK, name


def test_incomplete_tls_options_stop_up_before_it_starts(tmp_path: Path, certs: DevCerts) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "tiermesh.cli.main", "up", "--port", "0"),
            *("--data-dir", str(tmp_path), "--tls-cert", str(certs.server_cert)),
        ],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2  # a usage error: found before anything starts
    assert b"--tls-cert and --tls-key go together" in done.stderr
    assert not (tmp_path / "redis").exists(), "nothing should have started"


def test_tls_dir_with_client_certificates_required(
    new_up: Callable[..., UpProcess], certs: DevCerts
) -> None:
    """`--tls-dir` (what `tiermesh certs` wrote) plus a public port that requires client
    certificates: `tiermesh up` still checks its gateway's health (on the Delivery port)."""
    folder = certs.ca.parent
    up = new_up(
        up_args=["--tls-dir", str(folder), "--tls-client-ca", str(certs.ca)],
        credentials=channel_credentials(certs.ca, certs.client_cert, certs.client_key),
    )
    client = grpcclient.InferenceServerClient(
        up.url,
        ssl=True,
        root_certificates=str(certs.ca),
        private_key=str(certs.client_key),
        certificate_chain=str(certs.client_cert),
    )
    x = np.ones((2, 4), dtype=np.float32)
    result = client.infer("mlp", [mlp_input(x)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(up, x), rtol=1e-6)
    anonymous = grpcclient.InferenceServerClient(up.url, ssl=True, root_certificates=str(certs.ca))
    with pytest.raises(InferenceServerException) as refused:
        anonymous.infer("mlp", [mlp_input(x)], client_timeout=10)
    assert refused.value.status() == "StatusCode.UNAVAILABLE"


def test_tiermesh_infer_over_tls(tls_up: UpProcess, certs: DevCerts) -> None:
    argv = [sys.executable, "-m", "tiermesh.cli.main", "infer", "--url", tls_up.url]
    argv += ["--model", "mlp", "--data", "[[1, 2, 3, 4]]"]
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0 and "UNAVAILABLE" in plain.stderr
    done = subprocess.run(
        [*argv, "--tls-ca", str(certs.ca)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "mlp"
