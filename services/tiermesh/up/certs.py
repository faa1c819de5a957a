"""Certificates for `tiermesh certs DIR`, `tiermesh up`'s internal mTLS and the tests: one
CA and the leaf certificates it signs, each valid for 127.0.0.1, ::1 and localhost (plus
any extra names).

  ca.pem                       the CA (trust it in clients; the internal mTLS CA)
  server.pem, server.key       the public port's certificate (--tls-cert, --tls-key)
  client.pem, client.key       a client certificate for a public port that requires one
  internal.pem, internal.key   one certificate for every service, as server and as client
                               (--internal-tls-cert, --internal-tls-key): it names every
                               identity, so whoever holds it may make any internal call
  SERVICE.pem, SERVICE.key     one per identity of core/callers.py (gateway, frontdoor,
                               router, worker, postprocess, probe): each names its own only

An identity is a URI name `spiffe://tiermesh/<service>` (core/callers.py says who may call
what). `tiermesh up` writes the CA and the per-service certificates (`write_mesh_certs`)
into its data folder at every start. The CA's private key is not kept: make new ones
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

from tiermesh.core.callers import IDENTITIES, identities_of, identity_uri

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

    def own(self, identity: str) -> tuple[Path, Path]:
        """The certificate and key that name only `identity` (core/callers.py)."""
        return MeshCerts(self.ca).own(identity)

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


@dataclass(frozen=True)
class MeshCerts:
    """The internal CA and one certificate per identity beside it (`write_mesh_certs`)."""

    ca: Path

    def own(self, identity: str) -> tuple[Path, Path]:
        folder = self.ca.parent
        return folder / f"{identity}.pem", folder / f"{identity}.key"


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "tiermesh dev"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _alt_names(names: Sequence[str], identities: Sequence[str] = ()) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(identity_uri(i)) for i in identities
    ]
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
    identities: Sequence[str] = (),
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
        .add_extension(_alt_names(names, identities), critical=False)
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


def _new_ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
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
    return ca, ca_key


BOTH_WAYS = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)


def _write_own(
    paths: MeshCerts,
    names: Sequence[str],
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
) -> None:
    for identity in IDENTITIES:
        cert, key = _leaf(f"tiermesh {identity}", BOTH_WAYS, names, ca, ca_key, [identity])
        cert_file, key_file = paths.own(identity)
        _write_cert(cert_file, cert)
        _write_key(key_file, key)


def write_mesh_certs(directory: Path, extra_names: Sequence[str] = ()) -> MeshCerts:
    """A fresh internal CA and one certificate per identity (server and client alike) in
    `directory` (created owner-only if missing; files of the same names are replaced):
    what `tiermesh up` gives its services for internal mTLS. ~20 ms."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca, ca_key = _new_ca()
    paths = MeshCerts(directory / "ca.pem")
    _write_cert(paths.ca, ca)
    _write_own(paths, [*DEFAULT_NAMES, *extra_names], ca, ca_key)
    return paths


def write_dev_certs(directory: Path, extra_names: Sequence[str] = ()) -> DevCerts:
    """Write a fresh CA, the public, client and shared internal certificates and one per
    identity into `directory` (created if missing; files of the same names are replaced)."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [*DEFAULT_NAMES, *extra_names]
    ca, ca_key = _new_ca()
    server = _leaf("tiermesh gateway", [ExtendedKeyUsageOID.SERVER_AUTH], names, ca, ca_key)
    client = _leaf("tiermesh client", [ExtendedKeyUsageOID.CLIENT_AUTH], names, ca, ca_key)
    internal = _leaf("tiermesh internal", BOTH_WAYS, names, ca, ca_key, IDENTITIES)
    paths = DevCerts.at(directory)
    _write_cert(paths.ca, ca)
    _write_cert(paths.server_cert, server[0])
    _write_key(paths.server_key, server[1])
    _write_cert(paths.client_cert, client[0])
    _write_key(paths.client_key, client[1])
    _write_cert(paths.internal_cert, internal[0])
    _write_key(paths.internal_key, internal[1])
    _write_own(MeshCerts(paths.ca), names, ca, ca_key)
    return paths


def identities_in(cert_file: Path) -> frozenset[str]:
    """The tiermesh identities a PEM certificate (its first, the leaf) names."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    return identities_of(alt.get_values_for_type(x509.UniformResourceIdentifier))
