"""Deploys through the control API: versions, no-op redeploys, refused uploads, start size."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.activator import serving
from wakeful.activator.api import create_app
from wakeful.activator.core import Activator
from wakeful.activator.settings import ActivatorSettings
from wakeful.aio.packing import pack
from wakeful.deploy.api import deploy_router
from wakeful.deploy.appdir import load_app_dir
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.errors import DeployError
from wakeful.deploy.rollout import Phase, Rollout
from wakeful.deploy.service import Deployer, next_version, starting_size
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.artifacts import digest_of
from wakeful.domain.hosts import HostRules
from wakeful.domain.models import App, AppSpec, Pool, Role, RolloutRecord, Version
from wakeful.store import Store, open_store, sqlite_url
from wakeful.store.tokenbook import TokenBook

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"
TOKEN = "deploy-token"
ADMIN = TokenBook.of({TOKEN: Role.ADMIN})
"""The control API's credentials: TOKEN, as an admin token."""


@pytest.fixture
async def store() -> AsyncIterator[Store]:
    """The control plane's store in `api` (the same one in a test that asks for both)."""
    async with open_store("memory://") as store:
        yield store


@pytest.fixture
async def api(tmp_path: Path, store: Store) -> AsyncIterator[httpx.AsyncClient]:
    registry = CollectorRegistry()
    settings = ActivatorSettings(
        store_url="memory://", token=TOKEN, reserved_hosts=["dashboard.internal"]
    )
    activator = Activator(store, settings, registry)
    artifacts = LocalArtifacts(tmp_path / "artifacts", max_bytes=64 * 1024)
    deployer = Deployer(store, artifacts, timeout=2, hosts=settings.host_rules())
    async with activator.running(), anyio.create_task_group() as tasks:
        keeper = StateKeeper(store, artifacts, registry=registry)
        routes = deploy_router(store, deployer, artifacts, keeper, tasks)
        app = create_app(activator, ADMIN, registry, [routes])
        async with (
            serving(app) as url,
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
        ):
            yield client


async def upload(
    client: httpx.AsyncClient, data: bytes, digest: str | None = None
) -> httpx.Response:
    return await client.put(f"/v1/artifacts/{digest or digest_of(data)}", content=data)


async def test_a_deploy_creates_a_version_and_an_unchanged_one_is_a_no_op(
    api: httpx.AsyncClient,
) -> None:
    data = pack(HELLO)
    assert (await upload(api, data)).status_code == 201
    body = {
        "definition": load_app_dir(HELLO).definition.model_dump(mode="json"),
        "artifact": digest_of(data),
    }
    first = await api.post("/v1/deploys", json=body)
    assert first.status_code == 202
    assert (first.json()["version"], first.json()["phase"]) == ("v1", "rolling")
    with anyio.fail_after(10):
        while (await api.get("/v1/deploys/hello/v1")).json()["phase"] != "live":  # noqa: ASYNC110
            await anyio.sleep(0.05)
    again = await api.post("/v1/deploys", json=body)
    assert again.json()["phase"] == "unchanged"
    assert "nothing changed" in again.json()["message"]
    apps = (await api.get("/v1/apps")).json()
    assert [(a["name"], a["active_version"], a["versions"]) for a in apps] == [
        ("hello", "v1", ["v1"])
    ]


async def test_corrupt_mismatched_and_oversized_uploads_are_refused(api: httpx.AsyncClient) -> None:
    garbage = await upload(api, b"not a tarball")
    assert garbage.status_code == 400
    assert garbage.json()["error"] == "invalid artifact"
    data = pack(HELLO)
    mismatched = await upload(api, data, digest="0" * 64)
    assert mismatched.status_code == 400
    assert "sha256" in mismatched.json()["detail"]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    escaping = await upload(api, gzip.compress(raw.getvalue()))
    assert escaping.status_code == 400
    big = await upload(api, b"x" * (65 * 1024))
    assert big.status_code == 413
    missing = await api.post(
        "/v1/deploys",
        json={
            "definition": load_app_dir(HELLO).definition.model_dump(mode="json"),
            "artifact": "f" * 64,
        },
    )
    assert missing.status_code == 400
    assert "was not uploaded" in missing.json()["detail"]
    assert (await api.get("/v1/apps")).json() == []


