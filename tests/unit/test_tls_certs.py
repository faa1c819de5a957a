"""`tiermesh certs DIR`: a CA and leaf certificates it signed, for loopback names."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tiermesh.cli.main import main
from tiermesh.core.callers import IDENTITIES
from tiermesh.core.tls import channel_credentials, server_credentials
from tiermesh.up.certs import identities_in, write_mesh_certs


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_command_writes_a_usable_set(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert main(["certs", str(out), "--name", "gateway.example"]) == 0
    names = {p.name for p in out.iterdir()}
    leaves = ("server", "client", "internal", *IDENTITIES)
    assert names == {"ca.pem", *(f"{who}.{ext}" for who in leaves for ext in ("pem", "key"))}
    ca = load(out / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    both = {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    usages = {
        "server": {ExtendedKeyUsageOID.SERVER_AUTH},
        "client": {ExtendedKeyUsageOID.CLIENT_AUTH},
        "internal": both,
        **{identity: both for identity in IDENTITIES},
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
    # Identities: the shared internal certificate names them all, each service's its own,
    # the public ones none.
    assert identities_in(out / "internal.pem") == frozenset(IDENTITIES)
    for identity in IDENTITIES:
        assert identities_in(out / f"{identity}.pem") == {identity}
    assert identities_in(out / "server.pem") == identities_in(out / "client.pem") == frozenset()


def test_up_writes_a_ca_and_one_certificate_per_service_owner_only(tmp_path: Path) -> None:
    made = write_mesh_certs(tmp_path / "tls")
    assert stat.S_IMODE(made.ca.parent.stat().st_mode) == 0o700
    ca = load(made.ca)
    names = {p.name for p in made.ca.parent.iterdir()}
    assert names == {"ca.pem", *(f"{i}.{ext}" for i in IDENTITIES for ext in ("pem", "key"))}
    for identity in IDENTITIES:
        cert_file, key_file = made.own(identity)
        load(cert_file).verify_directly_issued_by(ca)
        assert identities_in(cert_file) == {identity}
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        channel_credentials(made.ca, cert_file, key_file)
        server_credentials(cert_file, key_file, client_ca_file=made.ca)
    # A second start makes a new CA: the old certificates are not trusted by it.
    again = write_mesh_certs(tmp_path / "tls")
    assert load(again.ca).public_key() != ca.public_key()
