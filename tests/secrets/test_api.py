"""The secrets routes of the control API (wakeful/secrets/api.py), over real HTTP to the whole
control plane: an admin sets, unsets and lists, and never reads a value back; a node token
reads the values of a sandbox the control plane placed on it and it is starting, and nothing
else (not one it wrote itself); no refusal, answer or log line
quotes a value; a deploy whose env sets a secret's name is refused naming both; deleting an
app takes its secrets; a key the store needs and the directory lacks stops the start."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.control import running_control_plane
from tests.support.placing import put_placed
from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.aio.packing import pack
from wakeful.deploy.appdir import load_app_dir
from wakeful.domain import keys
from wakeful.domain.artifacts import digest_of
from wakeful.domain.models import (
    App,
    AppSecrets,
    AppSpec,
    Role,
    Sandbox,
    SandboxStatus,
    Token,
    Version,
)
from wakeful.secrets.api import secrets_router
from wakeful.secrets.book import SecretBook
from wakeful.secrets.errors import MissingKey
from wakeful.secrets.keys import KeyRing
from wakeful.store import Item, Store, open_store
from wakeful.store.tokenbook import TokenBook, digest, new_id

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"
PASSWORD = "pa55-w0rd-never-echoed"


ADMIN, N1, N2 = "admin-secret", "n1-secret", "n2-secret"


@dataclass
class Control:
    store: Store
    ring: KeyRing
    http: httpx.AsyncClient

    async def call(
        self, method: str, path: str, token: str = ADMIN, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return await self.http.request(method, path, headers=headers, **kwargs)


def token_book(tokens: dict[str, tuple[str, Role]]) -> TokenBook:
    """Tokens named as a node's are (`TokenBook.of` names them t0, t1, ...)."""
    book = TokenBook()
    records = [
        Token(name=name, role=role, id=new_id(), sha256=digest(secret))
        for secret, (name, role) in tokens.items()
    ]
    book.replace([Item(keys.token(t.name), t, 1) for t in records], 1)
    return book


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[Control]:
    """The control API with the secrets routes alone: no pool controller to sweep the
    sandbox records the tests write."""
    async with open_store("memory://") as store:
        ring = KeyRing(store, tmp_path / "keys")
        await ring.start()
        registry = CollectorRegistry()
        activator = Activator(store, ActivatorSettings(store_url="memory://"), registry)
        tokens = token_book(
            {ADMIN: ("admin", Role.ADMIN), N1: ("n1", Role.NODE), N2: ("n2", Role.NODE)}
        )
        api = create_app(activator, tokens, registry, [secrets_router(SecretBook(store, ring))])
        await store.put(keys.app("web"), App(name="web", active_version="v1"))
        spec = AppSpec(command=["serve"], env={"LOG_LEVEL": "info"})
        await store.put(keys.version("web", "v1"), Version(app="web", version="v1", spec=spec))
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://control") as http:
            yield Control(store, ring, http)


async def starting(control: Control, sandbox_id: str, node: str = "n1") -> None:
    """A pending sandbox of web's, as the pool controller places it."""
    record = Sandbox(id=sandbox_id, pool="web-v1", app="web", node=node, owner=node)
    await put_placed(control.store, control.ring, record)


