"""TLS of a `tiermesh up` mesh: the files given on its command line (or the per-service
certificates `up` makes itself), checked before any process starts, handed to the children
as TIERMESH_ variables, and the credentials of the supervisor's own health checks.

Internal mutual TLS is on unless `--internal-tls off`: with no internal files given, `up`
writes a fresh CA and one certificate per service into its data folder (certs.py), so that
each service presents its own identity and the router, postprocess and the Delivery ports
take calls only from the services that make them (core/callers.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tiermesh.core.callers import CALLERS, IDENTITIES, PROBE
from tiermesh.core.tls import TlsConfigError, channel_credentials, load_pair, server_credentials
from tiermesh.up.certs import MeshCerts, identities_in


@dataclass(frozen=True)
class TlsFiles:
    """PEM files; None = not set. Public: cert and key together, client CA optional.
    Internal mutual TLS: either all three shared files (every service presents the same
    certificate) or a folder of one certificate per service (`internal_tls_dir`, holding
    ca.pem and SERVICE.pem/.key as certs.write_mesh_certs writes them), or neither."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    internal_tls_ca: Path | None = None
    internal_tls_cert: Path | None = None
    internal_tls_key: Path | None = None
    internal_tls_dir: Path | None = None

    def internal_given(self) -> bool:
        shared = (self.internal_tls_ca, self.internal_tls_cert, self.internal_tls_key)
        return self.internal_tls_dir is not None or any(f is not None for f in shared)


# TlsFiles field -> the variable the services read it from (core/settings.py).
ENV = {
    "tls_cert": "TIERMESH_TLS_CERT_FILE",
    "tls_key": "TIERMESH_TLS_KEY_FILE",
    "tls_client_ca": "TIERMESH_TLS_CLIENT_CA_FILE",
    "internal_tls_ca": "TIERMESH_INTERNAL_TLS_CA_FILE",
    "internal_tls_cert": "TIERMESH_INTERNAL_TLS_CERT_FILE",
    "internal_tls_key": "TIERMESH_INTERNAL_TLS_KEY_FILE",
}
# `tiermesh up --internal-tls` (default $TIERMESH_INTERNAL_TLS, else on).
INTERNAL_TLS_ENV = "TIERMESH_INTERNAL_TLS"
INTERNAL_TLS_MODES = ("on", "off")
# Identities that call an internal service: a shared certificate must name each of them,
# or some hop of the mesh would be refused at its first call.
CALLING: frozenset[str] = frozenset().union(*CALLERS.values())


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
    # Identity -> the variables naming that service's own certificate and key; empty when
    # every service presents one shared certificate (in `env`) or none.
    own: dict[str, dict[str, str]] = field(default_factory=dict)


def check_internal_mode(mode: str, files: TlsFiles) -> None:
    """`--internal-tls off` with internal TLS files given contradicts itself."""
    if mode not in INTERNAL_TLS_MODES:
        raise TlsConfigError(
            f"{INTERNAL_TLS_ENV}={mode!r}: choose one of {', '.join(INTERNAL_TLS_MODES)}"
        )
    if mode == "off" and files.internal_given():
        raise TlsConfigError(
            "--internal-tls off, yet internal TLS files are given (--internal-tls-*, "
            "--tls-dir or TIERMESH_INTERNAL_TLS_*): drop one or the other"
        )


def _shared(files: TlsFiles) -> grpc.ChannelCredentials | None:
    internal_files = (files.internal_tls_ca, files.internal_tls_cert, files.internal_tls_key)
    given = [f is not None for f in internal_files]
    if any(given) and not all(given):
        raise TlsConfigError(
            "internal mutual TLS needs --internal-tls-ca, --internal-tls-cert and "
            "--internal-tls-key together"
        )
    if not all(given):
        return None
    credentials = channel_credentials(*internal_files)
    assert files.internal_tls_cert is not None
    lacking = CALLING - identities_in(files.internal_tls_cert)
    if lacking:
        raise TlsConfigError(
            f"--internal-tls-cert {files.internal_tls_cert}: one certificate for every "
            f"service must name each caller's identity, and it lacks "
            f"{', '.join(f'spiffe://tiermesh/{i}' for i in sorted(lacking))} (a URI name; "
            "`tiermesh certs DIR` writes such an internal.pem), or leave the internal TLS "
            "files out: tiermesh up then makes one certificate per service"
        )
    return credentials


def _per_service(folder: Path) -> tuple[grpc.ChannelCredentials, dict[str, dict[str, str]]]:
    certs = MeshCerts(folder / "ca.pem")
    own = {}
    for identity in IDENTITIES:
        cert, key = certs.own(identity)
        load_pair(cert, key)
        if identity not in identities_in(cert):
            raise TlsConfigError(f"{cert}: names no spiffe://tiermesh/{identity}")
        own[identity] = {
            ENV["internal_tls_cert"]: str(cert.resolve()),
            ENV["internal_tls_key"]: str(key.resolve()),
        }
    probe_cert, probe_key = certs.own(PROBE)
    return channel_credentials(certs.ca, probe_cert, probe_key), own


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
    internal = _shared(files)
    env = {
        ENV[name]: str(path.resolve())
        for name, path in vars(files).items()
        if isinstance(path, Path) and name in ENV
    }
    own: dict[str, dict[str, str]] = {}
    if internal is None and files.internal_tls_dir is not None:
        internal, own = _per_service(files.internal_tls_dir)
        env[ENV["internal_tls_ca"]] = str((files.internal_tls_dir / "ca.pem").resolve())
    return MeshTls(env=env, public=files.tls_cert is not None, internal=internal, own=own)
