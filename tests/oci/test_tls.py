"""A registry off loopback's plain-HTTP allowance: HTTPS with a CA of the test's own, and
htpasswd logins. Credentials reach skopeo only through a private auth file."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.oci.layouts import Layout, layer
from tests.support.registry import Registry, running_registry
from wakeful.oci import Credentials, ImageStore, RegistryAccess, RegistryError, SkopeoMissing

pytestmark = pytest.mark.anyio

USER, PASSWORD = "deployer", "correct-horse-battery-staple"


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry", tls=True, users={USER: PASSWORD}) as started:
        yield started


@pytest.fixture
def pushed(secure: Registry, source: Layout) -> str:
    return secure.push(source.tag("v", source.image([layer({"a": b"tls"})])), "private/shop:1")


def verifying(tmp_path: Path, ca: Path | None) -> ImageStore:
    """A store that treats the loopback registry as a remote one: verified TLS."""
    return ImageStore(
        tmp_path / "images", access=RegistryAccess(ca=ca, verify_loopback=True), timeout=60
    )


async def test_the_ca_and_a_login_pull_a_private_image(
    secure: Registry, pushed: str, tmp_path: Path
) -> None:
    images = verifying(tmp_path, secure.ca)
    record = await images.import_image(pushed, credentials=Credentials(USER, PASSWORD))
    assert all(images.has(entry.digest) for entry in record.layers)


async def test_a_wrong_password_is_a_clear_error_without_the_password(
    secure: Registry, pushed: str, tmp_path: Path
) -> None:
    images = verifying(tmp_path, secure.ca)
    wrong = "not-the-password-1234"
    with pytest.raises(
        RegistryError, match=r"^pulling .*private/shop:1: .*(unauthorized|authentication required)"
    ) as err:
        await images.import_image(pushed, credentials=Credentials(USER, wrong))
    assert wrong not in str(err.value) and PASSWORD not in str(err.value)
    assert wrong not in repr(Credentials(USER, wrong))
    with pytest.raises(RegistryError, match="authentication required"):
        await images.import_image(pushed)  # no login at all


async def test_a_registry_certificate_from_an_unknown_ca_is_refused(
    secure: Registry, pushed: str, tmp_path: Path
) -> None:
    images = verifying(tmp_path, None)
    with pytest.raises(RegistryError, match=r"certificate signed by unknown authority"):
        await images.import_image(pushed, credentials=Credentials(USER, PASSWORD))


async def test_credentials_and_the_ca_reach_skopeo_as_private_files_never_in_argv(
    tmp_path: Path,
) -> None:
    """A stand-in skopeo records its argv, its environment and what its files hold."""
    seen = tmp_path / "seen"
    fake = tmp_path / "skopeo"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "argv $*" >> {seen}\n'
        f'echo "home $HOME" >> {seen}\n'
        "for arg; do case $arg in --authfile=*|--src-authfile=*) f=${arg#*=};\n"
        f'  echo "authfile $(stat -c %a "$f") $(cat "$f")" >> {seen};; esac; done\n'
        "for arg; do case $arg in --cert-dir=*|--src-cert-dir=*) d=${arg#*=};\n"
        f'  echo "certs $(stat -c %a "$d") $(ls "$d")" >> {seen};; esac; done\n'
        "echo 'level=fatal msg=\"stand-in\"' >&2; exit 1\n"
    )
    fake.chmod(0o755)
    ca = tmp_path / "registry-ca.pem"
    ca.write_text("not checked by the stand-in\n")
    access = RegistryAccess(ca=ca, skopeo=str(fake))
    images = ImageStore(tmp_path / "images", access=access)
    with pytest.raises(RegistryError, match=r"^pulling registry\.example\.com/shop:1: stand-in$"):
        await images.import_image(
            "registry.example.com/shop:1", credentials=Credentials(USER, PASSWORD)
        )
    lines = seen.read_text().splitlines()
    argv = next(line for line in lines if line.startswith("argv "))
    assert PASSWORD not in argv
    assert "--tls-verify=true" in argv
    assert "registry.example.com" in argv
    authfile = next(line for line in lines if line.startswith("authfile "))
    assert authfile.startswith("authfile 600 ")
    assert '"registry.example.com"' in authfile
    assert next(line for line in lines if line.startswith("certs ")) == "certs 700 ca.crt"
    home = Path(next(line for line in lines if line.startswith("home ")).split(" ", 1)[1])
    assert home.parent == images.directory / ".tmp"
    assert not await anyio.Path(
        home
    ).exists()  # the session directory is gone, the auth file with it
    assert stat.S_IMODE(os.stat(images.directory / ".tmp").st_mode) == 0o700


async def test_a_missing_skopeo_says_to_install_it(tmp_path: Path) -> None:
    images = ImageStore(tmp_path / "images", access=RegistryAccess(skopeo="no-skopeo-here"))
    with pytest.raises(SkopeoMissing, match=r"install Debian's skopeo"):
        await images.import_image("registry.example.com/shop:1")
