"""The image cache on the happy path: a real image unpacks and runs, ownership goes where the
image's user says, concurrent calls share one unpack, eviction takes the least recently used
tree no sandbox holds, and the counts are kept."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.node.images.conftest import CacheFor
from tests.support.images import (
    INDEX_HTML,
    OciLayout,
    busybox_image,
    directory,
    file,
    layer,
    opaque,
    whiteout,
)
from wakeful.domain.models.images import ImageConfig, ImageRecord
from wakeful.node.images import ImageCache, ImageError
from wakeful.node.images.testing import DirectoryBlobs

pytestmark = pytest.mark.anyio
OWNER = 12_345


def owners(tree: Path) -> dict[str, tuple[int, int]]:
    found = {".": (tree.lstat().st_uid, tree.lstat().st_gid)}
    for path in tree.rglob("*"):
        found[path.relative_to(tree).as_posix()] = (path.lstat().st_uid, path.lstat().st_gid)
    return found


async def test_the_busybox_image_unpacks_and_runs(layout: OciLayout, cache_for: CacheFor) -> None:
    image = busybox_image(layout)
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    assert tree == cache.root / "trees" / f"{image.manifest.removeprefix('sha256:')}-any"
    assert (tree / "www" / "index.html").read_bytes() == INDEX_HTML
    assert os.readlink(tree / "bin" / "sh") == "busybox"
    ran = await anyio.run_process(
        [shutil.which("chroot") or "chroot", str(tree), "/bin/sh", "-c", "cat /www/index.html"]
    )
    assert ran.stdout == INDEX_HTML


async def test_a_root_image_is_all_the_owner_s(layout: OciLayout, cache_for: CacheFor) -> None:
    image = busybox_image(layout)
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=OWNER)
    assert tree.name.endswith(f"-{OWNER}")
    assert set(owners(tree).values()) == {(OWNER, OWNER)}


@pytest.mark.parametrize("user", ["1000", "1000:1000", "app"])
async def test_a_user_image_gives_only_its_user_s_files_to_the_owner(
    layout: OciLayout, cache_for: CacheFor, user: str
) -> None:
    image = busybox_image(layout, user=user)
    cache, _ = cache_for(layout)
    found = owners(await cache.tree(image, owner=OWNER))
    assert found["www"] == found["www/index.html"] == (OWNER, OWNER)
    assert found["bin/busybox"] == found["etc/passwd"] == found["."] == (0, 0)


async def test_a_user_the_image_does_not_name_is_an_error(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = busybox_image(layout, user="nginx")
    cache, _ = cache_for(layout)
    with pytest.raises(ImageError, match=f'image {image.ref} runs as user "nginx", who is not'):
        await cache.tree(image, owner=OWNER)
    assert list((cache.root / "trees").iterdir()) == []


async def test_nothing_in_the_tree_is_writable_by_others(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = busybox_image(layout)
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=OWNER)
    writable = [
        p for p in [tree, *tree.rglob("*")] if not p.is_symlink() and p.stat().st_mode & 0o022
    ]
    assert writable == []


async def test_two_concurrent_calls_share_one_unpack(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = busybox_image(layout)
    cache, blobs = cache_for(layout)
    paths: list[Path] = []

    async def get() -> None:
        paths.append(await cache.tree(image, owner=OWNER))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(get)
        tasks.start_soon(get)
    assert paths[0] == paths[1]
    assert (cache.stats().misses, cache.stats().hits) == (1, 1)
    assert sorted(blobs.fetched) == sorted(
        {image.manifest, image.config_digest, *(x.digest for x in image.layers)}
    )


async def test_concurrent_calls_share_a_failure(layout: OciLayout, cache_for: CacheFor) -> None:
    image = busybox_image(layout, user="nginx")
    cache, _ = cache_for(layout)
    errors: list[str] = []

    async def get() -> None:
        with pytest.raises(ImageError) as caught:
            await cache.tree(image, owner=OWNER)
        errors.append(str(caught.value))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(get)
        tasks.start_soon(get)
    assert len(errors) == 2 and errors[0] == errors[1]
    assert cache.stats().misses == 1


async def test_hits_and_misses_are_counted(layout: OciLayout, cache_for: CacheFor) -> None:
    image = busybox_image(layout)
    cache, blobs = cache_for(layout)
    first = await cache.tree(image, owner=OWNER)
    fetched = len(blobs.fetched)
    assert await cache.tree(image, owner=OWNER) == first
    other = await cache.tree(image, owner=None)  # another owner: another tree, no fetch
    assert other != first
    assert len(blobs.fetched) == fetched
    stats = cache.stats()
    assert (stats.images, stats.hits, stats.misses) == (2, 1, 2)
    assert stats.bytes > 2 * (1 << 20)  # busybox, twice
    assert stats.blob_bytes > 0


async def test_eviction_takes_the_least_recently_used_tree_and_never_a_held_one(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    held, old, new, last = (
        layout.add_image(n, [layer(file(n, os.urandom(100_000)), gzip=False)])
        for n in ("held", "old", "new", "last")
    )
    cache, _ = cache_for(layout, max_cache_bytes=250_000)
    async with cache.using(held, OWNER) as held_tree:
        old_tree = await cache.tree(old, OWNER)
        new_tree = await cache.tree(new, OWNER)  # room for two: the unused `old` goes
        assert not old_tree.exists() and held_tree.exists() and new_tree.exists()
        assert not cache.root.joinpath(
            "layout/blobs", old.layers[0].digest.replace(":", "/")
        ).exists()
        assert cache.stats().in_use == 1
        with pytest.raises(ImageError, match="needs 100000 bytes of the node's image cache"):
            async with cache.using(new, OWNER), cache.using(last, OWNER):
                pass  # both held: no room for a third
    # Released last, `held` is the most recently used now: `new` goes.
    last_tree = await cache.tree(last, OWNER)
    assert last_tree.exists() and held_tree.exists() and not new_tree.exists()
    assert cache.stats().images == 2
    assert list((cache.root / "tmp").iterdir()) == []


async def test_a_missing_umoci_is_an_error_that_says_what_to_install(
    layout: OciLayout, cache_for: CacheFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = busybox_image(layout)
    cache, blobs = cache_for(layout)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ImageError, match="install Debian's `umoci`"):
        await cache.tree(image, owner=None)
    assert blobs.fetched == []


async def test_what_a_previous_agent_left_is_removed(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = busybox_image(layout)
    cache, _ = cache_for(layout)
    stale = cache.root / "trees" / "stale-any"
    stale.mkdir(parents=True)
    (cache.root / "tmp").mkdir()
    (cache.root / "tmp" / "half-made").mkdir()
    await cache.tree(image, owner=None)
    assert not stale.exists()
    assert list((cache.root / "tmp").iterdir()) == []
    assert [p.name for p in (cache.root / "trees").iterdir()] == [f"{image.manifest[7:]}-any"]


async def test_only_the_image_user_s_files_become_the_owner_s(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image(
        "split",
        [
            layer(
                directory("srv", uid=1000, gid=1000),
                file("srv/mine", b"1000's", uid=1000, gid=100),
                file("srv/www-data", b"33's", uid=33, gid=33, mode=0o666),
                file("srv/root", b"root's"),
            )
        ],
        ImageConfig(user="1000"),
    )
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=OWNER)
    found = owners(tree)
    assert found["srv"] == found["srv/mine"] == (OWNER, OWNER)
    assert found["srv/www-data"] == found["srv/root"] == found["."] == (0, 0)
    assert stat.S_IMODE((tree / "srv/www-data").stat().st_mode) == 0o644


class GatedBlobs(DirectoryBlobs):
    """Serves nothing until `gate` is set."""

    def __init__(self, layout: Path) -> None:
        super().__init__(layout)
        self.gate = anyio.Event()

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        await self.gate.wait()
        async for chunk in super().chunks(digest):
            yield chunk


async def test_a_waiter_makes_the_tree_when_the_maker_is_cancelled(
    layout: OciLayout, tmp_path: Path
) -> None:
    image = busybox_image(layout)
    blobs = GatedBlobs(layout.path)
    cache = ImageCache(
        tmp_path / "cache",
        blobs,
        max_bytes=1 << 26,
        max_unpacked=1 << 28,
        max_files=10_000,
        max_cache_bytes=1 << 30,
    )
    got: list[Path] = []
    maker = anyio.CancelScope()

    async def make() -> None:
        with maker:
            await cache.tree(image, owner=OWNER)

    async def wait_for_it() -> None:
        got.append(await cache.tree(image, owner=OWNER))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(make)
        await anyio.wait_all_tasks_blocked()  # the maker waits for its first blob
        tasks.start_soon(wait_for_it)
        await anyio.wait_all_tasks_blocked()  # the waiter waits for the maker
        maker.cancel()
        await anyio.wait_all_tasks_blocked()
        blobs.gate.set()
    assert got == [cache.root / "trees" / f"{image.manifest[7:]}-{OWNER}"]
    assert got[0].joinpath("www/index.html").read_bytes() == INDEX_HTML
    assert cache.stats().misses == 2  # the cancelled make, and the waiter's
    assert list((cache.root / "tmp").iterdir()) == []


async def test_a_new_version_is_made_from_the_base_its_layers_share(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    """Two versions of an app, the same layers but the last: the second tree is the first's
    base copied with its own last layer over it (its whiteouts too), each whole and alone."""
    system = layer(directory("app"), file("app/lib.py", b"lib"), file("app/old.py", b"old"))
    first = layout.add_image("v1", [system, layer(file("app/main.py", b"version 1"))])
    second = layout.add_image(
        "v2", [system, layer(file("app/main.py", b"version 2"), whiteout("app/old.py"))]
    )
    assert first.layers[0].digest == second.layers[0].digest
    cache, _ = cache_for(layout)
    one = await cache.tree(first, owner=OWNER)
    two = await cache.tree(second, owner=OWNER)
    assert len(list((cache.root / "bases").iterdir())) == 1  # one base, made once
    assert (one / "app" / "main.py").read_bytes() == b"version 1"
    assert (two / "app" / "main.py").read_bytes() == b"version 2"
    assert (one / "app" / "old.py").exists() and not (two / "app" / "old.py").exists()
    assert (two / "app" / "lib.py").read_bytes() == b"lib"
    assert set(owners(two).values()) == {(OWNER, OWNER)}
    base = next(iter((cache.root / "bases").iterdir()))
    assert (base / "app" / "old.py").exists()  # the base is never changed by a tree's layer
    assert not (base / "app" / "main.py").exists()
    assert cache.stats().images == 2


async def test_an_opaque_directory_in_the_last_layer_hides_the_base_s(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    system = layer(directory("app"), file("app/a.py", b"a"), file("app/b.py", b"b"))
    image = layout.add_image("v1", [system, layer(opaque("app"), file("app/c.py", b"c"))])
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    assert sorted(p.name for p in (tree / "app").iterdir()) == ["c.py"]


async def test_two_images_sharing_a_base_made_at_once_make_it_once(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    system = layer(directory("app"), file("app/lib.py", b"lib"))
    images = [
        layout.add_image(f"v{n}", [system, layer(file("app/main.py", f"{n}".encode()))])
        for n in (1, 2)
    ]
    cache, _ = cache_for(layout)
    trees: list[Path] = []

    async def make(image: ImageRecord) -> None:
        trees.append(await cache.tree(image, owner=None))

    async with anyio.create_task_group() as tasks:
        for image in images:
            tasks.start_soon(make, image)
    assert sorted((tree / "app" / "main.py").read_bytes() for tree in trees) == [b"1", b"2"]
    assert len(list((cache.root / "bases").iterdir())) == 1
