"""A deploy warms the node's image cache: new versions' images, not what was there before."""

from __future__ import annotations

import anyio
import pytest

from tests.support.waiting import eventually
from wakeful.domain.models import AppSpec, ImageRecord, Version
from wakeful.node.images import ImageError
from wakeful.node.images.warming import QUEUED, Warming
from wakeful.store import Item

pytestmark = pytest.mark.anyio
DIGEST = "sha256:" + "cd" * 32
IMAGE = ImageRecord(ref="shop:1", digest=DIGEST, manifest=DIGEST, config_digest=DIGEST, layers=[])


def item(app: str, version: str, image: ImageRecord | None = IMAGE) -> Item[Version]:
    spec = AppSpec(image="shop:1") if image else AppSpec(command=["x"])
    value = Version(app=app, version=version, spec=spec, image=image)
    return Item(f"versions/{app}/{version}", value, 1)


async def test_new_versions_with_an_image_are_warmed_and_nothing_listed_before() -> None:
    warmed: list[tuple[str, str]] = []

    async def warm(image: ImageRecord, app: str) -> None:
        warmed.append((app, image.ref))

    warming = Warming(warm)
    warming.put(item("early", "v1"))  # before the first listing: not a deploy of now
    warming.replace([item("old", "v1")], 5)
    warming.put(item("shop", "v2"))
    warming.put(item("plain", "v1", image=None))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(warming.run)
        await eventually(lambda: warming.warmed)
        tasks.cancel_scope.cancel()
    assert warmed == [("shop", "shop:1")]
    assert list(warming.warmed) == ["shop/v2"]


async def test_a_failed_warming_is_left_to_the_start_and_a_burst_keeps_the_newest() -> None:
    async def warm(image: ImageRecord, app: str) -> None:
        if app == "bad":
            raise ImageError("image shop:1: no such blob")

    warming = Warming(warm)
    warming.replace([], 1)
    warming.put(item("bad", "v1"))
    for number in range(QUEUED + 2):
        warming.put(item("shop", f"v{number}"))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(warming.run)
        await eventually(lambda: len(warming.warmed) >= QUEUED)
        tasks.cancel_scope.cancel()
    assert list(warming.warmed) == [f"shop/v{n}" for n in range(2, QUEUED + 2)]
