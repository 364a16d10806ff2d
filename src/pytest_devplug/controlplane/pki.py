"""Certificates of one control plane, made with the ``openssl`` command line.

``cryptography`` is not a dependency of pytest-devplug (only of dev tools such as twine), and a
certificate authority is three ``openssl`` calls, so the CLI it is: a CA, the API server's serving
certificate (loopback IP, ``localhost`` and the in-cluster names), an admin client certificate
(``system:masters``) and the service-account signing key. EC P-256 keys: generated in milliseconds.
Everything lives in the control plane's own directory and goes with it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import ControlPlaneError

__all__ = ["Pki", "make_pki"]

#: The API server's in-cluster names and the first address of the service range (10.0.0.0/24).
_SERVER_SANS = "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
_DAYS = "7"


@dataclass(frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` wrote."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(args: list[str], cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ControlPlaneError(
            "the real control plane needs the openssl command to make its certificates (apt-get install openssl)"
        )
    res = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    if res.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args[:2])} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")


def _key(name: str, d: Path) -> None:
    _openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name], d)


def _leaf(name: str, subject: str, ext: str, d: Path) -> None:
    _key(f"{name}.key", d)
    _openssl(["req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr"], d)
    (d / f"{name}.ext").write_text(ext + "\n")
    _openssl(
        [
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            _DAYS,
            "-sha256",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt",
        ],
        d,
    )


def make_pki(d: Path) -> Pki:
    """Write a fresh CA and the certificates and keys the components need into ``d`` (created, mode 0700)."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    _key("ca.key", d)
    _openssl(
        [
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=devplug-ca",
            "-days",
            _DAYS,
            "-sha256",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca.crt",
        ],
        d,
    )
    usage = "keyUsage=critical,digitalSignature,keyEncipherment"
    _leaf("apiserver", "/CN=kube-apiserver", f"{usage}\nextendedKeyUsage=serverAuth\nsubjectAltName={_SERVER_SANS}", d)
    _leaf("admin", "/O=system:masters/CN=devplug-admin", f"{usage}\nextendedKeyUsage=clientAuth", d)
    _key("sa.key", d)
    _openssl(["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"], d)
    return Pki(
        d / "ca.crt",
        d / "ca.key",
        d / "apiserver.crt",
        d / "apiserver.key",
        d / "admin.crt",
        d / "admin.key",
        d / "sa.key",
        d / "sa.pub",
    )
