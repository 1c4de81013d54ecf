"""A certificate authority and certificates made by the README's own commands, for etcd over
mutual TLS, and the WAKEFUL_* variables that point a piece at them."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from wakeful.store import TLSFiles
from wakeful.store.testing import EtcdServer, EtcdServerTLS

README = Path(__file__).resolve().parents[2] / "README.md"


BOUND = 20  # seconds: a refused handshake must fail well within this, never hang


def readme_commands(after: str = "### etcd over mutual TLS") -> str:
    """The first `sh` block of the README after `after` (by default, of the "etcd over mutual
    TLS" section: the CA, etcd's certificate and a client certificate)."""
    section = README.read_text().split(after, 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return "\n".join(line.strip() for line in block.splitlines())


@dataclass(frozen=True)
class Pki:
    """One run of the README's commands: a CA, etcd's certificate, a client certificate."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    def client(self, ca: Pki | None = None) -> TLSFiles:
        """This CA's client certificate, trusting `ca`'s CA (this one's by default)."""
        return TLSFiles(
            ca=(ca or self).ca, cert=self.dir / "wakeful.crt", key=self.dir / "wakeful.key"
        )

    def server(self) -> EtcdServerTLS:
        client = self.client()
        assert client.cert is not None and client.key is not None
        return EtcdServerTLS(
            ca=self.ca,
            cert=self.dir / "etcd.crt",
            key=self.dir / "etcd.key",
            client_cert=client.cert,
            client_key=client.key,
        )


def make_pki(directory: Path) -> Pki:
    directory.mkdir()
    done = subprocess.run(
        ["sh", "-ec", readme_commands()], cwd=directory, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return Pki(directory)


def environment(server: EtcdServer, tls: TLSFiles) -> dict[str, str]:
    """The variables a piece reads to reach `server` with `tls`."""
    files = {"WAKEFUL_ETCD_CA": tls.ca, "WAKEFUL_ETCD_CERT": tls.cert, "WAKEFUL_ETCD_KEY": tls.key}
    named = {name: str(path) for name, path in files.items() if path is not None}
    return {"WAKEFUL_STORE_URL": server.url, **named}
