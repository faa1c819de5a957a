"""Who is calling and may they use that model: API key -> tenant -> allowed models.

Pure and synchronous: the data plane hands over the call's metadata as (key, value) pairs and
the model name; refusals are MeshErrors carrying a `reason` for the metrics. Nothing here
logs, and no message repeats a credential.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence

import grpc

from tiermesh.core.errors import MeshError
from tiermesh.core.tenants import Tenant, hash_key

AUTHORIZATION = "authorization"
API_KEY = "x-api-key"
BEARER = "bearer "

# Reasons a call is refused, the `reason` label of the refusal counter.
MISSING = "missing_key"
MALFORMED = "malformed_header"
UNKNOWN = "unknown_key"
NOT_ALLOWED = "model_not_allowed"


class AuthRefused(MeshError):
    """UNAUTHENTICATED or PERMISSION_DENIED, with why (for metrics, never for the caller)."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str) -> None:
        super().__init__(code, message)
        self.reason = reason


def _unauthenticated(reason: str) -> AuthRefused:
    # One message for every credential failure: the caller learns nothing about which keys
    # or tenants exist.
    return AuthRefused(
        grpc.StatusCode.UNAUTHENTICATED,
        "missing or invalid API key (send 'authorization: Bearer <key>')",
        reason,
    )


class Tenants:
    """The tenants of the file, looked up by the key a caller presents."""

    def __init__(self, tenants: Sequence[Tenant]) -> None:
        self._by_hash = tuple((h, t) for t in tenants for h in t.key_hashes)
        self.names = tuple(t.name for t in tenants)
        # Tenants whose request contents traffic capture may keep (encrypted).
        self.capture_contents = frozenset(t.name for t in tenants if t.capture_contents)

    def lookup(self, key: str) -> Tenant | None:
        """The tenant holding `key`, or None. The presented key's digest is compared with
        every stored digest in constant time and the loop never exits early, so the time
        taken says nothing about which (or whether a) stored key came close."""
        digest = hash_key(key)
        found: Tenant | None = None
        for stored, tenant in self._by_hash:
            if hmac.compare_digest(digest, stored):
                found = tenant
        return found


def presented_key(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The API key in the call's metadata: `authorization: Bearer <key>` or `x-api-key: <key>`.
    Raises UNAUTHENTICATED when there is none or the header is not of that form."""
    bearer: list[str] = []
    plain: list[str] = []
    for name, value in metadata:
        if isinstance(value, bytes):  # only `-bin` headers arrive as bytes: never a key
            continue
        lowered = name.lower()
        if lowered == AUTHORIZATION:
            bearer.append(value)
        elif lowered == API_KEY:
            plain.append(value)
    if not bearer and not plain:
        raise _unauthenticated(MISSING)
    # Two credentials that might disagree are refused rather than guessed between.
    if len(bearer) + len(plain) > 1:
        raise _unauthenticated(MALFORMED)
    if bearer:
        value = bearer[0]
        if value[: len(BEARER)].lower() != BEARER:
            raise _unauthenticated(MALFORMED)
        key = value[len(BEARER) :].strip()
    else:
        key = plain[0].strip()
    if not key:
        raise _unauthenticated(MALFORMED)
    return key


def authenticate(tenants: Tenants, metadata: Iterable[tuple[str, str | bytes]]) -> Tenant:
    """The calling tenant; UNAUTHENTICATED when the key is missing, malformed or unknown."""
    tenant = tenants.lookup(presented_key(metadata))
    if tenant is None:
        raise _unauthenticated(UNKNOWN)
    return tenant


def may_use(tenant: Tenant, model: str) -> bool:
    return tenant.may_use(model)


def check_model(tenant: Tenant, model: str) -> None:
    """PERMISSION_DENIED unless the tenant may use `model`. Decided on the name alone,
    before the repository is asked, so a tenant cannot learn which other models exist."""
    if not may_use(tenant, model):
        raise AuthRefused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"tenant '{tenant.name}' may not use model '{model}'",
            NOT_ALLOWED,
        )


def authorize(tenants: Tenants, metadata: Iterable[tuple[str, str | bytes]], model: str) -> Tenant:
    """authenticate, then check_model: the tenant, or the refusal."""
    tenant = authenticate(tenants, metadata)
    check_model(tenant, model)
    return tenant


# The refusal counter's reason for a non-admin tenant asking what only an admin may see.
NOT_ADMIN = "not_admin"


def check_statistics(tenant: Tenant | None) -> None:
    """ModelStatistics counts every tenant's calls to a model: on a port with API keys only
    a tenant marked admin may read them (None: the port has none)."""
    if tenant is not None and not tenant.admin:
        raise AuthRefused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"tenant '{tenant.name}' may not read statistics: they count every tenant's calls "
            "(needs admin: true)",
            NOT_ADMIN,
        )