async def test_a_malformed_definition_is_refused_naming_the_field(api: httpx.AsyncClient) -> None:
    answer = await api.post(
        "/v1/deploys",
        json={"definition": {"name": "ok", "spec": {"command": []}}},
    )
    assert answer.status_code == 422
    assert "definition.spec" in answer.json()["detail"]
    assert "command: empty" in answer.json()["detail"]
    unauthorized = await api.post("/v1/deploys", json={}, headers={"Authorization": "Bearer no"})
    assert unauthorized.status_code == 401


SPEC = AppSpec(command=["x"])


@pytest.mark.parametrize(
    ("old_desired", "old_running", "new_min", "expected"),
    [
        pytest.param(None, 0, 0, 0, id="a first deploy starts at min_instances"),
        pytest.param(6, 6, 0, 6, id="a busy app's new version starts at the old size"),
        pytest.param(0, 0, 0, 0, id="an idle app's new version starts at zero"),
        pytest.param(0, 2, 0, 2, id="sandboxes still serving count even if desired fell"),
        pytest.param(1, 1, 3, 3, id="never below the new min_instances"),
    ],
)
def test_starting_size(
    old_desired: int | None, old_running: int, new_min: int, expected: int
) -> None:
    old = None
    if old_desired is not None:
        old = Pool(name="a-v1", app="a", version="v1", spec=SPEC, desired_instances=old_desired)
    assert starting_size(old, old_running, new_min) == expected


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        pytest.param([], "v1", id="an app's first version is v1"),
        pytest.param(["v1", "v2"], "v3", id="one past the highest"),
        pytest.param(["v2", "v10", "v9"], "v11", id="by number, not by name"),
        pytest.param(["v3"], "v4", id="a number deleted below the highest is not given again"),
        pytest.param(["v1", "va", "v-2"], "v2", id="a name whose rest is no number does not count"),
    ],
)
def test_next_version(versions: list[str], expected: str) -> None:
    assert next_version(versions) == expected


