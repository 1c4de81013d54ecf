"""Running Debian's skopeo without blocking the loop and without hanging: every run has a
deadline, after which skopeo is killed and `RegistryTimeout` says what it was doing.

Credentials never reach argv (which `ps` shows every user): each run gets a private session
directory (0700) holding an auth file (0600) and, when a CA is set, a cert dir with it as
`ca.crt`; the directory is skopeo's HOME too, so no auth file of the machine's user leaks into
a pull, and it is deleted when the run ends. TLS follows the registry's host as written in the
reference: loopback (`localhost`, 127.0.0.0/8, ::1) may be plain HTTP, as podman and docker
allow; anything else is HTTPS verified against the system CAs plus the configured CA.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from wakeful.aio.spawn import PIPE, spawn

from .errors import ImageRefused, RegistryError, RegistryTimeout, SkopeoMissing
from .resolve import MAX_MANIFEST_BYTES, is_loopback

TAIL_BYTES = 8192
"""How much of skopeo's output is kept for an error message."""
_FIELD = re.compile(r'level=(?:fatal|error|warning) msg="((?:[^"\\]|\\.)*)"')
_NOISE = re.compile(r'^Error parsing image name "[^"]*": ')
"""skopeo 1.9's inspect says so before any failure to read the image, parsing or not."""


@dataclass(frozen=True)
class Credentials:
    """A registry login; the password is never printed (not by repr, not in errors)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class RegistryAccess:
    """How registries are reached (the wiring builds it from settings)."""

    ca: Path | None = None
    """A PEM file of CA certificates trusted besides the system's (`WAKEFUL_REGISTRY_CA`)."""
    verify_loopback: bool = False
    """Require verified TLS from loopback registries too (tests of the TLS path use it)."""
    skopeo: str = "skopeo"


def tls_flags(host: str | None, access: RegistryAccess, certs: Path | None, src: bool) -> list[str]:
    """skopeo's TLS options for a registry at `host` (None: an archive, no registry)."""
    if host is None:
        return []
    prefix = "--src-" if src else "--"
    if is_loopback(host) and not access.verify_loopback:
        return [f"{prefix}tls-verify=false"]  # HTTPS unverified, else plain HTTP
    flags = [f"{prefix}tls-verify=true"]
    if certs is not None:
        flags.append(f"{prefix}cert-dir={certs}")
    return flags


def auth_file(domain: str, credentials: Credentials) -> str:
    """The auth file podman and docker read, holding one login."""
    token = f"{credentials.username}:{credentials.password}".encode()
    return json.dumps({"auths": {domain: {"auth": base64.b64encode(token).decode()}}})


def summary(output: bytes, secrets: tuple[str, ...] = ()) -> str:
    """skopeo's last complaint (the `msg` of its last error line, else its last line), with
    every secret blanked out."""
    text = output.decode(errors="replace")
    messages = [match.group(1).replace('\\"', '"') for match in _FIELD.finditer(text)]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = messages[-1] if messages else (lines[-1] if lines else "no output")
    found = _NOISE.sub("", found)
    for secret in secrets:
        if secret:
            found = found.replace(secret, "***")
    return found[:500]


@dataclass(frozen=True)
class Session:
    """One run's private directory (skopeo's HOME), its auth file and its cert dir."""

    dir: Path
    authfile: Path | None
    certs: Path | None


