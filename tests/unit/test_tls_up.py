"""`tiermesh up`'s TLS options: complete sets only, files checked before anything starts,
absolute paths handed to the children, --tls-dir filling what the flags leave out."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tiermesh.cli.main import parser
from tiermesh.cli.up import tls_files
from tiermesh.core.tls import TlsConfigError
from tiermesh.up.certs import DevCerts
from tiermesh.up.tls import TlsFiles, mesh_tls


def test_no_tls_is_plaintext() -> None:
    tls = mesh_tls(TlsFiles())
    assert tls.env == {} and not tls.public and tls.internal is None


def test_public_and_internal(certs: DevCerts) -> None:
    tls = mesh_tls(
        TlsFiles(
            tls_cert=certs.server_cert,
            tls_key=certs.server_key,
            tls_client_ca=certs.ca,
            internal_tls_ca=certs.ca,
            internal_tls_cert=certs.internal_cert,
            internal_tls_key=certs.internal_key,
        )
    )
    assert tls.public
    assert isinstance(tls.internal, grpc.ChannelCredentials)
    assert tls.env == {
        "TIERMESH_TLS_CERT_FILE": str(certs.server_cert.resolve()),
        "TIERMESH_TLS_KEY_FILE": str(certs.server_key.resolve()),
        "TIERMESH_TLS_CLIENT_CA_FILE": str(certs.ca.resolve()),
        "TIERMESH_INTERNAL_TLS_CA_FILE": str(certs.ca.resolve()),
        "TIERMESH_INTERNAL_TLS_CERT_FILE": str(certs.internal_cert.resolve()),
        "TIERMESH_INTERNAL_TLS_KEY_FILE": str(certs.internal_key.resolve()),
    }


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"tls_cert": "server_cert"}, "--tls-cert and --tls-key go together"),
        ({"tls_key": "server_key"}, "--tls-cert and --tls-key go together"),
        ({"tls_client_ca": "ca"}, "--tls-client-ca needs --tls-cert"),
        ({"internal_tls_ca": "ca", "internal_tls_key": "internal_key"}, "--internal-tls-cert"),
        ({"tls_cert": "server_cert", "tls_key": "client_key"}, "not a PEM certificate with"),
    ],
)
def test_refused_before_anything_starts(
    certs: DevCerts, files: dict[str, str], message: str
) -> None:
    with pytest.raises(TlsConfigError, match=message):
        mesh_tls(TlsFiles(**{k: getattr(certs, v) for k, v in files.items()}))


def test_tls_dir_fills_what_flags_leave_out(
    certs: DevCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = certs.ca.parent
    monkeypatch.setenv("TIERMESH_TLS_CLIENT_CA_FILE", str(certs.ca))
    args = parser().parse_args(
        ["up", "--tls-dir", str(folder), "--tls-key", str(tmp_path / "other.key")]
    )
    assert tls_files(args) == TlsFiles(
        tls_cert=folder / "server.pem",
        tls_key=tmp_path / "other.key",
        tls_client_ca=certs.ca,
        internal_tls_ca=folder / "ca.pem",
        internal_tls_cert=folder / "internal.pem",
        internal_tls_key=folder / "internal.key",
    )


def test_environment_is_read_without_flags(
    certs: DevCerts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERMESH_TLS_CERT_FILE", str(certs.server_cert))
    monkeypatch.setenv("TIERMESH_TLS_KEY_FILE", str(certs.server_key))
    assert tls_files(parser().parse_args(["up"])) == TlsFiles(
        tls_cert=certs.server_cert, tls_key=certs.server_key
    )
