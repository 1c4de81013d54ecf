"""A hostile image is refused at deploy, naming its reason: the control plane reads every
layer's headers after the copy, with the rules a node applies again before it unpacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.images import BUSYBOX_CONFIG, OciLayout, busybox_layers, file, layer, zeros
from wakeful.oci import ImageRefused, ImageStore

pytestmark = pytest.mark.anyio


def archive(tmp_path: Path, name: str, extra: list[object]) -> Path:
    layout = OciLayout(tmp_path / "layout")
    layout.add_image(name, [*busybox_layers(), *extra], BUSYBOX_CONFIG)  # type: ignore[list-item]
    target = tmp_path / f"{name}.tar"
    subprocess.run(
        ["skopeo", "copy", "-q", f"oci:{layout.path}:{name}", f"oci-archive:{target}"], check=True
    )
    return target


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ([layer(file("../../etc/cron.d/x", b"x"))], 'entry "../../etc/cron.d/x" leaves the root'),
        ([layer(zeros("bomb", 64 << 20))], "unpacks to more than"),
    ],
    ids=["dotdot entry", "compression bomb"],
)
async def test_a_hostile_layer_is_refused_at_import_naming_the_image_and_the_layer(
    tmp_path: Path, extra: list[object], reason: str
) -> None:
    images = ImageStore(tmp_path / "images", timeout=60, max_unpacked=32 << 20)
    path = archive(tmp_path, "hostile", extra)
    with pytest.raises(ImageRefused, match=r"image oci-archive:hostile.tar layer sha256:") as found:
        await images.import_image("oci-archive:hostile.tar", archive=path)
    assert reason in str(found.value)


async def test_a_well_formed_image_passes_the_same_reading(tmp_path: Path) -> None:
    images = ImageStore(tmp_path / "images", timeout=60, max_unpacked=32 << 20)
    path = archive(tmp_path, "fine", [layer(zeros("data", 1 << 20))])
    record = await images.import_image("oci-archive:fine.tar", archive=path)
    assert len(record.layers) == 3
