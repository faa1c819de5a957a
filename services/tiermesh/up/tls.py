"""TLS of a `tiermesh up` mesh: the files given on its command line, checked before any
process starts, handed to the children as TIERMESH_ variables, and the credentials of the
supervisor's own health checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from tiermesh.core.tls import TlsConfigError, channel_credentials, server_credentials


@dataclass(frozen=True)
class TlsFiles:
    """PEM files; None = not set. Public: cert and key together, client CA optional.
    Internal mutual TLS: all three or none."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    internal_tls_ca: Path | None = None
    internal_tls_cert: Path | None = None
    internal_tls_key: Path | None = None


# TlsFiles field -> the variable the services read it from (core/settings.py).
ENV = {
    "tls_cert": "TIERMESH_TLS_CERT_FILE",
    "tls_key": "TIERMESH_TLS_KEY_FILE",
    "tls_client_ca": "TIERMESH_TLS_CLIENT_CA_FILE",
    "internal_tls_ca": "TIERMESH_INTERNAL_TLS_CA_FILE",
    "internal_tls_cert": "TIERMESH_INTERNAL_TLS_CERT_FILE",
    "internal_tls_key": "TIERMESH_INTERNAL_TLS_KEY_FILE",
}


@dataclass(frozen=True)
class MeshTls:
    # TIERMESH_ variables for every child (absolute paths: children may change directory).
    env: dict[str, str]
    # The public port serves TLS only: the supervisor checks the gateway's health on its
    # internal Delivery port instead, which it can always authenticate to (the public
    # certificate may be for a name, or from a CA, that loopback cannot verify).
    public: bool
    # What the supervisor presents to internal servers (None: plaintext).
    internal: grpc.ChannelCredentials | None


def mesh_tls(files: TlsFiles) -> MeshTls:
    """Raises TlsConfigError on an incomplete set or a file that is not usable, naming
    the flag (or file) to fix."""
    public = (files.tls_cert, files.tls_key)
    if (public[0] is None) != (public[1] is None):
        raise TlsConfigError("--tls-cert and --tls-key go together (TLS on the public port)")
    if files.tls_client_ca is not None and files.tls_cert is None:
        raise TlsConfigError("--tls-client-ca needs --tls-cert and --tls-key")
    if files.tls_cert is not None and files.tls_key is not None:
        server_credentials(files.tls_cert, files.tls_key, files.tls_client_ca)
    internal_files = (files.internal_tls_ca, files.internal_tls_cert, files.internal_tls_key)
    given = [f is not None for f in internal_files]
    if any(given) and not all(given):
        raise TlsConfigError(
            "internal mutual TLS needs --internal-tls-ca, --internal-tls-cert and "
            "--internal-tls-key together"
        )
    internal = None
    if all(given):
        internal = channel_credentials(*internal_files)
    env = {
        ENV[name]: str(path.resolve())
        for name, path in vars(files).items()
        if isinstance(path, Path)
    }
    return MeshTls(env=env, public=files.tls_cert is not None, internal=internal)