async def test_an_admin_sets_and_lists_and_a_node_reads_for_a_sandbox_it_starts(
    control: Control, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = {"values": {"DB_PASSWORD": PASSWORD}, "restart": True}
    answer = await control.call("POST", "/v1/apps/web/secrets", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["set"] == ["DB_PASSWORD"] and answer.json()["generation"] == 1
    assert PASSWORD not in answer.text
    listed = await control.call("GET", "/v1/apps/web/secrets")
    assert listed.status_code == 200
    assert [e["name"] for e in listed.json()["secrets"]] == ["DB_PASSWORD"]
    assert listed.json()["secrets"][0]["set_by"] == "admin" and PASSWORD not in listed.text
    await starting(control, "sb-1")
    got = await control.call("GET", "/v1/sandboxes/sb-1/secrets", N1)
    assert got.status_code == 200
    assert got.json() == {"generation": 1, "env": {"DB_PASSWORD": PASSWORD}}
    assert got.headers["cache-control"] == "no-store"
    gone = await control.call("POST", "/v1/apps/web/secrets/unset", json={"names": ["DB_PASSWORD"]})
    assert gone.status_code == 200 and gone.json()["generation"] == 2
    behind = await control.call("GET", "/v1/sandboxes/sb-1/secrets", N1)
    assert behind.status_code == 403  # the unset restarts web: sb-1 is being replaced
    assert "behind web's 2" in behind.json()["detail"]
    await starting(control, "sb-2")  # its replacement
    again = await control.call("GET", "/v1/sandboxes/sb-2/secrets", N1)
    assert again.json() == {"generation": 2, "env": {}}
    assert "secrets of web changed" in caplog.text and PASSWORD not in caplog.text


async def test_a_node_that_forges_a_sandbox_record_gets_nothing(control: Control) -> None:
    """The reviewer's reproduction: n2's etcd role may write `sandboxes/`, so it writes a
    pending record of web's on itself and asks with its own token; or sets a sandbox of its
    own back to pending after a change, to fetch the new values. Both are refused (403)."""
    await control.call("POST", "/v1/apps/web/secrets", json={"values": {"A": "old"}})
    forged = Sandbox(
        id="forged-1",
        pool="web-v1",
        app="web",
        node="n2",
        owner="n2",
        status=SandboxStatus.PENDING,
        secrets_generation=1,
    )
    await control.store.put(keys.sandbox("forged-1"), forged)
    answer = await control.call("GET", "/v1/sandboxes/forged-1/secrets", N2)
    assert answer.status_code == 403, answer.text
    assert "placement does not verify" in answer.json()["detail"] and "old" not in answer.text
    await starting(control, "mine-1", "n2")
    assert (await control.call("GET", "/v1/sandboxes/mine-1/secrets", N2)).status_code == 200
    ran = await control.store.get(keys.sandbox("mine-1"), Sandbox)
    assert ran is not None
    running = ran.value.model_copy(update={"status": SandboxStatus.RUNNING})
    await control.store.put(keys.sandbox("mine-1"), running)
    await control.call("POST", "/v1/apps/web/secrets", json={"values": {"A": PASSWORD}})
    await control.store.put(keys.sandbox("mine-1"), ran.value)  # pending again
    again = await control.call("GET", "/v1/sandboxes/mine-1/secrets", N2)
    assert again.status_code == 403 and PASSWORD not in again.text
    assert "behind web's 2" in again.json()["detail"]


async def test_nobody_but_the_sandboxes_node_reads_a_value(control: Control) -> None:
    await control.call("POST", "/v1/apps/web/secrets", json={"values": {"A": PASSWORD}})
    await starting(control, "sb-1")
    await control.store.put(
        keys.sandbox("sb-2"),
        Sandbox(id="sb-2", pool="web-v1", app="web", node="n1", status=SandboxStatus.RUNNING),
    )
    for token, path, status in [
        ("", "/v1/sandboxes/sb-1/secrets", 403),  # the admin token: nobody reads a value back
        ("n2", "/v1/sandboxes/sb-1/secrets", 403),  # another node's token
        ("n1", "/v1/sandboxes/sb-2/secrets", 403),  # its own, but running: not at its start
        ("n1", "/v1/sandboxes/nothing-1/secrets", 404),
    ]:
        secret = {"": ADMIN, "n1": N1, "n2": N2}[token]
        answer = await control.call("GET", path, secret)
        assert answer.status_code == status, (token, path, answer.text)
        assert PASSWORD not in answer.text
    for method, path in [
        ("GET", "/v1/apps/web/secrets"),
        ("POST", "/v1/apps/web/secrets"),
        ("POST", "/v1/apps/web/secrets/unset"),
        ("POST", "/v1/secrets/keys"),
    ]:  # a node token sets, lists and rotates nothing
        answer = await control.call(method, path, N1, json={"values": {"A": "x"}})
        assert answer.status_code == 403, (method, path)


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        pytest.param({"values": {"A": 7_654_321}}, 422, "values.'A'", id="a number for a value"),
        pytest.param(
            {"values": {"A": PASSWORD * 2000}}, 422, "values.A: the value is", id="too long"
        ),
        pytest.param({"values": {"A": PASSWORD + "\0"}}, 422, "NUL", id="a NUL in it"),
        pytest.param(
            {"values": {f"A={PASSWORD}": "x"}}, 422, "the name 'A=…'", id="NAME=VALUE as a name"
        ),
        pytest.param({"values": {"LOG_LEVEL": PASSWORD}}, 409, "LOG_LEVEL", id="manifest's name"),
        pytest.param({"values": PASSWORD}, 422, "values: must be an object", id="a bare value"),
        pytest.param({PASSWORD: 1}, 422, "field(s) other than", id="a value as a field"),
        pytest.param(f'{{"values": {{"A": "{PASSWORD}"', 422, "not JSON", id="cut-off JSON"),
        pytest.param("[" * 100_000, 422, "not JSON", id="nested past the parser's depth"),
    ],
)
async def test_a_refused_change_names_the_field_and_never_echoes_the_value(
    control: Control,
    caplog: pytest.LogCaptureFixture,
    body: object,
    status: int,
    said: str,
) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    with caplog.at_level(logging.DEBUG):
        answer = await control.http.post(
            "/v1/apps/web/secrets",
            content=content,
            headers={
                "Authorization": f"Bearer {ADMIN}",
                "Content-Type": "application/json",
            },
        )
    assert answer.status_code == status, answer.text
    assert said in answer.json()["detail"]
    assert PASSWORD not in answer.text and "7654321" not in answer.text
    assert PASSWORD not in caplog.text
    assert await control.store.get(keys.secrets("web"), AppSecrets) is None


