"""A CA and certificates made by openssl for a test: the ingress's TLS directory (etcd's are
`tests.support.pki`'s)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()


def issue(ca: Path, out: Path, name: str, file: str | None = None) -> None:
    """A certificate for `name` (its CN and SAN), signed by the CA in `ca`, as FILE.crt/.key."""
    file = file or name
    ext = out / f"{file}.ext"
    ext.write_text(f"subjectAltName=DNS:{name}\n")
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(out / f"{file}.key"), "-out", str(out / f"{file}.csr"),
        "-subj", f"/CN={name}", cwd=out,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(out / f"{file}.csr"), "-CA", str(ca / "ca.crt"),
        "-CAkey", str(ca / "ca.key"), "-CAcreateserial", "-days", "2", "-extfile", str(ext),
        "-out", str(out / f"{file}.crt"),
        cwd=out,
    )  # fmt: skip
    (out / f"{file}.csr").unlink()
    ext.unlink()


def ingress_pki(tmp_path: Path) -> tuple[Path, Path]:
    """(the CA's directory, the ingress's certificate directory): `default` (for
    fallback.example), shop.example.com and *.apps.example.com."""
    ca, certs = tmp_path / "ca", tmp_path / "certs"
    ca.mkdir()
    certs.mkdir()
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=wakeful test CA",
        cwd=ca,
    )  # fmt: skip
    issue(ca, certs, "fallback.example", "default")
    issue(ca, certs, "shop.example.com")
    issue(ca, certs, "*.apps.example.com")
    return ca, certs
