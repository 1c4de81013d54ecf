"""Debian's `docker-registry` (the CNCF distribution registry) on loopback, for tests that pull
images from a real registry: plain HTTP, or HTTPS with a CA the test makes and htpasswd logins.

`running_registry(tmp_path)` starts one on a free port with its storage under `tmp_path`,
waits until `/v2/` answers, and stops it by its pid. `push` copies an image in with skopeo
(the password in argv is fine in a test); `blob_gets` counts the blob downloads the access
log shows; `blob_file` is a blob's file in the storage, for a test to corrupt.

Needs Debian's `docker-registry` and `skopeo`, and `apache2-utils` (`htpasswd`) for logins:
the registry checks bcrypt hashes only.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import json
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from wakeful.store.testing import free_port

REGISTRY = "/usr/bin/docker-registry"
READY_WITHIN = 15.0


@dataclass
class Registry:
    address: str
    """`127.0.0.1:PORT`."""
    storage: Path
    log: Path
    process: subprocess.Popen[bytes]
    ca: Path | None = None
    """The CA's PEM when it serves HTTPS."""
    users: dict[str, str] = field(default_factory=dict)

    @property
    def certs(self) -> Path | None:
        """A skopeo cert dir trusting the CA (`ca.crt`)."""
        return None if self.ca is None else self.ca.parent

    def ref(self, name: str) -> str:
        return f"{self.address}/{name}"

    def push(self, source: str, name: str, *, format: str | None = None, all: bool = False) -> str:
        """Copy `source` (`oci:DIR:TAG`, say) to `name` (`app:1`) here; the reference."""
        argv = ["skopeo", "copy", "--retry-times=0", source, f"docker://{self.ref(name)}"]
        if self.certs is None:
            argv.append("--dest-tls-verify=false")
        else:
            argv.append(f"--dest-cert-dir={self.certs}")
        if self.users:
            user, password = next(iter(self.users.items()))
            argv.append(f"--dest-creds={user}:{password}")
        if format is not None:
            argv.append(f"--format={format}")
        if all:
            argv.append("--all")
        done = subprocess.run(argv, capture_output=True, check=False, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        return self.ref(name)

    def put_manifest(self, name: str, reference: str, body: bytes, media_type: str) -> None:
        """Store a manifest as it is (the registry checks that the blobs it names exist)."""
        request = urllib.request.Request(
            f"{self._base}/v2/{name}/manifests/{reference}",
            data=body,
            method="PUT",
            headers={"Content-Type": media_type},
        )
        with urllib.request.urlopen(request, timeout=30, context=self._context) as answer:
            assert answer.status == 201, answer.status

    def manifest_digest(self, name: str, reference: str, media_type: str) -> str:
        """The digest the registry gives the manifest, asked for as `media_type`."""
        request = urllib.request.Request(
            f"{self._base}/v2/{name}/manifests/{reference}", headers={"Accept": media_type}
        )
        with urllib.request.urlopen(request, timeout=30, context=self._context) as answer:
            return str(answer.headers["Docker-Content-Digest"])

    @property
    def _base(self) -> str:
        return f"{'http' if self.ca is None else 'https'}://{self.address}"

    @property
    def _context(self) -> ssl.SSLContext | None:
        return None if self.ca is None else ssl.create_default_context(cafile=self.ca)

    def blob_gets(self, digest: str = "") -> int:
        """How many blob downloads (`GET .../blobs/<digest>` answered 200) the log shows."""
        pattern = re.compile(rf'"GET /v2/\S+/blobs/{re.escape(digest)}\S* HTTP/1\.1" 200 ')
        return len(pattern.findall(self.log.read_text(errors="replace")))

    def blob_file(self, digest: str) -> Path:
        hex_digest = digest.removeprefix("sha256:")
        return self.storage / f"docker/registry/v2/blobs/sha256/{hex_digest[:2]}/{hex_digest}/data"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def running_registry(
    directory: Path, *, tls: bool = False, users: dict[str, str] | None = None
) -> Iterator[Registry]:
    """A registry serving from `directory` (HTTPS with a fresh CA when `tls`; logins of
    `users`, name → password, when given), stopped on exit."""
    if not Path(REGISTRY).exists():
        raise RuntimeError("no docker-registry: install Debian's docker-registry")
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(directory / "storage")},
            "delete": {"enabled": True},
        },
    }
    ca = None
    if tls:
        ca, cert, key = make_certificates(directory / "certs")
    if users:
        (directory / "htpasswd").write_text("".join(htpasswd_line(u, p) for u, p in users.items()))
        config["auth"] = {"htpasswd": {"realm": "test", "path": str(directory / "htpasswd")}}
    for attempt in range(3):
        port = free_port()
        http: dict[str, object] = {"addr": f"127.0.0.1:{port}"}
        if tls:
            http["tls"] = {"certificate": str(cert), "key": str(key)}
        config["http"] = http
        (directory / "config.yml").write_text(json.dumps(config))  # YAML reads JSON
        log = directory / f"registry.{attempt}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [REGISTRY, "serve", str(directory / "config.yml")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        registry = Registry(
            f"127.0.0.1:{port}", directory / "storage", log, process, ca, dict(users or {})
        )
        try:
            if _ready(registry):
                break
        except BaseException:
            registry.stop()
            raise
        registry.stop()  # the port was taken meanwhile: try another
    else:
        raise RuntimeError(f"docker-registry did not start: {log.read_text()[-2000:]}")
    try:
        yield registry
    finally:
        registry.stop()


def _ready(registry: Registry) -> bool:
    scheme = "https" if registry.ca is not None else "http"
    context = ssl.create_default_context(cafile=registry.ca) if registry.ca else None
    until = time.monotonic() + READY_WITHIN
    while time.monotonic() < until:
        if registry.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(
                f"{scheme}://{registry.address}/v2/", timeout=2, context=context
            ):
                return True
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # it answers: logins are on
        except OSError:
            time.sleep(0.02)
    return False


def htpasswd_line(user: str, password: str) -> str:
    """A bcrypt htpasswd line (cost 4: a test's, not a server's) from Debian's htpasswd."""
    if shutil.which("htpasswd") is None:
        raise RuntimeError("no htpasswd: install Debian's apache2-utils")
    done = subprocess.run(
        ["htpasswd", "-nbBC", "4", user, password], capture_output=True, check=True, timeout=30
    )
    return done.stdout.decode().strip() + "\n"


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1, ::1 and localhost it signed; (ca, cert,
    key). The CA is `ca/ca.crt`, alone in its directory: skopeo reads a cert dir's `*.key` as
    client keys."""
    (directory / "ca").mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "wakeful test registry CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
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
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca" / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    paths[2].chmod(0o600)
    return paths
