"""A certificate authority of a test's own: server and client certificates for local TLS
servers (made with ``cryptography``: EC P-256 keys, a moment each)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["TestCA"]


@dataclass
class Issued:
    """A certificate's PEM file and its key's (unencrypted unless a passphrase was given)."""

    cert: Path
    key: Path


class TestCA:
    """A CA whose certificate is written to ``directory/ca.pem`` (a CA bundle)."""

    __test__ = False  # (not a test class, whatever its name)

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamrec test CA")])
        self._name = name
        self._cert = (
            self._builder(name, self._key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .sign(self._key, hashes.SHA256())
        )
        self.bundle = directory / "ca.pem"
        self.bundle.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, name: str, *, server: bool, passphrase: bytes | None = None) -> Issued:
        """A certificate for ``name`` (an IP address or a host name) signed by the CA, for a
        server or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            alt = x509.DNSName(name)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (
            self._builder(subject, key.public_key())
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(passphrase)
            if passphrase
            else serialization.NoEncryption()
        )
        issued = Issued(self.directory / f"{name}-cert.pem", self.directory / f"{name}-key.pem")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
            )
        )
        return issued

    def server_context(self, name: str, *, client_certs: bool) -> ssl.SSLContext:
        """A server's context for ``name``; ``client_certs``: a client must offer a
        certificate of this CA's."""
        issued = self.issue(name, server=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(issued.cert, issued.key)
        if client_certs:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.bundle)
        return context