class Skopeo:
    """One way to run skopeo: `access` decides TLS; `workspace` (a private directory) holds
    the session directories and skopeo's own temporary files (an archive's unpacked copy);
    `timeout` is named in a timeout's message (each call passes its own deadline)."""

    def __init__(self, access: RegistryAccess, workspace: Path, timeout: float) -> None:
        self.access = access
        self._workspace = workspace
        self.timeout = timeout
        """Seconds an import may take (the deadlines callers pass count it down)."""

    async def inspect_raw(
        self,
        source: str,
        *,
        host: str | None,
        domain: str | None = None,
        credentials: Credentials | None = None,
        deadline: float,
        what: str,
    ) -> bytes:
        """The raw manifest (or index) `source` names, as the registry or archive has it."""
        with self._session(domain, credentials) as session:
            argv = ["inspect", "--raw", "--retry-times=0"]
            argv += tls_flags(host, self.access, session.certs, src=False)
            if session.authfile is not None:
                argv.append(f"--authfile={session.authfile}")
            return await self._run(
                [*argv, source], session, deadline=deadline, what=what, credentials=credentials
            )

    async def copy(
        self,
        source: str,
        destination: str,
        *,
        host: str | None,
        domain: str | None = None,
        credentials: Credentials | None = None,
        extra: tuple[str, ...] = (),
        deadline: float,
        what: str,
    ) -> None:
        with self._session(domain, credentials) as session:
            argv = [
                "copy",
                "--retry-times=0",
                *tls_flags(host, self.access, session.certs, src=True),
            ]
            if session.authfile is not None:
                argv.append(f"--src-authfile={session.authfile}")
            await self._run(
                [*argv, *extra, source, destination],
                session,
                deadline=deadline,
                what=what,
                credentials=credentials,
                data=False,
            )

    @contextlib.contextmanager
    def _session(self, domain: str | None, credentials: Credentials | None) -> Iterator[Session]:
        """A private directory with the auth file and the CA for one run, gone after it."""
        self._workspace.mkdir(mode=0o700, parents=True, exist_ok=True)
        home = Path(tempfile.mkdtemp(prefix="session.", dir=self._workspace))  # 0700
        try:
            authfile = certs = None
            if credentials is not None and domain is not None:
                authfile = home / "auth.json"
                fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(auth_file(domain, credentials))
            if self.access.ca is not None:
                certs = home / "certs"
                certs.mkdir(mode=0o700)
                try:
                    shutil.copyfile(self.access.ca, certs / "ca.crt")
                except OSError as exc:
                    raise RegistryError(
                        f"cannot read the registry CA {self.access.ca} (WAKEFUL_REGISTRY_CA): "
                        f"{exc.strerror}"
                    ) from None
            yield Session(home, authfile, certs)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    async def _run(
        self,
        argv: list[str],
        session: Session,
        *,
        deadline: float,
        what: str,
        credentials: Credentials | None,
        data: bool = True,
    ) -> bytes:
        """skopeo's stdout (`data`) or nothing; RegistryError with its last complaint when it
        fails, RegistryTimeout when `deadline` (anyio's clock) passes first."""
        binary = shutil.which(self.access.skopeo)
        if binary is None:
            raise SkopeoMissing(
                f"{what}: no {self.access.skopeo!r} on this machine; install Debian's skopeo "
                "(apt-get install skopeo)"
            )
        home = str(session.dir)
        env = {"HOME": home, "XDG_CONFIG_HOME": home, "XDG_RUNTIME_DIR": home}
        env["TMPDIR"] = str(self._workspace)
        secrets: tuple[str, ...] = ()
        if credentials is not None:
            token = f"{credentials.username}:{credentials.password}".encode()
            secrets = (credentials.password, base64.b64encode(token).decode())
        out, tail = bytearray(), bytearray()
        # No umask here (`spawn` sets none): what skopeo writes lies in 0700 directories, and
        # the blobs are made 0600 after each copy. Started through `spawn`, never a fork of
        # this process (see `wakeful.aio.spawn`).
        process = await spawn(
            [binary, f"--tmpdir={self._workspace}", *argv],
            cwd=home,
            env=env,
            stdout=PIPE,
            stderr=PIPE,
        )

        async def read_out(stream: asyncio.StreamReader) -> None:
            while chunk := await stream.read(65536):
                out.extend(chunk)
                if len(out) > MAX_MANIFEST_BYTES:
                    process.kill()  # what it prints is refused; stop it writing
                    return

        async def read_tail(stream: asyncio.StreamReader) -> None:
            while chunk := await stream.read(65536):
                tail.extend(chunk)
                del tail[:-TAIL_BYTES]

        try:
            with anyio.CancelScope(deadline=deadline) as scope:
                assert process.stdout is not None and process.stderr is not None
                async with anyio.create_task_group() as group:
                    group.start_soon(read_out if data else read_tail, process.stdout)
                    group.start_soon(read_tail, process.stderr)
                await process.wait()
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.kill()
                await process.wait()
        if scope.cancelled_caught:
            raise RegistryTimeout(
                f"{what}: timed out after {self.timeout:g} s (WAKEFUL_IMAGE_PULL_TIMEOUT); "
                f"skopeo's last line: "
                f"{summary(bytes(tail), secrets)}"
            )
        if len(out) > MAX_MANIFEST_BYTES:
            raise ImageRefused(f"{what}: the manifest is over {MAX_MANIFEST_BYTES} bytes")
        if process.returncode != 0:
            raise RegistryError(f"{what}: {summary(bytes(tail), secrets)}")
        return bytes(out)
