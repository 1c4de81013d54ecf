from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.oci.layouts import Layout
from tests.support.registry import Registry, running_registry
from wakeful.oci import ImageStore


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    """A plain-HTTP registry on loopback, of this test alone."""
    with running_registry(tmp_path / "registry") as started:
        yield started


@pytest.fixture
def source(tmp_path: Path) -> Layout:
    """A layout to write test images into before pushing them."""
    return Layout(tmp_path / "source")


@pytest.fixture
def images(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "artifacts" / "images", timeout=60)
