"""`tiermesh up`'s TLS options: complete sets only, files checked before anything starts,
absolute paths handed to the children, --tls-dir filling what the flags leave out."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest

from tiermesh.cli.main import parser
from tiermesh.cli.up import tls_files
from tiermesh.core.callers import IDENTITIES
from tiermesh.core.tls import TlsConfigError
from tiermesh.up.certs import DevCerts
from tiermesh.up.tls import TlsFiles, check_internal_mode, mesh_tls


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
        internal_tls_dir=folder,  # a certificate per service
    )


def test_a_shared_internal_certificate_with_tls_dir_trusts_its_ca(certs: DevCerts) -> None:
    folder = certs.ca.parent
    shared = ["--internal-tls-cert", str(certs.internal_cert)]
    args = parser().parse_args(
        ["up", "--tls-dir", str(folder), *shared, "--internal-tls-key", str(certs.internal_key)]
    )
    files = tls_files(args)
    assert files.internal_tls_dir is None
    assert (files.internal_tls_ca, files.internal_tls_cert) == (certs.ca, certs.internal_cert)


def test_a_certificate_per_service(certs: DevCerts) -> None:
    """Every service gets its own certificate's variables; all share the CA; the
    supervisor presents the probe's."""
    tls = mesh_tls(TlsFiles(internal_tls_dir=certs.ca.parent))
    assert tls.env == {"TIERMESH_INTERNAL_TLS_CA_FILE": str(certs.ca.resolve())}
    assert isinstance(tls.internal, grpc.ChannelCredentials)
    assert set(tls.own) == set(IDENTITIES)
    for identity, env in tls.own.items():
        cert, key = certs.own(identity)
        assert env == {
            "TIERMESH_INTERNAL_TLS_CERT_FILE": str(cert.resolve()),
            "TIERMESH_INTERNAL_TLS_KEY_FILE": str(key.resolve()),
        }


def test_a_folder_missing_a_service_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    folder = tmp_path / "partial"
    shutil.copytree(certs.ca.parent, folder)
    (folder / "router.pem").unlink()
    with pytest.raises(TlsConfigError, match=r"router\.pem"):
        mesh_tls(TlsFiles(internal_tls_dir=folder))


def test_a_shared_certificate_must_name_every_caller(certs: DevCerts) -> None:
    """A certificate of the CA without the identities (one made before they existed, or by
    another tool): the mesh would refuse its own hops, so up refuses to start."""
    files = TlsFiles(
        internal_tls_ca=certs.ca,
        internal_tls_cert=certs.client_cert,
        internal_tls_key=certs.client_key,
    )
    with pytest.raises(TlsConfigError, match="lacks spiffe://tiermesh/frontdoor, "):
        mesh_tls(files)
    one = TlsFiles(
        internal_tls_ca=certs.ca,
        internal_tls_cert=certs.own("gateway")[0],
        internal_tls_key=certs.own("gateway")[1],
    )
    with pytest.raises(TlsConfigError, match=r"lacks .*spiffe://tiermesh/worker"):
        mesh_tls(one)


@pytest.mark.parametrize(
    ("mode", "files", "message"),
    [
        ("off", {"internal_tls_dir": "dir"}, "--internal-tls off, yet internal TLS files"),
        ("off", {"internal_tls_ca": "ca"}, "--internal-tls off, yet internal TLS files"),
        ("maybe", {}, "TIERMESH_INTERNAL_TLS='maybe': choose one of on, off"),
    ],
)
def test_internal_tls_mode_contradictions(
    certs: DevCerts, mode: str, files: dict[str, str], message: str
) -> None:
    given = {k: certs.ca.parent if v == "dir" else getattr(certs, v) for k, v in files.items()}
    with pytest.raises(TlsConfigError, match=message):
        check_internal_mode(mode, TlsFiles(**given))


def test_internal_tls_off_or_on_without_files_is_fine() -> None:
    check_internal_mode("off", TlsFiles())
    check_internal_mode("on", TlsFiles())


def test_environment_is_read_without_flags(
    certs: DevCerts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERMESH_TLS_CERT_FILE", str(certs.server_cert))
    monkeypatch.setenv("TIERMESH_TLS_KEY_FILE", str(certs.server_key))
    assert tls_files(parser().parse_args(["up"])) == TlsFiles(
        tls_cert=certs.server_cert, tls_key=certs.server_key
    )