async def test_rollback_recreates_a_swept_pool_from_its_version(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        spec = AppSpec(command=["x"])
        await store.put("versions/a/v1", Version(app="a", version="v1", spec=spec))
        await store.put("versions/a/v2", Version(app="a", version="v2", spec=spec))
        await store.put(
            "pools/a-v2", Pool(name="a-v2", app="a", version="v2", spec=spec, desired_instances=3)
        )
        await store.put("apps/a", App(name="a", active_version="v2", previous_version="v1"))
        deployer = Deployer(store, LocalArtifacts(tmp_path), timeout=1)
        rollout = await deployer.rollback("a")
        assert (rollout.version, rollout.pool) == ("v1", "a-v1")
        recreated = await store.get("pools/a-v1", Pool)
        assert recreated is not None
        assert recreated.value.desired_instances == 3  # the current size, not a cold one
        assert not recreated.value.retired


async def deploy_as(
    client: httpx.AsyncClient, name: str, hosts: list[str], **routing: object
) -> httpx.Response:
    data = pack(HELLO)
    await upload(client, data)
    definition = load_app_dir(HELLO).definition.model_dump(mode="json")
    definition.update(name=name, hosts=hosts, **routing)
    return await client.post(
        "/v1/deploys", json={"definition": definition, "artifact": digest_of(data)}
    )


async def live(client: httpx.AsyncClient, app: str) -> None:
    with anyio.fail_after(10):
        while (await client.get(f"/v1/deploys/{app}/v1")).json()["phase"] != "live":  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_a_host_another_app_serves_refuses_the_deploy_naming_both(
    api: httpx.AsyncClient,
) -> None:
    assert (await deploy_as(api, "shop", ["*.example.com", "shop.example.org"])).status_code == 202
    await live(api, "shop")
    for hosts in (["a.example.com"], ["*.eu.example.com"], ["*.example.com"], ["shop.example.org"]):
        refused = await deploy_as(api, "thief", ["thief.example.net", *hosts])
        assert refused.status_code == 400, hosts
        assert f"host {hosts[0]} of thief overlaps" in refused.json()["detail"]
        assert "of app shop" in refused.json()["detail"]
    apps = (await api.get("/v1/apps")).json()
    assert [a["name"] for a in apps] == ["shop"]  # nothing of thief was written
    assert (await deploy_as(api, "other", ["example.com", "*.example.org"])).status_code == 400
    assert (await deploy_as(api, "other", ["example.com", "shop.example.net"])).status_code == 202
    # An app's own hosts never clash with themselves: redeploying it changes nothing.
    again = await deploy_as(api, "shop", ["*.example.com", "shop.example.org"])
    assert again.json()["phase"] == "unchanged"


async def test_an_app_can_opt_out_of_its_default_host(api: httpx.AsyncClient) -> None:
    assert (
        await deploy_as(api, "quiet", ["quiet.example.com"], default_host=False)
    ).status_code == 202
    await live(api, "quiet")
    apps = (await api.get("/v1/apps")).json()
    assert [(a["name"], a["default_host"]) for a in apps] == [("quiet", False)]


async def nothing_of(store: Store, app: str) -> None:
    """No app record, version, pool or rollout of `app` was written."""
    assert await store.get(keys.app(app), App) is None
    assert (await store.list(keys.versions_of(app), Version)).items == []
    assert [p for p in (await store.list(keys.POOLS, Pool)).items if p.value.app == app] == []
    assert (await store.list(keys.rollouts_of(app), RolloutRecord)).items == []


@pytest.mark.parametrize(
    ("host", "why"),
    [
        pytest.param("127.0.0.1", "a browser reads it as an IP address", id="an IP address"),
        pytest.param("0x7f.1", "a browser reads it as an IP address", id="127.0.0.1 in hex"),
        pytest.param("localhost", "it reaches the control plane's dashboard", id="localhost"),
        pytest.param("*.localhost", "it covers the apps' default hosts", id="every default host"),
        pytest.param(
            "dashboard.internal",
            "the control plane answers on it",
            id="a name in WAKEFUL_RESERVED_HOSTS",
        ),
    ],
)
async def test_a_reserved_host_refuses_the_deploy_and_writes_nothing(
    api: httpx.AsyncClient, store: Store, host: str, why: str
) -> None:
    refused = await deploy_as(api, "grabby", ["grabby.example.com", host])
    assert refused.status_code == 400
    assert refused.json()["error"] == "deploy refused"
    assert refused.json()["detail"].startswith(f"hosts: {host} is reserved: {why}")
    await nothing_of(store, "grabby")


async def test_a_host_that_is_another_apps_default_host_is_refused_naming_both(
    api: httpx.AsyncClient, store: Store
) -> None:
    assert (await deploy_as(api, "hello", [])).status_code == 202
    await live(api, "hello")
    refused = await deploy_as(api, "foo", ["foo.example.com", "hello.localhost"])
    assert refused.status_code == 400
    assert (
        "host hello.localhost of foo overlaps hello.localhost, the default host of app hello"
        in refused.json()["detail"]
    )
    await nothing_of(store, "foo")
    # Without its default host, hello leaves the name free.
    assert (await deploy_as(api, "hello", [], default_host=False)).status_code == 202
    with anyio.fail_after(10):
        while (await api.get("/v1/deploys/hello/v2")).json()["phase"] != "live":  # noqa: ASYNC110
            await anyio.sleep(0.05)
    assert (await deploy_as(api, "foo", ["hello.localhost"])).status_code == 202


async def test_a_default_host_another_app_claims_is_refused_naming_both(
    api: httpx.AsyncClient, store: Store
) -> None:
    assert (await deploy_as(api, "bar", ["foo.localhost"])).status_code == 202
    await live(api, "bar")
    refused = await deploy_as(api, "foo", [])
    assert refused.status_code == 400
    detail = refused.json()["detail"]
    assert "the default host foo.localhost of foo overlaps host foo.localhost of app bar" in detail
    assert "default_host = false" in detail
    await nothing_of(store, "foo")
    assert (await deploy_as(api, "foo", [], default_host=False)).status_code == 202


async def test_a_rollback_does_not_route_hosts_reserved_since(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        spec = AppSpec(command=["x"])
        await store.put("versions/a/v1", Version(app="a", version="v1", spec=spec))
        await store.put("versions/a/v2", Version(app="a", version="v2", spec=spec))
        # Deployed before the name was reserved (WAKEFUL_RESERVED_HOSTS set since).
        app = App(name="a", hosts=["ops.example.com"], active_version="v2", previous_version="v1")
        await store.put("apps/a", app)
        rules = HostRules(control=("ops.example.com",))
        deployer = Deployer(store, LocalArtifacts(tmp_path), timeout=1, hosts=rules)
        with pytest.raises(DeployError, match=r"cannot roll back a: hosts: ops\.example\.com is"):
            await deployer.rollback("a")
        assert await store.get("pools/a-v1", Pool) is None
        assert (await store.list(keys.rollouts_of("a"), RolloutRecord)).items == []


async def test_a_rollout_that_lost_a_host_before_its_flip_is_abandoned(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        deployer = Deployer(store, LocalArtifacts(tmp_path), timeout=1)
        definition = load_app_dir(HELLO).definition.model_copy(
            update={"name": "foo", "hosts": ["shop.example.com"]}
        )
        rollout = await deployer.prepare(definition, None)
        # Another app took the host while foo's sandboxes started.
        await store.put("apps/shop", App(name="shop", hosts=["shop.example.com"]))
        ended = await deployer.roll_out(rollout)
        assert ended.phase is Phase.FAILED
        assert "overlaps host shop.example.com of app shop" in ended.message
        assert await store.get(keys.app("foo"), App) is None
        pool = await store.get(keys.pool(rollout.pool), Pool)
        assert pool is not None and pool.value.retired


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_two_rollouts_claiming_one_host_at_once_leave_it_to_one(
    tmp_path: Path, backend: str
) -> None:
    """The hostile review: two deploys claiming one host at the same instant both passed their
    checks before either flipped (3 times in 15), and both apps then listed the host. The
    check and the flip are one step now: one goes live, the other is abandoned naming it."""
    url = sqlite_url(tmp_path / "store.db") if backend == "sqlite" else "memory://"
    async with open_store(url) as store:
        deployer = Deployer(store, LocalArtifacts(tmp_path), timeout=5)
        rollouts = [
            await deployer.prepare(
                load_app_dir(HELLO).definition.model_copy(
                    update={"name": name, "hosts": ["race.example.com"]}
                ),
                None,
            )
            for name in ("ra", "rb")
        ]
        ended = []

        async def roll(rollout: Rollout) -> None:
            ended.append(await deployer.roll_out(rollout))

        async with anyio.create_task_group() as tasks:
            for rollout in rollouts:
                tasks.start_soon(roll, rollout)
        assert sorted(r.phase for r in ended) == [Phase.FAILED, Phase.LIVE]
        claimed = [a.value.name for a in (await store.list(keys.APPS, App)).items]
        assert len(claimed) == 1
        failed = next(r for r in ended if r.phase is Phase.FAILED)
        assert f"overlaps host race.example.com of app {claimed[0]}" in failed.message
