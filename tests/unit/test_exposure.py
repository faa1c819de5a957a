"""What a mesh's public ports may expose, decided before anything listens (core/exposure.py):
beyond loopback only with API keys or an explicit opt-out (then a warning names every open
port); explicit model control only with API keys, opt-out or not. The gateway decides so
from its settings (the image binds 0.0.0.0), `tiermesh up` from its flags."""

from __future__ import annotations

import pytest

from tiermesh.core.exposure import (
    KEYLESS_REACH,
    Exposure,
    PublicPort,
    StartRefused,
    control_refusal,
    is_loopback,
    keyless_exposure,
    public_exposure,
)
from tiermesh.core.settings import GatewaySettings
from tiermesh.gateway.public_port import check_exposure

LOOPBACK = ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST", "::ffff:127.0.0.1"]
BEYOND = ["0.0.0.0", "::", "[::]", "", "192.168.1.20", "10.0.0.5", "fe80::1", "example.com"]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", BEYOND)
def test_every_other_address_or_name_is_beyond_loopback(host: str) -> None:
    assert not is_loopback(host)


def ports(host: str) -> list[PublicPort]:
    return [PublicPort("gRPC", host, 8001, "--host"), PublicPort("REST", host, 0, "--host")]


@pytest.mark.parametrize("host", LOOPBACK)
@pytest.mark.parametrize("insecure", [False, True])
def test_loopback_needs_no_keys_and_says_nothing(host: str, insecure: bool) -> None:
    assert keyless_exposure(ports(host), False, insecure, "--insecure") == Exposure()


@pytest.mark.parametrize("host", BEYOND)
@pytest.mark.parametrize("insecure", [False, True])
def test_keys_make_any_address_quiet(host: str, insecure: bool) -> None:
    assert keyless_exposure(ports(host), True, insecure, "--insecure") == Exposure()


def test_beyond_loopback_without_keys_is_refused_in_one_line() -> None:
    decided = keyless_exposure(ports("0.0.0.0"), False, False, "--insecure")
    assert decided.warning == ""
    assert decided.refusal.startswith("--host 0.0.0.0 listens beyond this machine without API")
    assert "TIERMESH_TENANTS_FILE" in decided.refusal and "--insecure" in decided.refusal
    assert "\n" not in decided.refusal


def test_the_opt_out_starts_and_names_every_exposed_port() -> None:
    decided = keyless_exposure(ports("::"), False, True, "--insecure")
    assert decided.refusal == ""
    assert decided.warning.startswith("INSECURE (--insecure): no API keys on ")
    assert "gRPC on [::]:8001" in decided.warning
    assert "REST on [::] (a free port)" in decided.warning
    assert KEYLESS_REACH in decided.warning and "\n" not in decided.warning


def test_only_the_ports_beyond_loopback_are_named() -> None:
    mixed = [
        PublicPort("gRPC", "127.0.0.1", 8001, "TIERMESH_GATEWAY_HOST"),
        PublicPort("REST", "0.0.0.0", 8000, "TIERMESH_HTTP_HOST"),
    ]
    refused = keyless_exposure(mixed, False, False, "TIERMESH_INSECURE=true")
    assert refused.refusal.startswith("TIERMESH_HTTP_HOST 0.0.0.0 listens beyond")
    assert "give TIERMESH_INSECURE=true to" in refused.refusal
    warned = keyless_exposure(mixed, False, True, "TIERMESH_INSECURE=true")
    assert "REST on 0.0.0.0:8000" in warned.warning and "gRPC" not in warned.warning


def test_explicit_model_control_needs_keys_whatever_the_address() -> None:
    setting = "--model-control explicit"
    assert control_refusal("none", False, setting) == ""
    assert control_refusal("explicit", True, setting) == ""
    refused = control_refusal("explicit", False, setting)
    assert refused.startswith("--model-control explicit needs API keys: set TIERMESH_TENANTS")
    assert "admin: true" in refused
    for host, insecure in [("127.0.0.1", False), ("0.0.0.0", True)]:
        decided = public_exposure(
            ports(host),
            keys=False,
            insecure=insecure,
            opt_out="--insecure",
            model_control="explicit",
            control_setting=setting,
        )
        assert decided == Exposure(refusal=refused), host


def test_with_keys_explicit_control_beyond_loopback_is_quiet() -> None:
    decided = public_exposure(
        ports("0.0.0.0"),
        keys=True,
        insecure=False,
        opt_out="--insecure",
        model_control="explicit",
        control_setting="--model-control explicit",
    )
    assert decided == Exposure()


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"gateway_host": "0.0.0.0"}, "TIERMESH_GATEWAY_HOST 0.0.0.0 listens beyond this"),
        ({"http_host": "::"}, "TIERMESH_HTTP_HOST :: listens beyond this machine"),
        ({"model_control": "explicit"}, "TIERMESH_MODEL_CONTROL=explicit needs API keys"),
        ({"model_control": "explicit", "insecure": True}, "explicit needs API keys"),
    ],
)
def test_the_gateway_refuses_what_it_would_expose_without_keys(
    settings: dict[str, object], refusal: str
) -> None:
    with pytest.raises(StartRefused, match=refusal) as err:
        check_exposure(GatewaySettings(**settings))  # type: ignore[arg-type]
    assert "give TIERMESH_INSECURE=true" in str(err.value) or "explicit" in refusal


@pytest.mark.parametrize(
    ("settings", "warning"),
    [
        ({}, ""),  # loopback, as the settings default
        ({"http_host": "0.0.0.0", "http_port": -1}, ""),  # no REST door
        ({"gateway_host": "0.0.0.0", "tenants_file": "tenants.yaml"}, ""),
        ({"gateway_host": "0.0.0.0", "insecure": True}, "INSECURE (TIERMESH_INSECURE=true): "),
    ],
)
def test_the_gateway_starts_with_keys_on_loopback_or_insecure(
    settings: dict[str, object], warning: str
) -> None:
    said = check_exposure(GatewaySettings(**settings))  # type: ignore[arg-type]
    assert said.startswith(warning) and bool(said) == bool(warning)
    if warning:
        assert "gRPC on 0.0.0.0:8001" in said and "REST" not in said
