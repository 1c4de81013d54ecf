"""Apps from OCI images under `wakeful up` (issue 36), as a user meets them: an image pulled
from a real registry by tag and pinned at deploy (a later push to the tag changes nothing
until the next deploy, a wake from zero included), an archive from the app's directory, and
hostile images refused with their reason, nothing written outside the cache."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.images import (
    BUSYBOX_CONFIG,
    OciLayout,
    busybox_layers,
    file,
    layer,
    symlink,
)
from tests.support.registry import Registry, running_registry
from tests.support.up import Up, cli, cli_async, eventually_pool, start_up, stop_up

pytestmark = pytest.mark.anyio


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry") as found:
        yield found


def site_image(layout: OciLayout, name: str, text: bytes) -> None:
    layout.add_image(name, busybox_layers(index_html=text), BUSYBOX_CONFIG)


def image_app(root: Path, name: str, image: str, *, delay: str = "5s") -> Path:
    """An app directory whose wakeful.toml names `image` (and nothing to run: the image's
    Entrypoint and its one EXPOSE say it), idle after `delay`."""
    target = root / name
    target.mkdir(parents=True, exist_ok=True)
    (target / "wakeful.toml").write_text(
        f'name = "{name}"\nimage = "{image}"\nshutdown_timeout = 2\n'
        "[health]\ntimeout = 20\n"
        f'[concurrency]\nscale_down_delay = "{delay}"\nsuspend_delay = 0\nmax_instances = 4\n'
    )
    return target


async def page(up: Up, app: str) -> str:
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.get(f"{up.proxy}/", headers=up.host(app))
    assert answer.status_code == 200, answer.text
    return answer.text


async def eventually_page(up: Up, app: str, text: str, within: float = 30) -> None:
    with anyio.fail_after(within):
        while True:
            if await page(up, app) == text:
                return
            await anyio.sleep(0.2)


def save_archive(layout: OciLayout, tag: str, target: Path) -> None:
    """`podman save`'s format, made with skopeo from the test's layout."""
    subprocess.run(
        ["skopeo", "copy", "-q", f"oci:{layout.path}:{tag}", f"oci-archive:{target}"], check=True
    )


def written_under(root: Path, name: str) -> list[Path]:
    return list(root.glob(f"**/{name}"))


def deployed(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_an_image_is_pinned_at_deploy_and_a_push_changes_nothing_until_the_next(
    tmp_path: Path, registry: Registry
) -> None:
    layout = OciLayout(tmp_path / "layout")
    site_image(layout, "one", b"first build\n")
    site_image(layout, "two", b"second build\n")
    ref = registry.push(f"oci:{layout.path}:one", "team/site:1")
    app = image_app(tmp_path / "apps", "site", ref)
    up = start_up(tmp_path)
    try:
        out = deployed(await cli_async(up, "deploy", str(app)))
        assert f"pulling {ref}" in out
        assert await page(up, "site") == "first build\n"
        pinned = registry.manifest_digest(
            "team/site", "1", "application/vnd.oci.image.manifest.v1+json"
        )
        assert f"{ref}@{pinned}" in cli(up, "versions", "site").stdout

        registry.push(f"oci:{layout.path}:two", "team/site:1")  # the tag moves on
        # Idle to zero, then woken: the same pinned image, from the node's cache.
        await eventually_pool(up, lambda pool: pool["live"] == 0, within=60, app="site")
        assert await page(up, "site") == "first build\n"

        out = deployed(await cli_async(up, "deploy", str(app)))  # the next deploy pulls it
        assert "v2" in out
        await eventually_page(up, "site", "second build\n")
        versions = cli(up, "versions", "site").stdout
        assert (
            f"v1  image  {ref}@{pinned}" in versions and f"* v2  image  {ref}@sha256:" in versions
        )
    finally:
        stop_up(up)


async def test_an_archive_in_the_app_directory_deploys_with_no_registry(tmp_path: Path) -> None:
    layout = OciLayout(tmp_path / "layout")
    site_image(layout, "site", b"from an archive\n")
    app = image_app(tmp_path / "apps", "archived", "oci-archive:site.tar")
    save_archive(layout, "site", app / "site.tar")
    up = start_up(tmp_path)
    try:
        out = deployed(await cli_async(up, "deploy", str(app)))
        assert "uploading site.tar" in out
        assert await page(up, "archived") == "from an archive\n"
        # Nothing of the upload is left behind once the deploy took it.
        assert not list((up.data_dir / "artifacts" / "incoming").glob("*"))
    finally:
        stop_up(up)


async def test_a_hostile_image_is_refused_with_its_reason_and_writes_nothing_outside(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    layout = OciLayout(tmp_path / "layout")
    system, site = busybox_layers()
    # A link planted in one layer, then a file written through it in the next: umoci keeps
    # it inside the tree. A `..` entry: refused before anything is unpacked.
    through = [layer(symlink("escape", str(outside))), layer(file("escape/planted", b"x"))]
    layout.add_image("through", [system, site, *through], BUSYBOX_CONFIG)
    layout.add_image(
        "dotdot", [system, site, layer(file("../../escaped-entry", b"x"))], BUSYBOX_CONFIG
    )
    apps = tmp_path / "apps"
    for name in ("through", "dotdot"):
        app = image_app(apps, name, f"oci-archive:{name}.tar")
        save_archive(layout, name, app / f"{name}.tar")
    up = start_up(tmp_path)
    try:
        deployed(await cli_async(up, "deploy", str(apps / "through")))
        assert await page(up, "through") == "<h1>hello from an image</h1>\n"
        done = await cli_async(up, "deploy", str(apps / "dotdot"))
        assert done.returncode != 0
        assert "leaves the root" in done.stdout + done.stderr, done.stdout + done.stderr
        assert written_under(outside, "*") == []
        assert written_under(tmp_path, "escaped-entry") == [], "a `..` entry was written"
    finally:
        stop_up(up)
