"""Failed authentication, throttled per address, on an injected clock."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from tiermesh.core.errors import MeshError
from tiermesh.core.tenants import Tenant, hash_key
from tiermesh.gateway.auth import Tenants
from tiermesh.gateway.auth_throttle import FailedAuth, peer_address
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.security import AccessGate, Security


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.0.7:51234", "10.0.0.7"),
        ("ipv6:[::1]:51234", "::1"),
        ("http:192.168.1.2", "192.168.1.2"),
        ("unix:/tmp/s", "unix:/tmp/s"),
        ("", ""),
    ],
)
def test_the_address_of_a_peer_drops_its_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_an_address_is_refused_after_its_burst_until_a_token_refills() -> None:
    now = [0]
    failures = FailedAuth(burst=3, per_s=2.0, clock_ms=lambda: now[0])
    for _ in range(3):
        assert failures.wait_ms("a") == 0
        failures.failed("a")
    assert failures.wait_ms("a") == 500  # one token at 2 a second
    assert failures.wait_ms("b") == 0  # another address is not concerned
    now[0] = 250
    assert failures.wait_ms("a") == 250
    now[0] = 500
    assert failures.wait_ms("a") == 0


def test_the_table_of_addresses_is_bounded_oldest_first() -> None:
    failures = FailedAuth(burst=1, per_s=0.001, max_addresses=3, clock_ms=lambda: 0)
    for address in "abcd":
        failures.failed(address)
    assert len(failures) == 3
    assert failures.wait_ms("a") == 0  # forgotten
    assert failures.wait_ms("d") > 0


def _gate(failures: FailedAuth) -> tuple[AccessGate, CollectorRegistry]:
    registry = CollectorRegistry()
    tenant = Tenant("t", (hash_key("good"),), None, requests_per_s=10, burst=10, max_in_flight=4)
    security = Security(Tenants([tenant]), None, None)  # type: ignore[arg-type]
    return AccessGate(security, GatewayMetrics(registry), failures), registry


def test_the_gate_refuses_a_throttled_address_before_it_looks_at_the_key() -> None:
    gate, registry = _gate(FailedAuth(burst=2, per_s=1.0, clock_ms=lambda: 0))
    bad = (("authorization", "Bearer wrong"),)
    good = (("authorization", "Bearer good"),)
    for _ in range(2):
        with pytest.raises(MeshError) as err:
            gate.authenticate(bad, "ipv4:10.0.0.7:1")
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(MeshError) as err:
        gate.authenticate(good, "ipv4:10.0.0.7:2")  # even a good key, from that address
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.retry_after_ms == 1000
    tenant = gate.authenticate(good, "ipv4:10.0.0.8:1")  # another address is served
    assert tenant is not None and tenant.name == "t"
    sample = registry.get_sample_value("tiermesh_auth_refusals_total", {"reason": "throttled"})
    assert sample == 1
