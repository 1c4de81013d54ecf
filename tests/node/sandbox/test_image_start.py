"""An image app's sandbox, started by the real runtime (root, bubblewrap, umoci, pasta): the
image is its root, it runs as its own uid with no capability, its environment and its /etc
files are what wakeful gives, and its `WorkingDir` is entered as the app, inside its root."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.images import (
    BUSYBOX_CONFIG,
    OciLayout,
    busybox_layers,
    directory,
    layer,
    symlink,
)
from tests.support.waiting import eventually
from wakeful.domain.models import ImageConfig, ImageRecord
from wakeful.node.images import ImageCache
from wakeful.node.images.testing import DirectoryBlobs
from wakeful.node.jail.detect import detect_jail
from wakeful.node.jail.uids import UidTable
from wakeful.node.sandbox.local import ProcessRuntime
from wakeful.node.sandbox.process import LocalProcess
from wakeful.node.sandbox.runtime import Identity, ImageRun

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("umoci") is None or shutil.which("bwrap") is None,
        reason="needs root, Debian's umoci and bubblewrap",
    ),
]

HOST_PASSWD = Path("/etc/passwd").read_text().splitlines()[0]
SHOW = (
    "id; echo cwd=$(pwd); ls /; grep -E '^Cap(Eff|Bnd)' /proc/self/status; "
    "echo GREETING=$GREETING; cat /etc/hosts /etc/resolv.conf; sleep 60"
)


@pytest.fixture
def started(tmp_path: Path) -> tuple[ProcessRuntime, OciLayout, Path]:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    layout = OciLayout(tmp_path / "layout")
    cache = ImageCache(
        data / "images",
        DirectoryBlobs(layout.path),
        max_bytes=1 << 30,
        max_unpacked=1 << 30,
        max_files=10_000,
        max_cache_bytes=1 << 31,
    )
    runtime = ProcessRuntime(
        jail=detect_jail(data),
        uids=UidTable(data / "uids.json", claims=data / "claims"),
        images=cache,
    )
    return runtime, layout, data


async def run(
    runtime: ProcessRuntime, data: Path, image: ImageRecord, workdir: str, script: str
) -> tuple[LocalProcess, list[bytes]]:
    sandbox = f"img-{uuid.uuid4().hex[:8]}"  # its cgroup's name: tests run side by side
    base = data / "sandboxes" / sandbox
    (base / "app").mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/bin", "GREETING": "hi from the env"}
    process = await runtime.start(
        ["/bin/busybox", "sh", "-c", script],
        env,
        base / "app",
        base / "output.log",
        Identity(sandbox, "imgapp"),
        None,
        ImageRun(image, workdir),
    )
    out: list[bytes] = []
    return process, out


async def test_the_image_is_its_root_and_it_runs_as_its_own_uid_without_capabilities(
    started: tuple[ProcessRuntime, OciLayout, Path],
) -> None:
    runtime, layout, data = started
    image = layout.add_image("site", busybox_layers(), BUSYBOX_CONFIG)
    process, out = await run(runtime, data, image, "/www", SHOW)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(process.pump, out.append)
            await eventually(lambda: b"nameserver" in b"".join(out))
            tasks.cancel_scope.cancel()
    finally:
        await process.stop(grace=2)
    text = b"".join(out).decode()
    assert "uid=0" not in text and "uid=4" in text, text
    assert "cwd=/www" in text
    listed = text.split("cwd=/www", 1)[1]
    assert "www" in listed and "usr" not in listed.split("Cap", 1)[0]  # the image's, not ours
    assert "CapEff:\t0000000000000000" in text and "CapBnd:\t0000000000000000" in text
    assert "GREETING=hi from the env" in text
    assert "localhost" in text and "nameserver" in text
    assert "127.0.0.53" not in text  # a loopback resolver the sandbox could not reach


@pytest.mark.parametrize("workdir", ["/proc/1/root", "/proc/self/root/../.."])
async def test_a_working_dir_cannot_lead_out_of_the_image(
    started: tuple[ProcessRuntime, OciLayout, Path], workdir: str
) -> None:
    runtime, layout, data = started
    image = layout.add_image("site", busybox_layers(), BUSYBOX_CONFIG)
    process, out = await run(runtime, data, image, workdir, "ls; cat etc/passwd; sleep 60")
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(process.pump, out.append)
            with anyio.move_on_after(5):
                await process.wait()
            tasks.cancel_scope.cancel()
    finally:
        await process.stop(grace=2)
    text = b"".join(out).decode()
    # Entered as the app: /proc/1/root is bwrap's init's (root's) and refused; or it lands in
    # the image's own root. Never the node's system directories.
    assert ".wakeful" not in text and "usr" not in text, text
    assert HOST_PASSWD not in text


def test_a_relative_working_dir_is_refused() -> None:
    with pytest.raises(ValueError, match="WorkingDir must be an absolute path"):
        ImageConfig(working_dir="..")


@pytest.mark.parametrize(
    "planted",
    [
        lambda outside: [symlink("etc", f"/oldroot{outside}")],
        lambda outside: [directory("etc"), symlink("etc/hosts", f"/oldroot{outside}/planted")],
        lambda outside: [directory("etc"), symlink("etc/resolv.conf", f"/oldroot{outside}/dns")],
        lambda outside: [symlink("tmp", f"/oldroot{outside}"), symlink("proc", "/oldroot/")],
    ],
    ids=["etc", "etc/hosts", "etc/resolv.conf", "tmp and proc"],
)
async def test_links_in_the_image_never_lead_a_mount_onto_the_node(
    started: tuple[ProcessRuntime, OciLayout, Path], tmp_path: Path, planted: Any
) -> None:
    """bwrap creates a mount's target as root, resolving it where the node's root is
    /oldroot: the image's links at those targets are replaced before it runs."""
    runtime, layout, data = started
    outside = tmp_path / "outside"
    outside.mkdir()
    system, site = busybox_layers()
    image = layout.add_image("planted", [system, site, layer(*planted(outside))], BUSYBOX_CONFIG)
    process, out = await run(runtime, data, image, "/", "cat /etc/hosts; sleep 60")
    ended: list[int] = []
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(process.pump, out.append)

            async def exited() -> None:
                ended.append(await process.wait())

            tasks.start_soon(exited)
            await eventually(lambda: b"localhost" in b"".join(out) or ended)
            tasks.cancel_scope.cancel()
    finally:
        await process.stop(grace=2)
    assert list(outside.iterdir()) == []
    assert b"localhost" in b"".join(out), (ended, b"".join(out).decode(errors="replace"))
