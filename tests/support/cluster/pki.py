"""The local cluster's certificates: one CA, serving certificates, client certificates, SA keys.

kube-apiserver authenticates components by client certificate (the CN is the user, each O a
group), serves TLS with a certificate for 127.0.0.1, signs ServiceAccount tokens with its own key,
and calls Kueue's webhooks over TLS it verifies against the same CA.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=30)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class CertificateAuthority:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llmtrain-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = self.dir / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        groups: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
    ) -> KeyPair:
        """A certificate for a server (when `hosts` are given) or a client."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            alt: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    alt.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    alt.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        return pair


def service_account_keys(directory: Path) -> KeyPair:
    """The key pair kube-apiserver signs and verifies ServiceAccount tokens with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pair = KeyPair(directory / "sa.pub", directory / "sa.key")
    pair.key.write_bytes(_pem_key(key))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pair
