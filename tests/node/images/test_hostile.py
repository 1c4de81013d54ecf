"""Hostile images, one guard each: every test here fails when its guard is removed.

Real umoci, real files, the layout's blobs served by `DirectoryBlobs`. A refused image leaves
nothing behind: no tree, no temporary tree, none of its blobs (`assert_nothing_left`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.node.images.conftest import CacheFor, MiB
from tests.support.images import (
    OciLayout,
    device,
    directory,
    fifo,
    file,
    hardlink,
    layer,
    opaque,
    symlink,
    zeros,
)
from wakeful.domain.models.images import ImageRecord
from wakeful.node.images import ImageCache, ImageError

pytestmark = pytest.mark.anyio
CAPABILITY = b"\x01\x00\x00\x02\x00\x20\x00\x00" + bytes(12)  # cap_net_bind_service, permitted


def assert_nothing_left(cache: ImageCache) -> None:
    assert list((cache.root / "trees").iterdir()) == []
    assert list((cache.root / "tmp").iterdir()) == []
    assert [p.name for p in (cache.root / "layout" / "blobs" / "sha256").iterdir()] == []
    assert cache.stats().images == 0


async def refused(cache: ImageCache, image: ImageRecord, reason: str) -> None:
    with pytest.raises(ImageError, match=reason) as caught:
        await cache.tree(image, owner=None)
    assert str(caught.value).startswith(f"image {image.ref} ")
    assert_nothing_left(cache)


async def test_an_entry_with_dotdot_is_refused(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image("dotdot", [layer(file("a"), file("../escape", b"x"))])
    cache, _ = cache_for(layout)
    await refused(cache, image, f'layer {image.layers[0].digest}: entry "../escape" leaves')


async def test_an_absolute_entry_is_refused(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image("absolute", [layer(file("/etc/cron.d/evil", b"x"))])
    cache, _ = cache_for(layout)
    await refused(cache, image, 'entry "/etc/cron.d/evil" is an absolute path')


@pytest.mark.parametrize("how", ["absolute", "relative"])
async def test_a_file_written_through_a_symlink_of_a_lower_layer_stays_in_the_tree(
    layout: OciLayout, cache_for: CacheFor, tmp_path: Path, how: str
) -> None:
    """Layer 1 plants `evil -> <a host directory>`, layer 2 writes `evil/planted`: legal (real
    images have such links), and umoci resolves the link inside the root."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = str(outside) if how == "absolute" else "../" * 12 + str(outside).lstrip("/")
    image = layout.add_image(
        "through", [layer(symlink("evil", target)), layer(file("evil/planted", b"pwned"))]
    )
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    assert list(outside.iterdir()) == []
    assert (tree / str(outside).lstrip("/") / "planted").read_bytes() == b"pwned"
    assert os.readlink(tree / "evil") == target  # the link itself is kept as the image has it


@pytest.mark.parametrize("target", ["/etc/passwd", "etc/../../../../etc/passwd"])
async def test_a_hard_link_to_a_host_file_is_refused(
    layout: OciLayout, cache_for: CacheFor, target: str
) -> None:
    before = os.stat("/etc/passwd")
    image = layout.add_image("hardlink", [layer(directory("etc"), hardlink("stolen", target))])
    cache, _ = cache_for(layout)
    await refused(cache, image, f'hard link "stolen" -> "{target}" points outside the root')
    after = os.stat("/etc/passwd")
    assert (after.st_ino, after.st_nlink, after.st_mtime_ns) == (
        before.st_ino,
        before.st_nlink,
        before.st_mtime_ns,
    )


