"""A throwaway self-signed certificate for 127.0.0.1 and localhost, made at run time (``cryptography``):
the one maker the TLS tests and the TLS benches share."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

__all__ = ["self_signed"]


def self_signed(directory: Path) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)`` in ``directory``: an ECDSA P-256 certificate (the curve and signature a
    modern server would use: a handshake's cost depends on it) for 127.0.0.1 and localhost, valid
    for a day, that is its own CA (a client trusts it with ``cafile=cert.pem``). The key is 0600."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path
