"""Registry logins held by the control plane (wakeful/secrets/registries.py) against Debian's
docker-registry with TLS from a CA the test makes and htpasswd logins, over the control API:
a deploy of a private image is refused until an admin logs the control plane in, pulls with
the login then, is refused with the registry's answer for a wrong password and again after a
logout; the password is in no store value, log line, answer, metric or backup; a node's
token is refused every registry route."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.oci.layouts import Layout, layer
from tests.support.control import running_control_plane
from tests.support.registry import Registry, running_registry
from wakeful.deploy.appdir import image_definition
from wakeful.domain import keys
from wakeful.domain.models import ImageRecord, RegistryLogin, Version
from wakeful.store.backup import backup
from wakeful.store.base import StoreBase

pytestmark = pytest.mark.anyio

USER, PASSWORD = "deployer", "correct-horse-battery-staple"
WRONG = "not-the-password-1234"


@pytest.fixture
def secure(tmp_path: Path) -> Iterator[Registry]:
    with running_registry(tmp_path / "registry", tls=True, users={USER: PASSWORD}) as started:
        yield started


async def test_a_login_pulls_a_private_image_at_deploy_and_is_kept_from_everything_else(
    secure: Registry, source: Layout, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    ref = secure.push(source.tag("v", source.image([layer({"a": b"private"})])), "team/shop:1")
    definition = image_definition(ref, "shop", 8080).model_dump(mode="json")
    deploy = {"definition": definition}
    answers: list[str] = []
    async with (
        running_control_plane(
            tmp_path / "plane", registry_ca=secure.ca, image_platform="linux/amd64"
        ) as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as http,
    ):

        async def call(method: str, path: str, **kwargs: object) -> httpx.Response:
            answer = await http.request(method, path, **kwargs)  # type: ignore[arg-type]
            answers.append(answer.text)
            return answer

        refused = await call("POST", "/v1/deploys", json=deploy)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == "image not pulled"
        assert "authentication required" in refused.json()["detail"]

        login = {"username": USER, "password": PASSWORD}
        done = await call("PUT", f"/v1/registries/{secure.address}", json=login)
        assert done.status_code == 200, done.text
        assert done.json()["host"] == secure.address and done.json()["changed"] is True
        listed = await call("GET", "/v1/registries")
        assert [(e["host"], e["username"]) for e in listed.json()] == [(secure.address, USER)]
        deployed = await call("POST", "/v1/deploys", json=deploy)
        assert deployed.status_code == 202, deployed.text
        version = await running.store.get(keys.version("shop", "v1"), Version)
        assert version is not None and isinstance(version.value.image, ImageRecord)
        pulled = version.value.image.layers
        assert all(running.plane.images.store.has(entry.digest) for entry in pulled)

        wrong = {"username": USER, "password": WRONG}
        assert (await call("PUT", f"/v1/registries/{secure.address}", json=wrong)).is_success
        denied = await call("POST", "/v1/deploys", json=deploy)
        assert denied.status_code == 400 and denied.json()["error"] == "image not pulled"
        assert "unauthorized" in denied.json()["detail"] and WRONG not in denied.text

        gone = await call("DELETE", f"/v1/registries/{secure.address}")
        assert gone.status_code == 200 and gone.json() == {"host": secure.address}
        again = await call("POST", "/v1/deploys", json=deploy)
        assert again.status_code == 400 and "authentication required" in again.json()["detail"]
        assert (await call("DELETE", f"/v1/registries/{secure.address}")).status_code == 404

        # Logged in once more, then looked for everywhere a password could leak to.
        assert (await call("PUT", f"/v1/registries/{secure.address}", json=login)).is_success
        assert (await call("GET", "/metrics")).is_success
        assert isinstance(running.store, StoreBase)
        rows, _ = await running.store._list("")
        assert keys.registry(secure.address) in [key for key, _, _ in rows]
        stored = b"".join(data for _, data, _ in rows)
        kept = await running.store.get(keys.registry(secure.address), RegistryLogin)
        assert kept is not None and kept.value.password.startswith("v1:")
        await backup(running.store, tmp_path / "backup.jsonl")
        saved = (tmp_path / "backup.jsonl").read_bytes()
    for secret in (PASSWORD, WRONG):
        assert secret.encode() not in stored and secret.encode() not in saved
        assert not [text for text in answers if secret in text]
        assert secret not in caplog.text
    assert f"registry login for {secure.address} set: user {USER}" in caplog.text


async def test_a_node_token_is_refused_every_registry_route(tmp_path: Path) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        admin = {"Authorization": f"Bearer {running.token}"}
        made = await http.post("/v1/tokens", json={"name": "n1", "role": "node"}, headers=admin)
        node = {"Authorization": f"Bearer {made.json()['secret']}"}
        login = {"username": USER, "password": PASSWORD}
        first = await http.put("/v1/registries/r.example.com", json=login, headers=admin)
        assert first.is_success
        for method, body in (("GET", None), ("PUT", login), ("DELETE", None)):
            path = "/v1/registries" if method == "GET" else "/v1/registries/r.example.com"
            answer = await http.request(method, path, json=body, headers=node)
            assert answer.status_code == 403, (method, answer.text)
            assert PASSWORD not in answer.text and USER not in answer.text
        assert len((await http.get("/v1/registries", headers=admin)).json()) == 1


async def test_a_bad_host_or_body_is_a_4xx_naming_the_field_and_writes_nothing(
    tmp_path: Path,
) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as http,
    ):
        for path, body, status, said in [
            ("/v1/registries/r_1.example.com", {"username": USER, "password": PASSWORD}, 422,
             "host: 'r_1.example.com' is not a registry host"),
            ("/v1/registries/r.example.com:0", {"username": USER, "password": PASSWORD}, 422,
             "has port 0, outside 1 to 65535"),
            ("/v1/registries/r.example.com", {"username": USER, "password": 7}, 422,
             "password: must be a string, not a number"),
            ("/v1/registries/r.example.com", {"user": USER, "password": PASSWORD}, 422,
             "1 field(s) other than username and password"),
            ("/v1/registries/r.example.com", {"username": USER, "password": "x" * 20000}, 422,
             "password: the password is 20000 bytes"),
        ]:  # fmt: skip
            answer = await http.put(path, json=body)
            assert answer.status_code == status, answer.text
            assert answer.json()["error"] == "invalid login" and said in answer.json()["detail"]
            assert PASSWORD not in answer.text and "x" * 100 not in answer.text
        text = await http.put("/v1/registries/r.example.com", content=b"{" + PASSWORD.encode())
        assert text.status_code == 422 and PASSWORD not in text.text
        assert (await http.get("/v1/registries")).json() == []
        assert (await running.store.list(keys.REGISTRIES, RegistryLogin)).items == []
