"""Debian's `pebble` (Let's Encrypt's test ACME server, 2.4) on loopback, for tests that get
certificates over real ACME with real HTTP-01 validation.

`running_pebble(tmp, http_port=PORT)` starts `pebble-challtestsrv` as pebble's DNS server only
(every A query is answered with `names_resolve_to`, AAAA queries with nothing), then pebble
on free ports with a listener certificate made here, its validation authority connecting to
`names_resolve_to:PORT` for HTTP-01 challenges; it waits until `/dir` answers and stops both
by their pids. Validation stays on: a test must serve the key authorizations itself.

Needs Debian's `pebble` (both binaries).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.listening import listens
from tests.support.registry import make_certificates
from wakeful.store.testing import free_port

PEBBLE = "pebble"
CHALLTESTSRV = "pebble-challtestsrv"
READY_WITHIN = 30.0

NEW_ORDER = "Added order "
"""In pebble's log once per new order it accepts (count them in `Pebble.log()`). pebble 2.4
prints `Pebble YYYY/MM/DD HH:MM:SS Added order "<order id>" to the db`, then `There are now
N orders in the db`. Validating a challenge logs `Starting 3 validations.` and three
`Attempting to validate w/ HTTP: http://NAME:PORT/.well-known/acme-challenge/TOKEN` (the
HTTP-01 server sees three GETs); issuing, `Issued certificate serial <hex> for order <id>`."""


def pebble_installed() -> bool:
    return shutil.which(PEBBLE) is not None and shutil.which(CHALLTESTSRV) is not None


@dataclass(frozen=True)
class Pebble:
    directory: str
    """The ACME directory, `https://127.0.0.1:PORT/dir`."""
    ca_file: Path
    """The CA that signed pebble's listeners (ACME and management): trust it to reach them.
    Not the CA that issues ACME certificates: see `issuing_roots`."""
    management: str
    """`https://127.0.0.1:PORT` (the same listener certificate)."""
    log_file: Path
    """pebble's stdout and stderr."""
    _argv: list[str] = field(default_factory=list, repr=False)
    _env: dict[str, str] = field(default_factory=dict, repr=False)
    _running: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def restart(self) -> None:
        """Stop pebble and start it again on the same ports: a CA that lost every account,
        order and authorization (pebble keeps them in memory), at the same directory URL."""
        for process in self._running:
            _stop(process)
        with self.log_file.open("ab") as out:
            process = subprocess.Popen(
                self._argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._env,
            )  # fmt: skip
        self._running[:] = [process]
        if not _ready(self, process):
            raise RuntimeError(f"pebble did not start again: {self.log()[-3000:]}")

    def issuing_roots(self) -> bytes:
        """The PEM of the root the issued certificates chain to (new at every start)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        with urllib.request.urlopen(f"{self.management}/roots/0", context=context) as answer:
            return bytes(answer.read())

    def log(self) -> str:
        """pebble's output so far. Its management API counts nothing: count the orders it
        accepted with `log().count(NEW_ORDER)`."""
        return self.log_file.read_text(errors="replace")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _spawn(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )


def _dns(
    tmp: Path, attempt: int, names_resolve_to: str
) -> tuple[subprocess.Popen[bytes], int] | None:
    """challtestsrv answering DNS (UDP and TCP) on a free port, nothing else; (process,
    port), or None when one of its ports was taken meanwhile. Its management listener cannot
    be turned off: a free port too."""
    port, management = free_port(), free_port()
    log = tmp / f"challtestsrv.{attempt}.log"
    process = _spawn(
        [
            CHALLTESTSRV,
            f"-defaultIPv4={names_resolve_to}",
            "-defaultIPv6=",
            f"-dns01=127.0.0.1:{port}",
            "-http01=",
            "-https01=",
            "-tlsalpn01=",
            f"-management=127.0.0.1:{management}",
        ],
        log,
    )
    try:
        if listens(process, port) and listens(process, management):
            return process, port
    except TimeoutError:
        _stop(process)
        raise RuntimeError(f"pebble-challtestsrv did not start: {log.read_text()}") from None
    _stop(process)  # it exited: a port was taken meanwhile
    return None


def _ready(pebble: Pebble, process: subprocess.Popen[bytes]) -> bool:
    """True when `/dir` answers; False when pebble exited (a port taken meanwhile)."""
    context = ssl.create_default_context(cafile=pebble.ca_file)
    until = time.monotonic() + READY_WITHIN
    while time.monotonic() < until:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(pebble.directory, timeout=2, context=context):
                return True
        except OSError:
            time.sleep(0.05)
    _stop(process)
    raise RuntimeError(f"pebble did not answer in {READY_WITHIN} s: {pebble.log()[-3000:]}")


@contextlib.contextmanager
def running_pebble(
    tmp: Path,
    *,
    http_port: int,
    names_resolve_to: str = "127.0.0.1",
    validity: int | None = None,
) -> Iterator[Pebble]:
    """pebble validating HTTP-01 challenges at `names_resolve_to:http_port`, every name
    resolving to `names_resolve_to`; stopped on exit. `validity`: the issued certificates'
    lifetime in seconds (pebble 2.4's `certificateValidityPeriod`; 5 years by default)."""
    if not pebble_installed():
        raise RuntimeError("no pebble: install Debian's pebble")
    tmp.mkdir(parents=True, exist_ok=True)
    ca, cert, key = make_certificates(tmp / "certs")
    env = {name: value for name, value in os.environ.items() if not name.startswith("PEBBLE_")}
    env |= {"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"}  # validation stays on
    with contextlib.ExitStack() as stack:
        pebble: Pebble | None = None
        for attempt in range(3):
            started = _dns(tmp, attempt, names_resolve_to)
            if started is None:
                continue
            dns, dns_port = started
            stack.callback(_stop, dns)
            port, management = free_port(), free_port()
            config: dict[str, object] = {
                "listenAddress": f"127.0.0.1:{port}",
                "managementListenAddress": f"127.0.0.1:{management}",
                "certificate": str(cert),
                "privateKey": str(key),
                "httpPort": http_port,
                "tlsPort": free_port(),
                "ocspResponderURL": "",
                "externalAccountBindingRequired": False,
            }
            if validity is not None:
                config["certificateValidityPeriod"] = validity
            path = tmp / f"pebble-config.{attempt}.json"
            path.write_text(json.dumps({"pebble": config}))
            log = tmp / f"pebble.{attempt}.log"
            argv = [PEBBLE, "-config", str(path), "-dnsserver", f"127.0.0.1:{dns_port}"]
            process = _spawn(argv, log, env)
            running = [process]
            stack.callback(lambda held=running: [_stop(p) for p in held])
            pebble = Pebble(
                f"https://127.0.0.1:{port}/dir",
                ca,
                f"https://127.0.0.1:{management}",
                log,
                argv,
                env,
                running,
            )
            if _ready(pebble, process):
                break
            _stop(process)  # a port was taken meanwhile: try others
            _stop(dns)
        else:
            why = pebble.log()[-3000:] if pebble is not None else "no free ports for its DNS"
            raise RuntimeError(f"pebble did not start: {why}")
        yield pebble
