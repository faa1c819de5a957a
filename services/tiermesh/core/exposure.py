"""Whether a mesh may open its public ports as configured: decided before anything listens,
by `tiermesh up` (its flags) and by the gateway (its settings), from plain values.

- A public port beyond loopback without API keys (no tenants file) is refused unless the
  operator opted out (`up --insecure`, TIERMESH_INSECURE=true); with the opt-out the mesh
  starts and says loudly what anyone who reaches it may do.
- Explicit model control without API keys is refused, always: load and unload take an
  admin tenant's key, and without a tenants file there is none. (Model state lives in
  Redis: a keyless gateway would let anyone unload models for every gateway sharing it.)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

# Where the operator names the tenants file (every service reads its settings from it).
TENANTS_ENV = "TIERMESH_TENANTS_FILE"
# What a keyless port lets anyone who reaches it do.
KEYLESS_REACH = "call every model, submit batch jobs and read every model's metadata and statistics"


class StartRefused(Exception):
    """The configuration must not serve: raised before anything listens; one line."""


@dataclass(frozen=True)
class PublicPort:
    """One public port as its owner's messages name it."""

    # "gRPC", "REST".
    door: str
    host: str
    # 0: a free port, chosen at start.
    port: int
    # What sets `host`, as the operator knows it: "--host", "TIERMESH_HTTP_HOST".
    setting: str

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.port > 0 else f"{host} (a free port)"


@dataclass(frozen=True)
class Exposure:
    """The decision: `refusal` ("" = it may start) and `warning` ("" = nothing to say)."""

    refusal: str = ""
    warning: str = ""


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) and `localhost`. Any other name counts as beyond
    loopback: what it resolves to is not ours to trust, and "" binds every interface."""
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def keyless_exposure(
    ports: Sequence[PublicPort], keys: bool, insecure: bool, opt_out: str
) -> Exposure:
    """Whether `ports` may listen: with API keys (`keys`) or on loopback only, yes, quietly;
    beyond loopback without keys, refused unless `insecure` (then with a warning naming
    every exposed port). `opt_out` names the opt-out in messages ("--insecure")."""
    beyond = [p for p in ports if not is_loopback(p.host)]
    if keys or not beyond:
        return Exposure()
    if not insecure:
        first = beyond[0]
        return Exposure(
            refusal=f"{first.setting} {first.host} listens beyond this machine without API "
            f'keys: set {TENANTS_ENV} to a tenants file (README "Security"), or give '
            f"{opt_out} to let anyone who reaches it {KEYLESS_REACH}"
        )
    where = ", ".join(f"{p.door} on {p.address}" for p in beyond)
    return Exposure(
        warning=f"INSECURE ({opt_out}): no API keys on {where}: anyone who reaches them may "
        f"{KEYLESS_REACH}; set {TENANTS_ENV} to require keys"
    )


def public_exposure(
    ports: Sequence[PublicPort],
    *,
    keys: bool,
    insecure: bool,
    opt_out: str,
    model_control: str,
    control_setting: str,
) -> Exposure:
    """The whole decision: control_refusal first (keys fix both), then keyless_exposure."""
    refused = control_refusal(model_control, keys, control_setting)
    if refused:
        return Exposure(refusal=refused)
    return keyless_exposure(ports, keys, insecure, opt_out)


def control_refusal(model_control: str, keys: bool, setting: str) -> str:
    """Why explicit model control must not start ("" = it may): it needs API keys.
    `setting` names what turned it on ("--model-control explicit")."""
    if model_control != "explicit" or keys:
        return ""
    return (
        f"{setting} needs API keys: set {TENANTS_ENV} to a tenants file with a tenant marked "
        "`admin: true` (only its key may load or unload models)"
    )
