"""`tiermesh certs DIR`: a CA and leaf certificates it signed, for loopback names."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tiermesh.cli.main import main
from tiermesh.core.tls import channel_credentials, server_credentials


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_command_writes_a_usable_set(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert main(["certs", str(out), "--name", "gateway.example"]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {
        "ca.pem",
        *(f"{who}.{ext}" for who in ("server", "client", "internal") for ext in ("pem", "key")),
    }
    ca = load(out / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usages = {
        "server": {ExtendedKeyUsageOID.SERVER_AUTH},
        "client": {ExtendedKeyUsageOID.CLIENT_AUTH},
        "internal": {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH},
    }
    for who, expected in usages.items():
        cert = load(out / f"{who}.pem")
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "gateway.example"}
        assert set(san.get_values_for_type(x509.IPAddress)) == {
            ipaddress.ip_address("127.0.0.1"),
            ipaddress.ip_address("::1"),
        }
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == expected
        key_mode = stat.S_IMODE((out / f"{who}.key").stat().st_mode)
        assert key_mode == 0o600, f"{who}.key is {oct(key_mode)}"
    # What core/tls.py accepts: every pair matches, the CA loads.
    server_credentials(out / "server.pem", out / "server.key", client_ca_file=out / "ca.pem")
    channel_credentials(out / "ca.pem", out / "internal.pem", out / "internal.key")
    channel_credentials(out / "ca.pem", out / "client.pem", out / "client.key")
