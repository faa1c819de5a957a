"""`tiermesh up` as `make run` starts it is safe by default inside: every internal hop speaks
mutual TLS with a certificate per service that `up` made in its data folder, each internal
port takes calls only from the services that make them (a forged Router, Postprocess or
Delivery call with another service's certificate is PERMISSION_DENIED, without one the
handshake fails), and its private Redis wants a password that is never printed whole.
`--internal-tls off` keeps the old plaintext, and says so."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import UpProcess, _environ, running, single_redis
from tests.e2e.test_requests_e2e import mlp_input, reference
from tests.integration.test_internal_callers import outcome
from tests.stream_refusals import server_status
from tiermesh.core.tls import channel_credentials
from tiermesh.up.certs import identities_in
from tiermesh.v1 import (
    delivery_pb2,
    delivery_pb2_grpc,
    postprocess_pb2,
    postprocess_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def safe_up(
    tmp_path_factory: pytest.TempPathFactory, fetched_models: tuple[str, ...]
) -> Iterator[UpProcess]:
    """A mesh with `up`'s defaults (no TLS flag, no Redis URL), both tiers as `make run`,
    and a text model, whose answers go through postprocess."""
    with running(
        tmp_path_factory.mktemp("safe-up"), fetched=("minilm-l3",), tiers=("center", "edge")
    ) as up:
        yield up


def environments(up: UpProcess) -> dict[str, dict[str, str]]:
    return {name: _environ(Path(f"/proc/{pid}")) for name, pid in up.children().items()}


def tls_folder(up: UpProcess) -> Path:
    return Path(environments(up)["router"]["TIERMESH_INTERNAL_TLS_CA_FILE"]).parent


def presenting(up: UpProcess, identity: str) -> grpc.ChannelCredentials:
    folder = tls_folder(up)
    return channel_credentials(
        folder / "ca.pem", folder / f"{identity}.pem", folder / f"{identity}.key"
    )


async def route_nothing(channel: grpc.aio.Channel) -> None:
    """A RouteStream carrying one empty batch: the router answers nothing and ends it.
    Raises with the router's status (tests/stream_refusals.py)."""

    async def once() -> None:
        call = router_pb2_grpc.RouterStub(channel).RouteStream(timeout=10)
        try:
            await call.write(router_pb2.JobBatch())
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the router ended the call before the batch went (a refused caller)
        while await call.read() is not grpc.aio.EOF:  # raises with the call's own status
            pass

    await server_status(once)


async def deliver_nothing(channel: grpc.aio.Channel) -> None:
    await delivery_pb2_grpc.DeliveryStub(channel).Deliver(delivery_pb2.Deliveries(), timeout=10)


async def process_nothing(channel: grpc.aio.Channel) -> None:
    await postprocess_pb2_grpc.PostprocessStub(channel).Process(
        postprocess_pb2.ResultBatch(), timeout=10
    )


def test_each_service_presents_a_certificate_of_its_own(safe_up: UpProcess) -> None:
    envs = environments(safe_up)
    expected = {
        "gateway": "gateway",
        "router": "router",
        "worker": "worker",
        "postprocess": "postprocess",
        "frontdoor": "frontdoor",
    }
    folder = tls_folder(safe_up)
    assert folder == safe_up.log.parent / "data" / "tls"
    for name, identity in expected.items():
        if name not in envs:  # no Go toolchain: the Python gateway serves alone
            assert name == "frontdoor"
            continue
        env = envs[name]
        assert env["TIERMESH_INTERNAL_TLS_CA_FILE"] == str(folder / "ca.pem"), name
        cert = Path(env["TIERMESH_INTERNAL_TLS_CERT_FILE"])
        assert identities_in(cert) == {identity}, name
        key = Path(env["TIERMESH_INTERNAL_TLS_KEY_FILE"])
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, name
    assert "Internal mTLS: on (a CA and a certificate per service in" in safe_up.banner()


