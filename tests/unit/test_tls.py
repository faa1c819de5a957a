"""core/tls.py: complete TLS settings or none, and files checked before any server starts."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization

from tiermesh.core.settings import GatewaySettings, RouterSettings
from tiermesh.core.tls import (
    TlsConfigError,
    channel_credentials,
    internal_channel_credentials,
    internal_server_credentials,
    public_server_credentials,
    server_credentials,
)
from tiermesh.up.certs import DevCerts


def internal(certs: DevCerts) -> dict[str, Path]:
    return {
        "internal_tls_ca_file": certs.ca,
        "internal_tls_cert_file": certs.internal_cert,
        "internal_tls_key_file": certs.internal_key,
    }


def test_no_tls_settings_mean_plaintext() -> None:
    settings = GatewaySettings()
    assert public_server_credentials(settings) is None
    assert internal_server_credentials(settings) is None
    assert internal_channel_credentials(settings) is None


def test_settings_read_from_the_environment(
    certs: DevCerts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERMESH_TLS_CERT_FILE", str(certs.server_cert))
    monkeypatch.setenv("TIERMESH_TLS_KEY_FILE", str(certs.server_key))
    monkeypatch.setenv("TIERMESH_INTERNAL_TLS_CA_FILE", str(certs.ca))
    monkeypatch.setenv("TIERMESH_INTERNAL_TLS_CERT_FILE", str(certs.internal_cert))
    monkeypatch.setenv("TIERMESH_INTERNAL_TLS_KEY_FILE", str(certs.internal_key))
    gateway = GatewaySettings()
    assert gateway.tls_cert_file == certs.server_cert
    assert isinstance(public_server_credentials(gateway), grpc.ServerCredentials)
    router = RouterSettings()
    assert isinstance(internal_server_credentials(router), grpc.ServerCredentials)
    assert isinstance(internal_channel_credentials(router), grpc.ChannelCredentials)


def test_public_cert_without_key_is_refused(certs: DevCerts) -> None:
    with pytest.raises(TlsConfigError, match="TIERMESH_TLS_KEY_FILE not"):
        public_server_credentials(GatewaySettings(tls_cert_file=certs.server_cert))


def test_public_key_without_cert_is_refused(certs: DevCerts) -> None:
    with pytest.raises(TlsConfigError, match="TIERMESH_TLS_CERT_FILE not"):
        public_server_credentials(GatewaySettings(tls_key_file=certs.server_key))


def test_client_ca_without_public_tls_is_refused(certs: DevCerts) -> None:
    with pytest.raises(TlsConfigError, match="TIERMESH_TLS_CLIENT_CA_FILE needs TLS"):
        public_server_credentials(GatewaySettings(tls_client_ca_file=certs.ca))


def test_public_tls_with_client_ca(certs: DevCerts) -> None:
    settings = GatewaySettings(
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_client_ca_file=certs.ca,
    )
    assert isinstance(public_server_credentials(settings), grpc.ServerCredentials)


@pytest.mark.parametrize(
    "left_out", ["internal_tls_ca_file", "internal_tls_cert_file", "internal_tls_key_file"]
)
def test_internal_tls_needs_all_three_files(certs: DevCerts, left_out: str) -> None:
    fields = internal(certs)
    del fields[left_out]
    settings = RouterSettings(**fields)  # type: ignore[arg-type]
    expected = f"TIERMESH_{left_out.upper()} not"
    with pytest.raises(TlsConfigError, match=expected):
        internal_server_credentials(settings)
    with pytest.raises(TlsConfigError, match=expected):
        internal_channel_credentials(settings)


def test_missing_file_names_the_file(certs: DevCerts, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TlsConfigError, match=rf"certificate {missing}: cannot read"):
        server_credentials(missing, certs.server_key)
    with pytest.raises(TlsConfigError, match=rf"private key {missing}: cannot read"):
        server_credentials(certs.server_cert, missing)
    with pytest.raises(TlsConfigError, match=rf"CA file {missing}: cannot read"):
        channel_credentials(missing)
    with pytest.raises(TlsConfigError, match=rf"certificate {tmp_path}: cannot read"):
        server_credentials(tmp_path, certs.server_key)  # a folder, not a file


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_key_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    key = tmp_path / "server.key"
    key.write_bytes(certs.server_key.read_bytes())
    key.chmod(0)
    with pytest.raises(TlsConfigError, match="cannot read"):
        server_credentials(certs.server_cert, key)


def test_garbage_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsConfigError, match="not a PEM certificate with its"):
        server_credentials(junk, certs.server_key)
    with pytest.raises(TlsConfigError, match="not a PEM certificate with its"):
        server_credentials(certs.server_cert, junk)
    with pytest.raises(TlsConfigError, match="no PEM certificate in it"):
        channel_credentials(junk)
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    with pytest.raises(TlsConfigError, match="no PEM certificate in it"):
        server_credentials(certs.server_cert, certs.server_key, client_ca_file=empty)


def test_key_of_another_certificate_is_refused(certs: DevCerts) -> None:
    with pytest.raises(TlsConfigError, match="not a PEM certificate with its"):
        server_credentials(certs.server_cert, certs.client_key)


def test_encrypted_key_is_refused_without_prompting(certs: DevCerts, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key(certs.server_key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsConfigError, match="unencrypted PEM private key"):
        server_credentials(certs.server_cert, encrypted)


def test_client_certificate_needs_its_key(certs: DevCerts) -> None:
    with pytest.raises(TlsConfigError, match="both its certificate and key"):
        channel_credentials(certs.ca, cert_file=certs.client_cert)
    assert isinstance(
        channel_credentials(certs.ca, certs.client_cert, certs.client_key),
        grpc.ChannelCredentials,
    )
