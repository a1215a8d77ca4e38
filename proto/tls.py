"""Certificates of a deployment: a local CA and one certificate per role.

Every certificate carries its role in the subject's organizational unit
(OU = leader | helper | analyst | client) and the DNS name `svtagg-<role>`,
against which callers verify the leader and the helper.  Servers demand a client
certificate from the deployment CA on every connection (mutual TLS) and then
check the role per service: the analyst API wants `analyst`, the peer service
`leader`, ingest `client`.  A certificate of another CA fails the handshake; a
certificate of the wrong role gets UNAUTHENTICATED.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from svtagg.proto.vocab import Role  # noqa: E402

ROLES: tuple[str, ...] = tuple(Role)


def server_name(role: str) -> str:
    """The DNS name only `role`'s certificate carries.  Callers verify the server
    against it (gRPC's ssl_target_name_override), so a certificate of another
    role from the same CA cannot impersonate the leader or the helper."""
    return f"svtagg-{role}"


def tls_target(role: str) -> list[tuple[str, str]]:
    """Channel options that make a TLS channel accept only `role`'s certificate."""
    return [("grpc.ssl_target_name_override", server_name(role))]


DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Identity:
    """PEM bytes of one party's certificate and key, and the CA it trusts."""

    cert: bytes
    key: bytes
    ca: bytes

    @classmethod
    def load(cls, directory: str | Path, role: str) -> Identity:
        d = Path(directory)
        return cls(
            (d / f"{role}.pem").read_bytes(),
            (d / f"{role}.key").read_bytes(),
            (d / "ca.pem").read_bytes(),
        )


class CertificateError(ValueError):
    """A certificate directory that cannot serve the role asked of it."""


def load_identity(directory: str | Path, role: str) -> Identity:
    """`Identity.load` plus `check_identity`: the files exist (CertificateError
    naming the missing one otherwise), the certificate carries `role` and was
    issued by the directory's ca.pem."""
    d = Path(directory)
    if not d.is_dir():
        raise CertificateError(f"{d}: no such certificate directory (make one: svtagg certs)")
    for name in ("ca.pem", f"{role}.pem", f"{role}.key"):
        if not (d / name).is_file():
            raise CertificateError(f"{d}: no {name} (the {role}'s certificate directory?)")
    ident = Identity.load(d, role)
    check_identity(ident, role, where=str(d))
    return ident


def check_identity(ident: Identity, role: str, where: str = "") -> None:
    """CertificateError unless `ident.cert` is a `role` certificate signed by `ident.ca`."""
    at = f"{where}: " if where else ""
    try:
        cert = x509.load_pem_x509_certificate(ident.cert)
        ca = x509.load_pem_x509_certificate(ident.ca)
    except ValueError as exc:
        raise CertificateError(f"{at}not a PEM certificate ({exc})") from None
    found = role_of_pem(ident.cert)
    if found != role:
        raise CertificateError(
            f"{at}{role}.pem is a certificate of role {found or 'none'}, not {role}"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError(
            f"{at}{role}.pem was not issued by this directory's ca.pem"
        ) from None
    now = dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise CertificateError(
            f"{at}{role}.pem is valid only from {cert.not_valid_before_utc:%Y-%m-%d} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d}"
        )
    try:
        key = serialization.load_pem_private_key(ident.key, password=None)
    except (ValueError, TypeError):
        raise CertificateError(f"{at}{role}.key is not an unencrypted PEM private key") from None
    if key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != cert.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CertificateError(f"{at}{role}.key does not belong to {role}.pem")


def deployment_files(roles: tuple[str, ...] = ROLES) -> list[str]:
    """The file names `write_deployment` writes."""
    return ["ca.pem", "ca.key", *(f"{r}.{ext}" for r in roles for ext in ("pem", "key"))]


def _name(common_name: str, role: str | None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "svtagg")]
    if role is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_ca(common_name: str = "svtagg local CA") -> tuple[bytes, bytes]:
    """A self-signed CA certificate and key (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, None))
        .issuer_name(_name(common_name, None))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def issue(
    ca_cert: bytes, ca_key: bytes, role: str, hosts: tuple[str, ...] = DEFAULT_HOSTS
) -> tuple[bytes, bytes]:
    """A certificate for `role`, valid for TLS server and client use on `hosts`."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"svtagg-{role}", role))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san((*hosts, server_name(role))), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def write_deployment(
    directory: str | Path,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    roles: tuple[str, ...] = ROLES,
    *,
    force: bool = True,
) -> Path:
    """Make ca.pem/ca.key and <role>.pem/<role>.key for every role in `directory`.
    force=False: FileExistsError (nothing written) if any of them exists."""
    d = Path(directory)
    if not force:
        existing = [n for n in deployment_files(roles) if (d / n).exists()]
        if existing:
            raise FileExistsError(
                f"{d} already holds {', '.join(existing[:3])}"
                f"{', ...' if len(existing) > 3 else ''}; replacing them would invalidate "
                "every issued certificate (use --force to replace)"
            )
    d.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca()
    _write(d / "ca.pem", ca_cert, 0o644)
    _write(d / "ca.key", ca_key, 0o600)
    for role in roles:
        cert, key = issue(ca_cert, ca_key, role, hosts)
        _write(d / f"{role}.pem", cert, 0o644)
        _write(d / f"{role}.key", key, 0o600)
    return d


def _write(path: Path, data: bytes, mode: int) -> None:
    path.write_bytes(data)
    path.chmod(mode)


@lru_cache(maxsize=256)
def role_of_pem(pem: bytes) -> Role | None:
    """The OU role of a (handshake-verified) peer certificate, or None."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(ous) != 1:
        return None
    value = ous[0].value
    role = value.decode() if isinstance(value, bytes) else value
    return Role(role) if role in ROLES else None