async def test_a_hard_link_inside_is_the_image_s_file_not_the_host_s(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image(
        "inner-link",
        [layer(directory("etc"), file("etc/passwd", b"image\n"), hardlink("copy", "etc/passwd"))],
    )
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    assert (tree / "copy").stat().st_ino == (tree / "etc/passwd").stat().st_ino
    assert (tree / "copy").stat().st_ino != os.stat("/etc/passwd").st_ino
    assert (tree / "copy").read_bytes() == b"image\n"


async def test_no_device_node_or_fifo_is_in_the_tree(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image(
        "devices",
        [
            layer(
                directory("dev"),
                device("dev/null"),
                device("dev/mem", "char", 1, 1),
                device("dev/sda", "block", 8, 0),
                directory("run"),
                fifo("run/fifo"),
            )
        ],
    )
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    kinds = {
        path.relative_to(tree).as_posix(): stat.S_IFMT(path.lstat().st_mode)
        for path in tree.rglob("*")
    }
    assert set(kinds.values()) <= {stat.S_IFREG, stat.S_IFDIR}, kinds
    assert "run/fifo" not in kinds
    assert (tree / "dev" / "mem").stat().st_size == 0  # an empty file in its place


@pytest.mark.parametrize("layers", [1, 2], ids=["one layer", "made from a base"])
async def test_setuid_and_setgid_bits_are_stripped(
    layout: OciLayout, cache_for: CacheFor, layers: int
) -> None:
    """Also when the bits are in a base (all layers but the last, unpacked and kept as they
    are): the walk runs over the tree copied from it."""
    marked = layer(
        file("su", b"#!", mode=0o4755),
        file("wall", b"#!", mode=0o2755),
        file("both", b"#!", mode=0o6777),
        directory("shared", mode=0o2777),
    )
    extra = [layer(file("code", b"x"))] if layers == 2 else []
    image = layout.add_image("setuid", [marked, *extra])
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    modes = {name: stat.S_IMODE((tree / name).stat().st_mode) for name in ("su", "wall", "both")}
    assert modes == {"su": 0o755, "wall": 0o755, "both": 0o755}
    assert stat.S_IMODE((tree / "shared").stat().st_mode) == 0o755


async def test_file_capabilities_are_removed(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image(
        "caps", [layer(file("ping", b"#!", mode=0o755, xattrs={"security.capability": CAPABILITY}))]
    )
    cache, _ = cache_for(layout)
    tree = await cache.tree(image, owner=None)
    assert "security.capability" not in os.listxattr(tree / "ping")


async def test_a_whiteout_of_dotdot_is_refused(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image(
        "whiteout", [layer(directory("a"), file("a/b")), layer(file("a/.wh...", b""))]
    )
    cache, _ = cache_for(layout)
    await refused(cache, image, f'layer {image.layers[1].digest}: whiteout "a/.wh..." names ".."')


async def test_an_opaque_whiteout_of_the_root_is_refused(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image("opaque", [layer(directory("etc"), file("etc/x")), layer(opaque(""))])
    cache, _ = cache_for(layout)
    await refused(cache, image, 'opaque whiteout ".wh..wh..opq" would empty the root')


async def test_a_gzip_bomb_is_refused_by_its_header(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image("bomb", [layer(zeros("zeros", 200 * MiB))])
    assert image.layers[0].size < 1 * MiB  # the compressed size is not the bound
    cache, _ = cache_for(layout, max_unpacked=64 * MiB)
    await refused(cache, image, f"unpacks to more than {64 * MiB} bytes")


async def test_too_many_files_are_refused(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image(
        "many",
        [layer(*(file(f"f{n}") for n in range(30))), layer(*(file(f"g{n}") for n in range(30)))],
    )
    cache, _ = cache_for(layout, max_files=50)
    await refused(cache, image, "holds more than 50 entries")


async def test_a_blob_that_does_not_match_its_digest_is_refused(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image("tampered", [layer(file("index.html", b"original"))])
    digest = image.layers[0].digest
    blob = layout.blob_path(digest)
    altered = bytearray(blob.read_bytes())
    altered[-1] ^= 0xFF
    blob.write_bytes(bytes(altered))
    cache, _ = cache_for(layout)
    await refused(
        cache,
        image,
        f"blob {digest} does not match its digest: the {len(altered)} bytes served hash to "
        "sha256:[0-9a-f]{64}",
    )


async def test_a_truncated_blob_is_refused(layout: OciLayout, cache_for: CacheFor) -> None:
    image = layout.add_image("truncated", [layer(file("index.html", b"original" * 100))])
    digest = image.layers[0].digest
    blob = layout.blob_path(digest)
    half = blob.read_bytes()[: image.layers[0].size // 2]
    blob.write_bytes(half)
    cache, _ = cache_for(layout)
    await refused(cache, image, f"blob {digest} does not match its digest: the {len(half)} bytes")


async def test_a_blob_over_the_bound_is_refused_before_it_is_fetched(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image("large", [layer(file("big", os.urandom(64 << 10)), gzip=False)])
    cache, blobs = cache_for(layout, max_bytes=32 << 10)
    await refused(cache, image, f"blob {image.layers[0].digest} is [0-9]+ bytes, more than")
    assert image.layers[0].digest not in blobs.fetched


async def test_a_manifest_whose_layers_are_not_the_pinned_ones_is_refused(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    real = layout.add_image("two", [layer(file("a")), layer(file("b"))])
    pinned = real.model_copy(update={"layers": real.layers[:1]})
    cache, _ = cache_for(layout)
    await refused(cache, pinned, "lists 2 layers that are not the 1 the version pinned")


async def test_a_zstd_layer_is_refused_with_the_reason(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    image = layout.add_image("zstd", [layer(file("a"), gzip=False)])
    zstd = image.layers[0].model_copy(
        update={"media_type": "application/vnd.oci.image.layer.v1.tar+zstd"}
    )
    manifest = layout.blob_path(image.manifest)
    text = manifest.read_text().replace("v1.tar", "v1.tar+zstd")
    digest = layout.add_blob(text.encode())
    pinned = image.model_copy(update={"manifest": digest, "layers": [zstd]})
    cache, _ = cache_for(layout)
    await refused(cache, pinned, "is zstd-compressed .*wakeful cannot unpack zstd layers yet")


async def test_a_layer_counted_before_still_counts_toward_the_bounds(
    layout: OciLayout, cache_for: CacheFor
) -> None:
    """A layer whose headers passed for one image is not read again for the next, but its
    entries still count: two images sharing a 30-file layer, the second over 50 files."""
    shared = layer(*(file(f"f{n}") for n in range(30)))
    first = layout.add_image("first", [shared])
    second = layout.add_image("second", [shared, layer(*(file(f"g{n}") for n in range(30)))])
    assert second.layers[0].digest == first.layers[0].digest  # the same blob
    cache, _ = cache_for(layout, max_files=50)
    await cache.tree(first, owner=None)
    with pytest.raises(ImageError, match="holds more than 50 entries") as caught:
        await cache.tree(second, owner=None)
    assert str(caught.value).startswith(f"image {second.ref} layer {second.layers[1].digest}")
