"""The image store's side of the collector: blobs no record references go once their grace
period has passed; referenced or recently claimed ones stay, and index.json follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.oci.layouts import Layout, layer
from tests.support.registry import Registry
from wakeful.oci import ImageStore, referenced_blobs
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


def image(source: Layout, own: bytes) -> dict:
    return source.image([layer({"base": b"shared base" * 100}), layer({"own": own})])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=10_000.0)


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> ImageStore:
    return ImageStore(tmp_path / "images", timeout=60, clock=clock)


def names(store: ImageStore) -> list[str]:
    index = json.loads((store.directory / "index.json").read_text())
    return sorted(
        entry["annotations"]["org.opencontainers.image.ref.name"] for entry in index["manifests"]
    )


async def test_unreferenced_blobs_go_after_the_grace_period_and_referenced_ones_stay(
    registry: Registry, source: Layout, store: ImageStore, clock: ManualClock
) -> None:
    kept = await store.import_image(registry.push(source.tag("a", image(source, b"a")), "shop:a"))
    dropped = await store.import_image(
        registry.push(source.tag("b", image(source, b"b")), "shop:b")
    )
    everything = {digest for digest, _ in await store.stored()}
    assert everything == referenced_blobs([kept, dropped])
    assert {when for _, when in await store.stored()} == {10_000.0}

    # Within the grace period nothing goes, referenced or not.
    assert await store.remove_unreferenced(set(), before=10_000.0) == []

    removed = await store.remove_unreferenced(referenced_blobs([kept]), before=10_001.0)
    assert set(removed) == referenced_blobs([dropped]) - referenced_blobs([kept])
    assert {digest for digest, _ in await store.stored()} == referenced_blobs([kept])
    assert names(store) == [kept.digest.removeprefix("sha256:")]
    assert await store.keep(kept)
    assert not await store.keep(dropped)

    # What stayed is whole: importing it again downloads no layer.
    gets = registry.blob_gets()
    assert await store.import_image(registry.ref("shop:a")) == kept
    assert registry.blob_gets() - gets == 1  # its config: skopeo reads it on every copy


async def test_a_claim_restarts_the_grace_period(
    registry: Registry, source: Layout, store: ImageStore, clock: ManualClock
) -> None:
    record = await store.import_image(registry.push(source.tag("a", image(source, b"a")), "shop:a"))
    clock.advance(3_600)
    assert await store.keep(record)
    assert await store.remove_unreferenced(set(), before=10_000.0 + 1_800) == []
    assert set(await store.remove_unreferenced(set(), before=clock.now + 1)) == referenced_blobs(
        [record]
    )
    assert names(store) == []
    assert not store.has(record.manifest)
