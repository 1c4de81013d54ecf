"""Which builder a build uses (`wakeful.build.tools.find_builder`), and the error that names
all three when none is installed."""

from __future__ import annotations

import pytest

from wakeful.build import BuilderError, find_builder


def installed(*names: str) -> object:
    return lambda name: f"/usr/bin/{name}" if name in names else None


@pytest.mark.parametrize(
    ("chosen", "present", "found"),
    [
        pytest.param(None, ("podman", "buildah", "docker"), "podman", id="podman first"),
        pytest.param(None, ("buildah", "docker"), "buildah", id="then buildah"),
        pytest.param(None, ("docker",), "docker", id="then docker"),
        pytest.param("docker", ("podman", "docker"), "docker", id="WAKEFUL_BUILDER chooses"),
    ],
)
def test_the_builder_found(chosen: str | None, present: tuple[str, ...], found: str) -> None:
    assert find_builder(chosen, installed(*present)) == found  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("chosen", "present", "reason"),
    [
        pytest.param(None, (), "install podman, buildah or docker", id="none installed"),
        pytest.param("kaniko", ("podman",), "must be one of podman, buildah, docker", id="unknown"),
        pytest.param("buildah", ("podman",), "buildah is not installed", id="chosen, missing"),
    ],
)
def test_no_builder_is_a_clear_error(
    chosen: str | None, present: tuple[str, ...], reason: str
) -> None:
    with pytest.raises(BuilderError, match=reason):
        find_builder(chosen, installed(*present))  # type: ignore[arg-type]