def test_the_mesh_answers_over_its_internal_mtls(safe_up: UpProcess) -> None:
    """Through the front door (the Go one where built), router, worker, postprocess and
    Delivery: every hop authenticated, the answer right."""
    client = grpcclient.InferenceServerClient(safe_up.url)
    x = np.random.default_rng(22).standard_normal((2, 4)).astype(np.float32)
    result = client.infer("mlp", [mlp_input(x)], client_timeout=30)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(safe_up, x), rtol=1e-6)
    text = client.infer(
        "minilm-l3",
        [text_input(["the front door holds"])],
        client_timeout=60,
    )
    assert text.as_numpy("sentence_embedding").shape[0] == 1


def text_input(texts: list[str]) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    return inp


async def test_forged_internal_calls_are_refused(safe_up: UpProcess) -> None:
    """Each internal door, called by the identity that may and by one that may not, then
    with no certificate and in plaintext."""
    envs = environments(safe_up)
    doors = [
        ("router", f"127.0.0.1:{envs['router']['TIERMESH_ROUTER_PORT']}", route_nothing),
        (
            "gateway Delivery",
            f"127.0.0.1:{envs['gateway']['TIERMESH_DELIVERY_PORT']}",
            deliver_nothing,
        ),
        (
            "postprocess",
            f"127.0.0.1:{envs['postprocess']['TIERMESH_POSTPROCESS_PORT']}",
            process_nothing,
        ),
    ]
    assert ("frontdoor" in envs) == ("Front door: go" in safe_up.banner())
    if "frontdoor" in envs:  # the Go door's own Delivery port (frontdoor/go/tls.go)
        port = envs["frontdoor"]["TIERMESH_FRONT_DOOR_DELIVERY_PORT"]
        doors.append(("frontdoor Delivery", f"127.0.0.1:{port}", deliver_nothing))
    allowed = {"router": "gateway", "postprocess": "worker"}
    forger = {"router": "worker", "postprocess": "gateway"}
    folder = tls_folder(safe_up)
    for name, address, call in doors:
        right = allowed.get(name, "postprocess")
        wrong = forger.get(name, "router")
        assert await outcome(address, presenting(safe_up, right), call) == grpc.StatusCode.OK, name
        got = await outcome(address, presenting(safe_up, wrong), call)
        assert got == grpc.StatusCode.PERMISSION_DENIED, (name, got)
        anonymous = channel_credentials(folder / "ca.pem")
        assert await outcome(address, anonymous, call) == grpc.StatusCode.UNAVAILABLE, name
        assert await outcome(address, None, call) == grpc.StatusCode.UNAVAILABLE, name


@single_redis
def test_redis_wants_a_password_never_printed_whole(safe_up: UpProcess) -> None:
    url = safe_up.redis_url()
    password = urlsplit(url).password or ""
    assert len(password) >= 32
    log = safe_up.log.read_text()
    assert password not in log
    assert f"(redis: redis://:***@127.0.0.1:{url.rsplit(':', 1)[1]})" in log
    url_file = safe_up.log.parent / "data" / "redis-url"
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with redis.Redis(port=port) as anonymous:
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
    with redis.Redis.from_url(url) as client:
        assert client.config_get("maxmemory") == {"maxmemory": str(1024**3)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    for name, env in environments(safe_up).items():
        if name != "redis":
            assert env["TIERMESH_REDIS_URL"] == url, name


def test_internal_tls_off_is_plaintext_and_says_so(new_up: Callable[..., UpProcess]) -> None:
    up = new_up(up_args=["--internal-tls", "off", "--front-door", "python"])
    log = up.banner()
    assert "internal mTLS OFF (--internal-tls off)" in log  # on stderr at start
    assert "Internal mTLS: OFF (--internal-tls off)" in log  # and in the banner
    envs = environments(up)
    assert not any(k.startswith("TIERMESH_INTERNAL_TLS") for k in envs["router"])
    client = grpcclient.InferenceServerClient(up.url)
    x = np.ones((1, 4), dtype=np.float32)
    result = client.infer("mlp", [mlp_input(x)], client_timeout=30)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(up, x), rtol=1e-6)
