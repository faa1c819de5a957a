"""Development certificates for `tiermesh certs DIR` and the tests: one CA and three leaf
certificates it signs, each valid for 127.0.0.1, ::1 and localhost (plus any extra names).

  ca.pem                       the CA (trust it in clients; the internal mTLS CA)
  server.pem, server.key       the public port's certificate (--tls-cert, --tls-key)
  client.pem, client.key       a client certificate for a public port that requires one
  internal.pem, internal.key   what every service presents, as server and as client, for
                               internal mTLS (--internal-tls-cert, --internal-tls-key)

The CA's private key is not kept: these are for local runs and tests; make new ones
rather than issue more. Keys are written readable by the owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_NAMES = ("localhost", "127.0.0.1", "::1")
VALID_DAYS = 365


@dataclass(frozen=True)
class DevCerts:
    """Paths of what `write_dev_certs` wrote."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    internal_cert: Path
    internal_key: Path

    @classmethod
    def at(cls, directory: Path) -> DevCerts:
        """Where `write_dev_certs(directory)` writes (and `tiermesh up --tls-dir` reads)."""
        return cls(
            ca=directory / "ca.pem",
            server_cert=directory / "server.pem",
            server_key=directory / "server.key",
            client_cert=directory / "client.pem",
            client_key=directory / "client.key",
            internal_cert=directory / "internal.pem",
            internal_key=directory / "internal.key",
        )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tiermesh dev"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_names(names: Sequence[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        # A little in the past: clocks of the machines that check it may lag.
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _leaf(
    common_name: str,
    usages: Sequence[x509.ObjectIdentifier],
    names: Sequence[str],
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(common_name), ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(_alt_names(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Created owner-only, never briefly world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(0o600)


def write_dev_certs(directory: Path, extra_names: Sequence[str] = ()) -> DevCerts:
    """Write a fresh CA and the three leaf certificates into `directory` (created if
    missing; files of the same names are replaced)."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [*DEFAULT_NAMES, *extra_names]
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("tiermesh dev CA")
    ca = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    server = _leaf("tiermesh gateway", [ExtendedKeyUsageOID.SERVER_AUTH], names, ca, ca_key)
    client = _leaf("tiermesh client", [ExtendedKeyUsageOID.CLIENT_AUTH], names, ca, ca_key)
    internal = _leaf(
        "tiermesh internal",
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        names,
        ca,
        ca_key,
    )
    paths = DevCerts.at(directory)
    _write_cert(paths.ca, ca)
    _write_cert(paths.server_cert, server[0])
    _write_key(paths.server_key, server[1])
    _write_cert(paths.client_cert, client[0])
    _write_key(paths.client_key, client[1])
    _write_cert(paths.internal_cert, internal[0])
    _write_key(paths.internal_key, internal[1])
    return paths
