"""A tenants file for tests of model control, which needs API keys: an admin tenant that may
use every model, and a tenant that may use `simple` but not load or unload anything. The
keys are fresh per test session; the file holds only their hashes."""

from __future__ import annotations

import secrets
from pathlib import Path

from tiermesh.core.tenants import hash_key

ADMIN_KEY = "admin-" + secrets.token_urlsafe(24)
USER_KEY = "user-" + secrets.token_urlsafe(24)


def bearer(key: str) -> dict[str, str]:
    """The gRPC metadata (lower-case keys) or HTTP headers carrying `key`."""
    return {"authorization": f"Bearer {key}"}


# Shared by every test of a session: pass a copy to a client that adds to the headers it is
# given (tritonclient.http's infer does).
ADMIN = bearer(ADMIN_KEY)
USER = bearer(USER_KEY)


def write_tenants(path: Path) -> Path:
    """Write the two tenants to `path` (limits far above what a test sends); returns it."""
    path.write_text(
        "tenants:\n"
        "  - name: ops\n"
        f"    key_sha256: [{hash_key(ADMIN_KEY).hex()}]\n"
        '    models: "*"\n'
        "    rate: {requests_per_s: 1000, burst: 1000}\n"
        "    max_in_flight: 64\n"
        "    admin: true\n"
        "  - name: user\n"
        f"    key_sha256: [{hash_key(USER_KEY).hex()}]\n"
        "    models: [simple]\n"
        "    rate: {requests_per_s: 1000, burst: 1000}\n"
        "    max_in_flight: 64\n"
    )
    return path
