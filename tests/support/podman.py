"""Podman for the container tests: its settings, the base image, wakeful's image, and
containers that are always removed.

Everything runs through Debian's `podman` with `ops/container/containers.conf` (runc, cgroupfs,
rlimits that fit the host), as the README's commands do. The base image,
`docker.io/library/debian:bookworm-slim`, is made by `scripts/base-image` when podman does not
have it (debootstrap; ~1 minute once, then cached in podman's storage); wakeful's image is
built from the repository's own `Dockerfile`, with podman's layer cache, so a run that changed
only wakeful's code rebuilds one layer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from wakeful.build.tools import LAST_LINES, RACED_ATTEMPTS, RACED_PAUSE, Ended, raced

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "ops" / "container" / "containers.conf"
IMAGE = "localhost/wakeful:test"
INFRA_IMAGE = "localhost/wakeful-infra:test"
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt",)
"""The host's CA bundle, passed to the image build as the `extra_ca` secret: where this host
reaches PyPI through a proxy with its own CA, pip inside the build needs it too."""
CAPABILITIES = (
    "SYS_ADMIN",
    "NET_ADMIN",
    "SETUID",
    "SETGID",
    "SETPCAP",
    "CHOWN",
    "FOWNER",
    "DAC_OVERRIDE",
    "KILL",
)
LEAST_PRIVILEGE = (
    "--user",
    "0",
    "--userns=auto:size=500000",
    "--cap-drop",
    "ALL",
    "--cap-add",
    ",".join(CAPABILITIES),
)
"""What sandboxes need inside the container (the README's "As a container"): root in the
container, in a user namespace of its own (`--userns=auto`, so it is not the host's root),
with nine capabilities and no others."""
SUBID_RANGE = "containers:2000000:5000000"
"""The subordinate ids podman's `--userns=auto` takes from, for the user `containers`: ten
containers of 500000 ids (wakeful's per-app uids end at 499999)."""


def env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], env=env(), capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}\n{done.stderr[-3000:]}")
    return done


def usable() -> str | None:
    """Why podman cannot run containers here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/test installs Debian's podman)"
    if os.geteuid() != 0:
        return "the container tests run podman as root (CI is root)"
    done = podman("info", "--format", "json", check=False, timeout=60)
    if done.returncode != 0:
        return f"podman cannot run here: {done.stderr.strip()[-300:]}"
    return None


def subordinate_ids() -> None:
    """`--userns=auto` needs a range for the user `containers` in /etc/subuid and /etc/subgid;
    `scripts/test` adds one where there is none."""
    for name in ("/etc/subuid", "/etc/subgid"):
        path = Path(name)
        lines = path.read_text().splitlines() if path.exists() else []
        if not any(line.startswith("containers:") for line in lines):
            pytest.fail(f"{name} has no range for `containers` (add {SUBID_RANGE!r})")


def base_image() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "base-image")],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def build_command(tag: str, dockerfile: Path, context: Path) -> list[str]:
    secrets = [f"--secret=id=extra_ca,src={ca}" for ca in CA_BUNDLES if Path(ca).is_file()]
    # --jobs 2: a Dockerfile's stages build at once where they do not depend on each other.
    return [
        "podman",
        "build",
        "--jobs",
        "2",
        "--format",
        "docker",
        *secrets,
        "-f",
        str(dockerfile),
        "-t",
        tag,
        str(context),
    ]


def build_images() -> None:
    """wakeful's image and the infra image, built at once (each mostly waits on apt and pip),
    each writing its output to a file of its own (a pipe read after the other build's end
    could fill and stall it).

    Either is built again (up to twice, after a pause) when it failed only because an image
    was removed from podman's storage while it looked for cached layers: the other worker's
    tests build apps with `wakeful deploy DIR`, which removes each app's previous image
    (`raced`). A failure for any other reason is reported first."""
    folder = ROOT / "ops" / "container"
    builds = {
        IMAGE: build_command(IMAGE, ROOT / "Dockerfile", ROOT),
        INFRA_IMAGE: build_command(INFRA_IMAGE, folder / "infra.Dockerfile", folder),
    }
    with tempfile.TemporaryDirectory() as scratch:
        for attempt in range(1, RACED_ATTEMPTS + 1):
            failed = _build_at_once(builds, Path(scratch))
            if not failed:
                return
            if attempt == RACED_ATTEMPTS or not all(raced(e) for e in failed.values()):
                break
            time.sleep(RACED_PAUSE * 2 ** (attempt - 1))
            builds = {tag: builds[tag] for tag in failed}
    tag, ended = sorted(failed.items(), key=lambda item: raced(item[1]))[0]
    raise AssertionError(f"building {tag}:\n" + "\n".join(ended.lines))


def _build_at_once(builds: dict[str, list[str]], scratch: Path) -> dict[str, Ended]:
    """Every build of `builds` run at once; how each that failed ended."""
    running = {}
    for number, (tag, argv) in enumerate(builds.items()):
        out = (scratch / f"build-{number}.log").open("w+")
        process = subprocess.Popen(argv, env=env(), stdout=out, stderr=subprocess.STDOUT)
        running[tag] = (process, out)
    failed = {}
    for tag, (process, out) in running.items():
        with out:
            process.wait(timeout=900)
            out.seek(0)
            said = out.read()
        if process.returncode != 0:
            failed[tag] = Ended(process.returncode, said.splitlines()[-LAST_LINES:])
    return failed


@contextlib.contextmanager
def container(name: str, args: Sequence[str]) -> Iterator[str]:
    """A container started detached (`podman run -d --name NAME ARGS`), removed however the
    test ends."""
    podman("rm", "--force", "--ignore", name, check=False)
    podman("run", "--detach", "--name", name, *args)
    try:
        yield name
    finally:
        podman("rm", "--force", "--ignore", "--volumes", "--time", "0", name, check=False)


@contextlib.contextmanager
def volume(name: str) -> Iterator[str]:
    """A named volume, removed with what it holds however the test ends."""
    try:
        yield name
    finally:
        podman("volume", "rm", "--force", name, check=False)


def state(name: str) -> dict[str, object]:
    found = json.loads(podman("inspect", "--type", "container", name).stdout)
    return dict(found[0]["State"])


def logs(name: str) -> str:
    done = podman("logs", name, check=False)
    return done.stdout + done.stderr


def wait_for(url: str, host: str | None = None, within: float = 120) -> httpx.Response:
    """The first 200 from `url` (a published port), polled; the last answer or error in the
    failure after `within` seconds."""
    headers = {"host": host} if host else {}
    deadline = time.monotonic() + within
    last = "nothing"
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(url, headers=headers, timeout=10)
            if answer.status_code == 200:
                return answer
            last = f"{answer.status_code} {answer.text[:300]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise AssertionError(f"{url} ({host}) never answered 200 in {within} s: {last}")


def wait_exited(name: str, within: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = state(name)
        if found.get("Status") in ("exited", "stopped"):
            return found
        time.sleep(0.2)
    raise AssertionError(f"{name} still runs after {within} s:\n{logs(name)[-2000:]}")


def gateway() -> str:
    """podman's default network's gateway: the host, as its containers see it."""
    network = json.loads(podman("network", "inspect", "podman").stdout)[0]
    return str(network["subnets"][0]["gateway"])


def host_address() -> str:
    """The host's own address toward its default route (no packet is sent): another of the
    host's addresses than the gateway, which containers reach through it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))
        return str(probe.getsockname()[0])


@contextlib.contextmanager
def listener(address: str) -> Iterator[tuple[Callable[[], bytes], str]]:
    """A TCP listener of the test's on `address`, and a call that waits for one connection
    and returns what it sent."""
    with socket.socket() as server:
        server.bind((address, 0))
        server.listen()
        server.settimeout(60)

        def received() -> bytes:
            connection, _ = server.accept()
            with connection:
                connection.settimeout(30)
                return connection.recv(4096)

        yield received, f"{address}:{server.getsockname()[1]}"
