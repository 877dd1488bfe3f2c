"""A throw-away PKI for TLS tests: a CA, a broker certificate, a client certificate, and a
second CA that signed nothing the broker shows (to be distrusted by).

Made with the `cryptography` package into a directory the test owns. Files (PEM unless said):

    ca.pem                    the CA that signed the broker and the client
    other-ca.pem              an unrelated CA (a client trusting only it must refuse the broker)
    broker.p12                the broker's key + certificate chain, PKCS#12 (Kafka's keystore)
    broker-cert.pem, broker-key.pem   the same as PEM (for Python servers)
    client-cert.pem, client-key.pem   the client's certificate (CN=`client_cn`) and key
    client-key-encrypted.pem  the client key encrypted with `key_password`
    stranger-cert.pem, stranger-key.pem  a client certificate signed by other-ca
    ca-key.pem                the CA's key, so `reissue` can sign a rotated certificate

The broker certificate names `broker_names` (DNS) and `broker_ips` (IP addresses).
EC P-256 keys keep generation fast (a few milliseconds each).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)
# Certificates are valid from a little before now: clocks of peers may differ slightly.
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Pki:
    directory: Path
    ca: Path
    other_ca: Path
    broker_keystore: Path
    keystore_password: str
    broker_cert: Path
    broker_key: Path
    client_cert: Path
    client_key: Path
    client_key_encrypted: Path
    key_password: str
    client_cn: str
    stranger_cert: Path
    stranger_key: Path
    ca_key: Path

    @property
    def client_dn(self) -> str:
        """The client certificate's subject as Kafka writes principals (RFC 2253)."""
        return f"CN={self.client_cn},O=replicad tests"


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "replicad tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    common_name: str,
    issuer: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
    *,
    server: bool,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    issuer_key, issuer_cert = issuer
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password is not None
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def make_test_pki(
    directory: Path,
    *,
    broker_names: Sequence[str] = ("localhost", "kafka.test"),
    broker_ips: Sequence[str] = ("127.0.0.1",),
    client_cn: str = "replicad-follower",
    keystore_password: str = "keystore-secret",
    key_password: str = "client-key-secret",
) -> Pki:
    """Generate every file named in the module doc into `directory` (created if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("replicad test CA")
    other = _ca("replicad other CA")
    broker_key, broker_cert = _leaf("kafka.test", ca, server=True, dns=broker_names, ips=broker_ips)
    client_key, client_cert = _leaf(client_cn, ca, server=False)
    stranger_key, stranger_cert = _leaf("stranger", other, server=False)
    keystore = pkcs12.serialize_key_and_certificates(
        b"broker",
        broker_key,
        broker_cert,
        [ca[1]],
        serialization.BestAvailableEncryption(keystore_password.encode()),
    )
    return Pki(
        directory=directory,
        ca=_write(directory / "ca.pem", _pem(ca[1])),
        other_ca=_write(directory / "other-ca.pem", _pem(other[1])),
        broker_keystore=_write(directory / "broker.p12", keystore),
        keystore_password=keystore_password,
        broker_cert=_write(directory / "broker-cert.pem", _pem(broker_cert) + _pem(ca[1])),
        broker_key=_write(directory / "broker-key.pem", _key_pem(broker_key)),
        client_cert=_write(directory / "client-cert.pem", _pem(client_cert)),
        client_key=_write(directory / "client-key.pem", _key_pem(client_key)),
        client_key_encrypted=_write(
            directory / "client-key-encrypted.pem", _key_pem(client_key, key_password)
        ),
        key_password=key_password,
        client_cn=client_cn,
        stranger_cert=_write(directory / "stranger-cert.pem", _pem(stranger_cert)),
        stranger_key=_write(directory / "stranger-key.pem", _key_pem(stranger_key)),
        ca_key=_write(directory / "ca-key.pem", _key_pem(ca[0])),
    )


def reissue(
    pki: Pki,
    cert_path: Path,
    key_path: Path,
    *,
    common_name: str,
    server: bool,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> x509.Certificate:
    """A new key and certificate signed by `pki`'s CA, written over `cert_path` and
    `key_path` (a certificate rotated in place: the same files, new contents). A server's
    certificate file holds the CA after it, as broker-cert.pem does. Returns the new one."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key, cert = _leaf(common_name, (ca_key, ca_cert), server=server, dns=dns, ips=ips)
    chain = _pem(cert) + (_pem(ca_cert) if server else b"")
    # A reader between the two writes finds a key that does not match the certificate.
    _write(key_path, _key_pem(key))
    _write(cert_path, chain)
    return cert
