from __future__ import annotations

import pytest

from tests.support import podman


@pytest.fixture(scope="session")
def wakeful_image() -> str:
    """wakeful's image, built from the repository's Dockerfile on the local base image (and
    the infra image beside it, for the compose test)."""
    reason = podman.usable()
    if reason is not None:
        pytest.skip(reason)
    podman.base_image()
    podman.build_images()
    return podman.IMAGE
