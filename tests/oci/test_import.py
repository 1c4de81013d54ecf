"""Importing images from a real registry (Debian's docker-registry on loopback) and from
archives into the control plane's image store, with skopeo."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import anyio
import pytest

from tests.oci.layouts import OCI_MANIFEST, Layout, copy, descriptor, layer
from tests.support.registry import Registry
from wakeful.domain.models import ImageRecord
from wakeful.oci import BlobMissing, ImageRefused, ImageStore, RegistryError
from wakeful.oci.resolve import DOCKER_MANIFEST

pytestmark = pytest.mark.anyio

RUN = {
    "Entrypoint": ["/bin/app"],
    "Cmd": ["--port", "8080"],
    "Env": ["PATH=/bin", "MODE=test"],
    "WorkingDir": "/srv",
    "User": "1000:1000",
    "ExposedPorts": {"8080/tcp": {}},
}


def app_image(source: Layout, version: bytes = b"1", platform: str = "linux/amd64") -> dict:
    """Two layers: a base every version shares, and the version's own."""
    base = layer({"bin/app": b"#!/bin/sh\necho app\n" * 50})
    return source.image([base, layer({"srv/version": version})], platform=platform, config=RUN)


async def test_a_tag_is_pinned_and_a_later_push_changes_nothing_pinned(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    ref = registry.push(source.tag("v", app_image(source, b"1")), "shop:1.4")
    first = await images.import_image(ref)
    assert first.ref == ref
    assert first.digest == first.manifest  # an OCI image is stored as it was
    assert first.platform == "linux/amd64"
    assert [(entry.media_type, entry.size > 0) for entry in first.layers] == [
        ("application/vnd.oci.image.layer.v1.tar+gzip", True)
    ] * 2
    config = first.config
    assert (config.entrypoint, config.cmd, config.env) == (
        RUN["Entrypoint"],
        RUN["Cmd"],
        RUN["Env"],
    )
    assert (config.working_dir, config.user, config.exposed_ports) == (
        "/srv",
        "1000:1000",
        ["8080/tcp"],
    )

    registry.push(source.tag("v", app_image(source, b"2")), "shop:1.4")
    moved = await images.import_image(ref)
    assert moved.digest != first.digest
    pinned = await images.import_image(f"{registry.ref('shop')}@{first.digest}")
    assert (pinned.digest, pinned.manifest, pinned.layers) == (
        first.digest,
        first.manifest,
        first.layers,
    )


async def test_an_index_gives_the_node_platform(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    amd64 = app_image(source, b"amd64")
    arm64 = source.image([layer({"arm": b"arm64 only"})], platform="linux/arm64")
    ref = registry.push(source.tag("multi", source.index([arm64, amd64])), "shop:multi", all=True)
    record = await images.import_image(ref)
    assert record.platform == "linux/amd64"
    assert record.manifest == amd64["digest"]
    assert record.digest != record.manifest  # the index's digest, as the tag named it
    arm_layer = json.loads(source.read(arm64["digest"]))["layers"][0]["digest"]
    assert registry.blob_gets(arm_layer) == 0
    assert not images.has(arm_layer)


async def test_an_index_without_the_node_platform_is_refused_naming_its_platforms(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    arm64 = source.image([layer({"a": b"arm"})], platform="linux/arm64")
    s390x = source.image([layer({"s": b"s390x"})], platform="linux/s390x")
    ref = registry.push(source.tag("multi", source.index([s390x, arm64])), "shop:multi", all=True)
    with pytest.raises(
        ImageRefused, match=r"has no linux/amd64 image; it has linux/arm64, linux/s390x$"
    ):
        await images.import_image(ref)
    assert registry.blob_gets() == 0
    assert await images.stored() == []


async def test_ten_thousand_layers_are_refused_before_any_blob_is_copied(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    """One real layer named 10,000 times: the registry holds the manifest (every blob it
    names exists), the import refuses it having read nothing but the manifest."""
    registry.push(source.tag("v", app_image(source)), "shop:small")
    small = json.loads(source.read(app_image(source)["digest"]))
    manifest = {**small, "layers": [small["layers"][0]] * 10_000}
    registry.put_manifest("shop", "huge", json.dumps(manifest).encode(), OCI_MANIFEST)
    gets = registry.blob_gets()
    with pytest.raises(ImageRefused, match=r"has 10000 layers; the bound is 128$"):
        await images.import_image(registry.ref("shop:huge"))
    assert registry.blob_gets() == gets
    assert await images.stored() == []


async def test_an_image_over_the_size_bound_is_refused_before_any_blob_is_copied(
    registry: Registry, source: Layout, tmp_path: Path
) -> None:
    ref = registry.push(source.tag("v", app_image(source)), "shop:1")
    images = ImageStore(tmp_path / "images", max_image_bytes=100)
    with pytest.raises(
        ImageRefused, match=r"bytes compressed; the bound is 100 \(WAKEFUL_IMAGE_MAX_BYTES\)"
    ):
        await images.import_image(ref)
    assert registry.blob_gets() == 0


async def test_a_blob_that_does_not_match_its_digest_fails_the_import(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    image = app_image(source)
    ref = registry.push(source.tag("v", image), "shop:1")
    version_layer = json.loads(source.read(image["digest"]))["layers"][1]["digest"]
    stored = registry.blob_file(version_layer)
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes
    stored.write_bytes(bytes(data))
    with pytest.raises(RegistryError, match=r"^pulling .*shop:1: .*[Dd]igest did not match") as err:
        await images.import_image(ref)
    assert "\n" not in str(err.value)
    assert not images.has(version_layer)


async def test_a_docker_v2s2_image_is_stored_as_oci(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    ref = registry.push(source.tag("v", app_image(source)), "shop:docker", format="v2s2")
    record = await images.import_image(ref)
    assert record.digest != record.manifest
    stored = json.loads(images.blob_path(record.manifest).read_bytes())
    assert stored["mediaType"] == OCI_MANIFEST
    assert registry.manifest_digest("shop", "docker", DOCKER_MANIFEST) == record.digest
    assert record.config.entrypoint == RUN["Entrypoint"]


async def test_a_second_import_downloads_only_layers_the_store_lacks(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    first_ref = registry.push(source.tag("v", app_image(source, b"1")), "shop:1")
    second_ref = registry.push(source.tag("v", app_image(source, b"2")), "shop:2")
    first = await images.import_image(first_ref)
    again = await images.import_image(first_ref)
    assert again == first
    assert [registry.blob_gets(entry.digest) for entry in first.layers] == [1, 1]
    second = await images.import_image(second_ref)
    base, own = second.layers
    assert base == first.layers[0]
    assert (registry.blob_gets(base.digest), registry.blob_gets(own.digest)) == (1, 1)


@pytest.mark.parametrize("transport", ["oci-archive", "docker-archive"])
async def test_an_archive_imports_with_no_registry(
    source: Layout, images: ImageStore, tmp_path: Path, transport: str
) -> None:
    archive = tmp_path / "app dir" / "shop.tar"
    archive.parent.mkdir()
    tag = source.tag("v", app_image(source))
    target = f"{transport}:{archive}" + (":shop:1" if transport == "docker-archive" else "")
    copy(tag, target)
    record = await images.import_image(f"{transport}:shop.tar", archive=archive)
    assert record.ref == f"{transport}:shop.tar"
    assert record.config.entrypoint == RUN["Entrypoint"]
    assert len(record.layers) == 2
    assert all(images.has(entry.digest) for entry in record.layers)
    if transport == "oci-archive":
        assert record.digest == record.manifest


async def test_a_multi_platform_archive_gives_the_node_platform(
    source: Layout, images: ImageStore, tmp_path: Path
) -> None:
    amd64 = app_image(source, b"amd64")
    arm64 = source.image([layer({"arm": b"arm64 only"})], platform="linux/arm64")
    tag = source.tag("multi", source.index([arm64, amd64]))
    archive = tmp_path / "multi.tar"
    copy(tag, f"oci-archive:{archive}", all=True)
    record = await images.import_image("oci-archive:multi.tar", archive=archive)
    assert (record.manifest, record.platform) == (amd64["digest"], "linux/amd64")


async def test_stored_files_are_private_and_served_by_digest(
    registry: Registry, source: Layout, images: ImageStore
) -> None:
    record = await images.import_image(registry.push(source.tag("v", app_image(source)), "shop:1"))
    for path in images.directory.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    blob = record.layers[0].digest
    chunks = [chunk async for chunk in images.chunks(blob, size=100)]
    assert b"".join(chunks) == images.blob_path(blob).read_bytes()
    assert len(chunks) > 1
    assert descriptor("", b"".join(chunks))["digest"] == blob
    with pytest.raises(ValueError, match="is not sha256"):
        images.blob_path("sha256:../../../etc/passwd")
    assert not images.has("sha256:../../../etc/passwd")
    with pytest.raises(BlobMissing):
        [chunk async for chunk in images.chunks("sha256:" + "0" * 64)]


async def test_two_stores_on_one_directory_import_at_once(
    registry: Registry, source: Layout, tmp_path: Path
) -> None:
    """Two control-plane processes share the directory: the file lock serialises their
    copies, so neither loses the other's index.json entry."""
    refs = [
        registry.push(source.tag(name, app_image(source, name.encode())), f"shop:{name}")
        for name in ("a", "b", "c", "d")
    ]
    stores = [ImageStore(tmp_path / "shared") for _ in range(2)]
    records: dict[str, ImageRecord] = {}

    async def run(store: ImageStore, ref: str) -> None:
        records[ref] = await store.import_image(ref)

    async with anyio.create_task_group() as group:
        for n, ref in enumerate(refs):
            group.start_soon(run, stores[n % 2], ref)
    index = json.loads((tmp_path / "shared" / "index.json").read_text())
    assert {entry["digest"] for entry in index["manifests"]} == {
        record.manifest for record in records.values()
    }
    assert len(records) == 4