async def test_rotate_and_retire_keys_through_the_api(control: Control) -> None:
    await control.call("POST", "/v1/apps/web/secrets", json={"values": {"A": PASSWORD}})
    listed = (await control.call("GET", "/v1/secrets/keys")).json()
    (first,) = [k["id"] for k in listed if k["current"]]
    refused = await control.call("DELETE", f"/v1/secrets/keys/{first}")
    assert refused.status_code == 409 and "current key" in refused.json()["detail"]
    rotated = await control.call("POST", "/v1/secrets/keys")
    assert rotated.status_code == 201
    assert rotated.json()["previous"] == first and rotated.json()["values"] == 1
    assert (await control.call("DELETE", "/v1/secrets/keys/0123456789ab")).status_code == 404
    retired = await control.call("DELETE", f"/v1/secrets/keys/{first}")
    assert retired.status_code == 200 and retired.json() == {"id": first}
    await starting(control, "sb-1")
    got = await control.call("GET", "/v1/sandboxes/sb-1/secrets", N1)
    assert got.json() == {"generation": 1, "env": {"A": PASSWORD}}  # no change, no restart


async def test_a_deploy_whose_env_sets_a_secret_is_refused_and_a_deletion_takes_them(
    tmp_path: Path,
) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as http,
    ):
        definition, data = await uploaded_web(http)
        body = {"definition": definition, "artifact": digest_of(data)}
        assert (await http.post("/v1/deploys", json=body)).status_code == 202
        secret = {"values": {"REGION": PASSWORD}}
        assert (await http.post("/v1/apps/web/secrets", json=secret)).status_code == 200
        definition["spec"]["env"] = {"REGION": "eu"}
        refused = await http.post("/v1/deploys", json=body)
        assert refused.status_code == 400
        assert "env sets REGION, which web also has as a secret" in refused.json()["detail"]
        versions = (await running.store.list(keys.versions_of("web"), Version)).items
        assert [v.value.version for v in versions] == ["v1"]  # nothing written
        deleted = await http.delete("/v1/apps/web")
        assert deleted.status_code == 202, deleted.text
        assert await running.store.get(keys.secrets("web"), AppSecrets) is None


async def test_a_control_plane_missing_a_key_the_store_needs_does_not_start(
    tmp_path: Path,
) -> None:
    async with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        async with running_control_plane(tmp_path / "one", store=store) as running:
            await running.store.put(keys.app("web"), App(name="web"))
            answer = await running.plane.secrets.set("web", {"A": PASSWORD}, by="admin")
            assert answer.written
        with pytest.raises(MissingKey) as refused:  # another data dir: none of its keys
            async with running_control_plane(tmp_path / "two", store=store):
                pass
    said = str(refused.value)
    assert str(tmp_path / "two" / "secret-keys") in said and "\n" not in said
    assert refused.value.key_id in said


async def test_a_deploy_beside_changes_of_the_apps_secrets_still_lands(tmp_path: Path) -> None:
    """A set of another name (or a rotation) moving `secrets/{app}` between a deploy's read
    and its write makes the deploy decide again, not fail (SQLite: each store call yields)."""
    async with (
        running_control_plane(tmp_path, store_url=f"sqlite:///{tmp_path / 'store.db'}") as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as http,
    ):
        definition, data = await uploaded_web(http)
        answers: list[int] = []

        async def deploy(round_: int) -> None:
            definition["spec"]["env"] = {"ROUND": str(round_)}
            body = {"definition": definition, "artifact": digest_of(data)}
            answers.append((await http.post("/v1/deploys", json=body)).status_code)

        async def change(round_: int) -> None:
            secret = {"values": {f"S{round_}": PASSWORD}, "restart": False}
            assert (await http.post("/v1/apps/web/secrets", json=secret)).status_code == 200

        await deploy(0)
        for round_ in range(1, 8):
            async with anyio.create_task_group() as both:
                for _ in range(3):
                    both.start_soon(change, round_ * 10 + _)
                both.start_soon(deploy, round_)
        assert answers == [202] * 8, answers


async def test_a_node_run_with_the_admin_token_starts_apps_without_secrets_only(
    control: Control,
) -> None:
    """The admin token (a node set up with it, against the docs' advice) gets no value: an
    empty environment for an app with no secrets, 403 naming the fix for one with some."""
    await starting(control, "sb-1")
    bare = await control.call("GET", "/v1/sandboxes/sb-1/secrets", ADMIN)
    assert bare.status_code == 200 and bare.json() == {"generation": 0, "env": {}}
    await control.call("POST", "/v1/apps/web/secrets", json={"values": {"A": PASSWORD}})
    held = await control.call("GET", "/v1/sandboxes/sb-1/secrets", ADMIN)
    assert held.status_code == 403 and "wakeful tokens create --role node" in held.text
    assert PASSWORD not in held.text


async def uploaded_web(http: httpx.AsyncClient) -> tuple[dict[str, Any], bytes]:
    """The sample app as `web`: its definition for a deploy, its artifact uploaded."""
    data = pack(HELLO)
    assert (await http.put(f"/v1/artifacts/{digest_of(data)}", content=data)).is_success
    definition = load_app_dir(HELLO).definition.model_dump(mode="json")
    definition.update(name="web")
    return definition, data
