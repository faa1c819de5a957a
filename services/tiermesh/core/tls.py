"""gRPC credentials from the TLS settings, in one place: the public port's TLS (optionally
requiring client certificates) and the optional mutual TLS between services.

Files are read and checked once, when a service starts (and by `tiermesh up` before it
starts anything), so a missing, unreadable or malformed file, or a key that does not
belong to its certificate, stops start-up with a message naming the setting; gRPC itself
would only fail later, at the first handshake. None means plaintext, as without TLS.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from tiermesh.core.callers import CallerCheck
from tiermesh.core.settings import GatewaySettings, ServiceSettings

ENV_PREFIX = "TIERMESH_"


class TlsConfigError(ValueError):
    """TLS settings that cannot work: an incomplete set, or files that are not usable."""


def _env(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def _no_password() -> bytes:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal; gRPC cannot
    # use one either, so it fails here with the other bad keys.
    return b""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{what} {path}: cannot read ({exc.strerror or exc})") from None


def _check_pair(cert_file: Path, key_file: Path) -> None:
    """A PEM certificate (chain) and the unencrypted private key that belongs to it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_password)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"certificate {cert_file} and key {key_file}: not a PEM certificate with its "
            f"unencrypted PEM private key ({exc.reason or exc})"
        ) from None


def _check_ca(ca_file: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"CA file {ca_file}: no PEM certificate in it ({exc.reason or exc})"
        ) from None


def load_pair(cert_file: Path, key_file: Path) -> tuple[bytes, bytes]:
    """(certificate chain, private key) as PEM bytes, checked to belong together."""
    cert = _read(cert_file, "certificate")
    key = _read(key_file, "private key")
    _check_pair(cert_file, key_file)
    return cert, key


def load_ca(ca_file: Path) -> bytes:
    """The PEM CA certificate(s) in `ca_file`, checked to hold at least one."""
    data = _read(ca_file, "CA file")
    _check_ca(ca_file)
    return data


def server_credentials(
    cert_file: Path, key_file: Path, client_ca_file: Path | None = None
) -> grpc.ServerCredentials:
    """TLS with this certificate; with `client_ca_file`, clients must present a certificate
    signed by that CA (the handshake fails otherwise)."""
    cert, key = load_pair(cert_file, key_file)
    client_ca = load_ca(client_ca_file) if client_ca_file is not None else None
    return grpc.ssl_server_credentials(
        [(key, cert)],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def channel_credentials(
    ca_file: Path | None, cert_file: Path | None = None, key_file: Path | None = None
) -> grpc.ChannelCredentials:
    """A TLS client trusting `ca_file` (None: the system's roots), presenting the
    certificate and key when both are given."""
    if (cert_file is None) != (key_file is None):
        raise TlsConfigError("a client certificate needs both its certificate and key file")
    root = load_ca(ca_file) if ca_file is not None else None
    cert = key = None
    if cert_file is not None and key_file is not None:
        cert, key = load_pair(cert_file, key_file)
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=cert
    )


def _require_together(settings: ServiceSettings, fields: tuple[str, ...], why: str) -> bool:
    """True when every field is set, False when none is; TlsConfigError otherwise."""
    given = [f for f in fields if getattr(settings, f) is not None]
    if not given:
        return False
    if len(given) == len(fields):
        return True
    missing = [_env(f) for f in fields if f not in given]
    raise TlsConfigError(
        f"{why}: set {' and '.join(_env(f) for f in fields)} together "
        f"({', '.join(_env(f) for f in given)} set, {', '.join(missing)} not)"
    )


PUBLIC_FIELDS = ("tls_cert_file", "tls_key_file")
INTERNAL_FIELDS = ("internal_tls_ca_file", "internal_tls_cert_file", "internal_tls_key_file")


def public_server_credentials(settings: GatewaySettings) -> grpc.ServerCredentials | None:
    """The public port's credentials, or None for plaintext (no TLS settings)."""
    if not _require_together(settings, PUBLIC_FIELDS, "TLS on the public port"):
        if settings.tls_client_ca_file is not None:
            raise TlsConfigError(
                f"{_env('tls_client_ca_file')} needs TLS on the public port: "
                f"set {_env('tls_cert_file')} and {_env('tls_key_file')} too"
            )
        return None
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    return server_credentials(
        settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
    )


def internal_server_credentials(settings: ServiceSettings) -> grpc.ServerCredentials | None:
    """Credentials of an internal server (router, postprocess, the gateway's Delivery
    port, a worker's health port): mutual TLS, clients need a certificate from the
    internal CA. None for plaintext. Which of those certificates may call which service
    is `caller_checks`' part."""
    if not _require_together(settings, INTERNAL_FIELDS, "internal mutual TLS"):
        return None
    assert settings.internal_tls_cert_file is not None
    assert settings.internal_tls_key_file is not None
    return server_credentials(
        settings.internal_tls_cert_file,
        settings.internal_tls_key_file,
        settings.internal_tls_ca_file,
    )


def internal_channel_credentials(settings: ServiceSettings) -> grpc.ChannelCredentials | None:
    """Credentials of an internal channel: trusts the internal CA only and presents this
    service's certificate. None for plaintext."""
    if not _require_together(settings, INTERNAL_FIELDS, "internal mutual TLS"):
        return None
    return channel_credentials(
        settings.internal_tls_ca_file,
        settings.internal_tls_cert_file,
        settings.internal_tls_key_file,
    )


def caller_checks(settings: ServiceSettings) -> tuple[grpc.aio.ServerInterceptor, ...]:
    """The interceptors of an internal server (core/server.make_server's `guards`): with
    internal mutual TLS, each call's caller must be one its service takes (core/callers.py);
    none without it (internal TLS off: plaintext, as asked)."""
    if not _require_together(settings, INTERNAL_FIELDS, "internal mutual TLS"):
        return ()
    return (CallerCheck(),)
