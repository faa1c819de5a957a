"""core/callers.py's decision, alone: who may call what, from a call's auth context."""

from __future__ import annotations

import grpc

from tiermesh.core.callers import identities_of, refusal

TLS = {"transport_security_type": [b"ssl"]}


def named(*uris: str) -> dict[str, list[bytes]]:
    return {**TLS, "peer_uri": [u.encode() for u in uris]}


def test_a_gateway_may_route() -> None:
    got = refusal("/tiermesh.v1.Router/RouteStream", named("spiffe://tiermesh/gateway"))
    assert got == (grpc.StatusCode.OK, "")


def test_a_worker_may_not_route_and_is_told_who_may() -> None:
    code, message = refusal("/tiermesh.v1.Router/RouteStream", named("spiffe://tiermesh/worker"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "spiffe://tiermesh/gateway" in message and "names spiffe://tiermesh/worker" in message


def test_plaintext_is_unauthenticated() -> None:
    code, _ = refusal("/tiermesh.v1.Delivery/DeliverStream", {})
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_a_method_of_no_internal_service_is_refused() -> None:
    code, _ = refusal(
        "/inference.GRPCInferenceService/ModelInfer", named("spiffe://tiermesh/gateway")
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED


def test_health_is_open() -> None:
    assert refusal("/grpc.health.v1.Health/Check", {})[0] == grpc.StatusCode.OK


def test_only_tiermesh_uris_are_identities() -> None:
    uris: list[str | bytes] = [
        b"spiffe://tiermesh/worker",
        "spiffe://other/gateway",
        "https://tiermesh/router",
    ]
    assert identities_of(uris) == frozenset({"worker"})


def test_a_uri_that_only_starts_like_an_identity_names_none() -> None:
    assert identities_of(["spiffe://tiermesh/gateway-evil"]) == frozenset({"gateway-evil"})
    code, _ = refusal("/tiermesh.v1.Router/RouteStream", named("spiffe://tiermesh/gateway-evil"))
    assert code == grpc.StatusCode.PERMISSION_DENIED
