"""Certificates for the local control plane, made with openssl: one CA, the API server's serving
certificate, one admin client certificate (O=system:masters) and the service-account signing key."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def server_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def complete(self) -> bool:
        files = (
            self.ca_crt,
            self.ca_key,
            self.server_crt,
            self.server_key,
            self.admin_crt,
            self.admin_key,
            self.sa_key,
            self.sa_pub,
        )
        return all(p.exists() for p in files)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> Pki:
    """Create (or keep, if complete) the factory's certificates and keys."""
    pki = Pki(directory)
    if pki.complete():
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-nodes",
        "-newkey",
        "rsa:2048",
        "-keyout",
        str(pki.ca_key),
        "-out",
        str(pki.ca_crt),
        "-days",
        "3650",
        "-subj",
        "/CN=tokenfab-factory-ca",
    )
    sans = ",".join(
        [
            "IP:127.0.0.1",
            "IP:10.96.0.1",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n"),
        ("admin", "/O=system:masters/CN=tokenfab-admin", "extendedKeyUsage=clientAuth\n"),
    ):
        key, csr, crt, extfile = (directory / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
        extfile.write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n" + ext)
        _openssl(
            "req",
            "-new",
            "-nodes",
            "-newkey",
            "rsa:2048",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            subject,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(pki.ca_crt),
            "-CAkey",
            str(pki.ca_key),
            "-CAcreateserial",
            "-out",
            str(crt),
            "-days",
            "3650",
            "-extfile",
            str(extfile),
        )
        csr.unlink()
        extfile.unlink()
    _openssl("genrsa", "-out", str(pki.sa_key), "2048")
    _openssl("rsa", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return pki
