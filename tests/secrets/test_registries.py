"""Registries' logins (wakeful/secrets/registries.py), a contract on memory, SQLite and etcd:
a login's password is sealed bound to its host and listed never; a login copied under
another host's key does not open; a refused login writes nothing and never quotes the
password; the same keys seal logins as apps' secrets, so a rotation seals them again, a
retire waits for them and a control plane missing their key does not start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from wakeful.domain import keys
from wakeful.domain.models import MAX_PASSWORD_BYTES, RegistryLogin
from wakeful.oci import Credentials, LoginUnusable
from wakeful.secrets.book import SecretBook
from wakeful.secrets.errors import ChangeRefused, KeyRefused, MissingKey, SealError
from wakeful.secrets.keys import KeyRing
from wakeful.secrets.registries import Login, RegistryBook, read_login
from wakeful.secrets.rotation import reseal
from wakeful.store import Store

pytestmark = pytest.mark.anyio
HOST = "registry.example.com:5000"
PASSWORD = "correct-horse-battery-staple"


async def books(store: Store, directory: Path) -> tuple[RegistryBook, SecretBook]:
    ring = KeyRing(store, directory)
    await ring.start()
    return RegistryBook(store, ring, clock=lambda: 1000.0), SecretBook(store, ring)


async def test_a_login_is_sealed_bound_to_its_host_and_listed_without_its_password(
    store: Store, tmp_path: Path
) -> None:
    registries, _ = await books(store, tmp_path / "keys")
    done = await registries.login("Registry.Example.com:5000", Login("ci", PASSWORD), by="admin")
    assert (done.host, done.username, done.set_by, done.changed) == (HOST, "ci", "admin", True)
    found = await store.get(keys.registry(HOST), RegistryLogin)
    assert found is not None and found.value.password.startswith(f"v1:{done.key_id}:")
    assert PASSWORD not in found.value.model_dump_json()
    assert PASSWORD not in repr(await registries.listing())
    assert [(e.host, e.username) for e in await registries.listing()] == [(HOST, "ci")]
    # At deploy, the reference's domain (as typed) finds it; another registry has none.
    assert await registries.credentials("REGISTRY.example.com:5000") == Credentials("ci", PASSWORD)
    assert await registries.credentials("registry.example.com") is None  # another port
    again = await registries.login(HOST, Login("ci", PASSWORD), by="admin")
    assert not again.changed
    kept = await store.get(keys.registry(HOST), RegistryLogin)
    assert kept is not None and kept.revision == found.revision  # nothing written
    await registries.login(HOST, Login("ci", "a-new-one"), by="admin")
    assert await registries.credentials(HOST) == Credentials("ci", "a-new-one")


async def test_a_login_copied_under_another_hosts_key_does_not_open(
    store: Store, tmp_path: Path
) -> None:
    registries, _ = await books(store, tmp_path / "keys")
    await registries.login(HOST, Login("ci", PASSWORD), by="admin")
    found = await store.get(keys.registry(HOST), RegistryLogin)
    assert found is not None
    elsewhere = "attacker.example.com"
    await store.put(keys.registry(elsewhere), found.value.model_copy(update={"host": elsewhere}))
    with pytest.raises(LoginUnusable) as refused:
        await registries.credentials(elsewhere)
    assert f"the login for registry {elsewhere} does not open" in str(refused.value)
    assert PASSWORD not in str(refused.value)
    with pytest.raises(SealError):  # nor as an app's secret, which a node is handed
        registries._ring.open("web", "A", found.value.password)


@pytest.mark.parametrize(
    ("host", "body", "said"),
    [
        pytest.param("https://r.example.com", None, "host: 'https://r.example.com' is", id="url"),
        pytest.param("r.example.com/team", None, "is a URL or a path", id="a repository"),
        pytest.param("r_1.example.com", None, "is not a registry host", id="underscore"),
        pytest.param("r.example.com:70000", None, "has port 70000, outside", id="port"),
        pytest.param("[::1]:5000", None, "is an IPv6 address", id="ipv6"),
        pytest.param(HOST, [PASSWORD], "the body must be a JSON object", id="not an object"),
        pytest.param(HOST, {"username": "ci"}, "password: must be a string, not null", id="none"),
        pytest.param(HOST, {"password": PASSWORD}, "username: must be a string", id="no user"),
        pytest.param(HOST, {"username": "a:b", "password": PASSWORD}, "holds ':'", id="user :"),
        pytest.param(HOST, {"username": "ci", "password": ""}, "the password is empty", id="empty"),
        pytest.param(
            HOST,
            {"username": "ci", "password": PASSWORD + "x" * MAX_PASSWORD_BYTES},
            f"password: the password is {len(PASSWORD) + MAX_PASSWORD_BYTES} bytes",
            id="too long",
        ),
        pytest.param(
            HOST, {"username": "ci", "password": PASSWORD, PASSWORD: 1}, "1 field(s) other than",
            id="a stray field",
        ),
    ],
)  # fmt: skip
async def test_a_refused_login_names_the_field_never_the_password_and_writes_nothing(
    store: Store, tmp_path: Path, host: str, body: object, said: str
) -> None:
    registries, _ = await books(store, tmp_path / "keys")

    async def attempt() -> None:
        login = read_login({"username": "ci", "password": PASSWORD} if body is None else body)
        await registries.login(host, login, by="admin")

    with pytest.raises(ChangeRefused) as refused:
        await attempt()
    assert refused.value.kind == "invalid"
    assert said in str(refused.value) and PASSWORD not in str(refused.value)
    assert (await store.list(keys.REGISTRIES, RegistryLogin)).items == []


async def test_a_logout_forgets_the_login_and_an_unknown_host_is_refused(
    store: Store, tmp_path: Path
) -> None:
    registries, _ = await books(store, tmp_path / "keys")
    await registries.login("docker.io", Login("me", PASSWORD), by="admin")
    assert await registries.logout("index.docker.io") == "docker.io"  # docker's own alias
    assert await registries.credentials("docker.io") is None
    with pytest.raises(ChangeRefused, match=r"no login for registry docker\.io") as refused:
        await registries.logout("docker.io")
    assert refused.value.kind == "unknown"


async def test_a_rotation_seals_logins_again_and_a_retire_waits_for_them(
    store: Store, tmp_path: Path
) -> None:
    registries, secrets = await books(store, tmp_path / "keys")
    first = (await registries.login(HOST, Login("ci", PASSWORD), by="admin")).key_id
    second, previous = await secrets.ring.rotate()  # the key alone: nothing sealed again yet
    assert previous == first
    with pytest.raises(KeyRefused, match=re.escape(f"of registry {HOST} are still")):
        await secrets.ring.retire(first)
    done = await reseal(store, secrets.ring)
    assert (done.records, done.values, done.logins) == (0, 0, 1)
    found = await store.get(keys.registry(HOST), RegistryLogin)
    assert found is not None and found.value.key_id == second
    assert found.value.set_at == 1000.0  # set when it was, by whom it was
    await secrets.ring.retire(first)
    assert await registries.credentials(HOST) == Credentials("ci", PASSWORD)
    rotated = await secrets.rotate_key()
    assert (rotated.previous, rotated.logins) == (second, 1)


async def test_a_control_plane_missing_the_key_a_login_is_sealed_under_does_not_start(
    store: Store, tmp_path: Path
) -> None:
    directory = tmp_path / "keys"
    registries, secrets = await books(store, directory)
    first = (await registries.login(HOST, Login("ci", PASSWORD), by="admin")).key_id
    await secrets.ring.rotate()  # current now; the login is still under the first
    (directory / f"{first}.key").unlink()
    with pytest.raises(MissingKey) as refused:
        await KeyRing(store, directory).start()
    said = str(refused.value)
    assert refused.value.key_id == first
    assert f"the login for registry {HOST} is sealed under it" in said and PASSWORD not in said
