"""The tenants file: who may call the public port, with which keys, models and limits.

Keys are never stored, only the sha256 hex of each; ``tiermesh keys new`` prints a fresh key
once with the YAML to paste here. The file is read once when the gateway starts; a bad file
stops the start with a message naming each problem. Pure: no gRPC, no Redis.

    tenants:
      - name: acme
        key_sha256: [9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08]
        models: [mlp, minilm-l6]        # or "*" for every model
        rate: {requests_per_s: 50, burst: 100}
        max_in_flight: 32
        admin: false                    # true: may load/unload models (model control)
        capture_contents: false         # true: traffic capture may keep its inputs (encrypted)
        batch: {max_open_jobs: 8, max_inputs: 100000, max_bytes: 268435456}
                                        # batch-job caps; each left out: TIERMESH_BATCH_MAX_*
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

# Tenant names end up in Redis key names and metric labels: keep them plain.
TENANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
TenantName = Annotated[str, StringConstraints(pattern=TENANT_NAME_PATTERN)]
KeyHash = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$", strip_whitespace=True, to_lower=True)
]
# Bytes of randomness in a key made by `tiermesh keys new` (256 bits).
KEY_BYTES = 32


class TenantsFileError(ValueError):
    """The tenants file cannot be used; the message says where and why (never key material:
    the file holds none)."""


class _Rate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    requests_per_s: float = Field(gt=0, allow_inf_nan=False)
    burst: int = Field(ge=1)


class _Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_open_jobs: int | None = Field(default=None, ge=1)
    max_inputs: int | None = Field(default=None, ge=1)
    max_bytes: int | None = Field(default=None, ge=1)


class _Tenant(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: TenantName
    key_sha256: list[KeyHash] = Field(min_length=1)
    models: Literal["*"] | list[str] = Field(min_length=1)
    rate: _Rate
    max_in_flight: int = Field(ge=1)
    admin: bool = False
    capture_contents: bool = False
    batch: _Batch = _Batch()


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tenants: list[_Tenant] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    # Raw 32-byte sha256 digests of the tenant's keys (several while a key is rotated).
    key_hashes: tuple[bytes, ...]
    # None: every model.
    models: frozenset[str] | None
    requests_per_s: float
    burst: int
    max_in_flight: int
    # May load and unload models (model control in explicit mode).
    admin: bool = False
    # Traffic capture may store this tenant's request contents (encrypted, with a TTL).
    capture_contents: bool = False

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models

    # Batch-job caps of this tenant: unfinished jobs, inputs and bytes per job (None: the
    # gateway's TIERMESH_BATCH_MAX_OPEN_JOBS / _INPUTS / _BYTES).
    batch_max_open_jobs: int | None = None
    batch_max_inputs: int | None = None
    batch_max_bytes: int | None = None


def hash_key(key: str) -> bytes:
    """The sha256 digest the tenants file records (as hex) for `key`."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def new_key() -> str:
    """A fresh random API key (URL-safe text, 256 bits of randomness)."""
    return secrets.token_urlsafe(KEY_BYTES)


def tenant_snippet(name: str, key: str) -> str:
    """The YAML entry for a tenant holding `key`; models and limits are placeholders to edit."""
    return (
        "tenants:\n"
        f"  - name: {name}\n"
        f"    key_sha256: [{hash_key(key).hex()}]\n"
        '    models: "*"                     # or a list: [mlp, minilm-l6]\n'
        "    rate: {requests_per_s: 50, burst: 100}\n"
        "    max_in_flight: 32\n"
    )


def parse_tenants(text: str, source: str = "tenants file") -> tuple[Tenant, ...]:
    """The tenants described by YAML `text`; TenantsFileError naming every problem."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TenantsFileError(f"{source}: not valid YAML: {exc}") from None
    try:
        parsed = _File.model_validate(raw)
    except ValidationError as exc:
        # Without the offending input: only locations and reasons reach the log.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}"
            for err in exc.errors(include_input=False, include_url=False)
        )
        raise TenantsFileError(f"{source}: {problems}") from None
    tenants = tuple(_to_tenant(t) for t in parsed.tenants)
    _check_unique(tenants, source)
    return tenants


def load_tenants(path: Path) -> tuple[Tenant, ...]:
    """Read and check the tenants file at `path` (called once, when the gateway starts)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantsFileError(f"cannot read tenants file {path}: {exc}") from None
    return parse_tenants(text, str(path))


def _to_tenant(t: _Tenant) -> Tenant:
    return Tenant(
        name=t.name,
        key_hashes=tuple(bytes.fromhex(h) for h in t.key_sha256),
        models=None if t.models == "*" else frozenset(t.models),
        requests_per_s=t.rate.requests_per_s,
        burst=t.rate.burst,
        max_in_flight=t.max_in_flight,
        admin=t.admin,
        capture_contents=t.capture_contents,
        batch_max_open_jobs=t.batch.max_open_jobs,
        batch_max_inputs=t.batch.max_inputs,
        batch_max_bytes=t.batch.max_bytes,
    )


def _check_unique(tenants: Sequence[Tenant], source: str) -> None:
    """A name or key hash listed twice would make a caller's tenant ambiguous."""
    names: set[str] = set()
    hashes: set[bytes] = set()
    for t in tenants:
        if t.name in names:
            raise TenantsFileError(f"{source}: tenant '{t.name}' is listed twice")
        names.add(t.name)
        for h in t.key_hashes:
            if h in hashes:
                raise TenantsFileError(
                    f"{source}: tenant '{t.name}' repeats a key hash already listed"
                )
            hashes.add(h)
