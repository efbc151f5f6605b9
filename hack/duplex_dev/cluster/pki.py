"""The local cluster's PKI: a CA, the apiserver's serving cert, client certs for any user, the service-account keypair,
and the kubeconfig files that carry them. Pure file-writing; nothing here talks to a process."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The apiserver answers on loopback (a cluster without a real node) or on the host's end of the node's link; pods
# reach it at the first address of the Service range (the `kubernetes` Service). mint() adds those two.
APISERVER_IPS = ("127.0.0.1",)
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class PKIPaths:
    """Where the PKI files live inside a state dir."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.root / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.root / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.root / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.root / "admin.key"

    @property
    def kubelet_client_cert(self) -> Path:
        return self.root / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.root / "apiserver-kubelet-client.key"

    @property
    def front_proxy_ca_cert(self) -> Path:
        return self.root / "front-proxy-ca.crt"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.root / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.root / "front-proxy-client.key"

    @property
    def sa_key(self) -> Path:
        return self.root / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.root / "sa.pub"

    def exists(self) -> bool:
        files = (
            self.ca_cert,
            self.ca_key,
            self.apiserver_cert,
            self.apiserver_key,
            self.admin_cert,
            self.admin_key,
            self.front_proxy_ca_cert,
            self.front_proxy_client_cert,
            self.front_proxy_client_key,
            self.sa_key,
            self.sa_pub,
        )
        return all(f.is_file() for f in files)


def _now() -> dt.datetime:
    # Back-date a little so a cert minted this second is valid to a process whose clock reads a bit earlier.
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)


def _ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _load_ca(paths: PKIPaths) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    return cert, key  # type: ignore[return-value]


def _issue(
    ca_cert: x509.Certificate,
    ca_key,
    subject: x509.Name,
    usage: ExtendedKeyUsageOID,
    sans: Sequence[x509.GeneralName] = (),
) -> tuple[bytes, bytes]:
    key = _ec_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return _cert_pem(builder.sign(ca_key, hashes.SHA256())), _key_pem(key)


def client_subject(user: str, groups: Sequence[str] = ()) -> x509.Name:
    """Kubernetes' client-cert authenticator reads the user from CN and the groups from each O."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    return x509.Name(attrs)


def _new_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_key = _ec_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now())
        .not_valid_after(_now() + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_cert, ca_key


def mint(paths: PKIPaths, apiserver_ips: Sequence[str] = ()) -> None:
    """Create the CA, the apiserver serving cert (valid for loopback and `apiserver_ips`), the admin client cert, the
    apiserver's client cert towards kubelets, the front-proxy (request-header) CA and client cert, and the
    service-account keypair."""
    ca_cert, ca_key = _new_ca("duplex-local-ca")
    _write(paths.ca_cert, _cert_pem(ca_cert))
    _write(paths.ca_key, _key_pem(ca_key), private=True)

    sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in (*APISERVER_IPS, *apiserver_ips)]
    sans += [x509.DNSName(name) for name in APISERVER_DNS]
    cert, key = _issue(
        ca_cert,
        ca_key,
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        ExtendedKeyUsageOID.SERVER_AUTH,
        sans,
    )
    _write(paths.apiserver_cert, cert)
    _write(paths.apiserver_key, key, private=True)

    cert, key = _issue(
        ca_cert, ca_key, client_subject("duplex-admin", ["system:masters"]), ExtendedKeyUsageOID.CLIENT_AUTH
    )
    _write(paths.admin_cert, cert)
    _write(paths.admin_key, key, private=True)

    cert, key = _issue(
        ca_cert,
        ca_key,
        client_subject("kube-apiserver-kubelet-client", ["system:masters"]),
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _write(paths.kubelet_client_cert, cert)
    _write(paths.kubelet_client_key, key, private=True)

    # A separate CA for the aggregation layer's request-header auth, so no ordinary client cert can claim to be a proxy.
    fp_cert, fp_key = _new_ca("duplex-front-proxy-ca")
    _write(paths.front_proxy_ca_cert, _cert_pem(fp_cert))
    cert, key = _issue(fp_cert, fp_key, client_subject("front-proxy-client"), ExtendedKeyUsageOID.CLIENT_AUTH)
    _write(paths.front_proxy_client_cert, cert)
    _write(paths.front_proxy_client_key, key, private=True)

    # RSA because RS256 is what every JWT consumer of service-account tokens accepts.
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(paths.sa_key, _key_pem(sa), private=True)
    _write(
        paths.sa_pub,
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )


def client_cert(paths: PKIPaths, user: str, groups: Sequence[str] = ()) -> tuple[bytes, bytes]:
    """A client cert + key (PEM) for `user` in `groups`, signed by the cluster CA."""
    ca_cert, ca_key = _load_ca(paths)
    return _issue(ca_cert, ca_key, client_subject(user, groups), ExtendedKeyUsageOID.CLIENT_AUTH)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    server: str,
    ca_pem: bytes,
    user: str,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> str:
    """A self-contained kubeconfig (credentials embedded) for one user of the local cluster."""
    creds: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        creds = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
    if token is not None:
        creds["token"] = token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "duplex-local", "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [
            {"name": "duplex-local", "context": {"cluster": "duplex-local", "user": user, "namespace": namespace}}
        ],
        "current-context": "duplex-local",
        "preferences": {},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_kubeconfig(path: Path, text: str) -> Path:
    _write(path, text.encode(), private=True)
    return path
