"""The control API as one piece (every router, the real activator and pool controller) on the
memory store: malformed names, drains of unknown nodes, retired pools, app deletion."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from tests.support.control import running_control_plane
from tests.support.waiting import eventually
from wakeful.aio.packing import pack
from wakeful.bootstrap import ControlPlane
from wakeful.deploy import api as deploy_api
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.states import StateKeeper
from wakeful.domain import keys
from wakeful.domain.artifacts import digest_of
from wakeful.domain.models import App, AppSpec, AppState, Node, Pool, Sandbox, Version
from wakeful.node.agent import NodeAgent
from wakeful.node.settings import NodeSettings
from wakeful.node.testing import FakeSecrets
from wakeful.store import Store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio
HELLO = Path(__file__).parents[2] / "examples" / "hello"


@dataclass
class Control:
    http: httpx.AsyncClient
    store: Store
    data_dir: Path
    plane: ControlPlane
    clock: ManualClock
    """When artifacts were uploaded, for their collection (default grace: GRACE)."""


GRACE = 600.0


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[Control]:
    clock = ManualClock()
    async with (
        running_control_plane(tmp_path, artifact_clock=clock) as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as http,
    ):
        yield Control(http, running.store, tmp_path, running.plane, clock)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/apps/a%01/rollback"),
        ("GET", "/v1/deploys/a%01/v1"),
        ("GET", "/v1/deploys/hello/v%20"),
        ("DELETE", "/v1/apps/A"),
        ("POST", "/v1/nodes/n%2F1/drain"),
        ("GET", "/v1/artifacts/..%2Ftoken"),
    ],
)
async def test_a_malformed_name_in_a_url_is_a_422_naming_it(
    control: Control, method: str, path: str
) -> None:
    answer = await control.http.request(method, path)
    assert answer.status_code in (404, 422), answer.text
    if answer.status_code == 422:
        body = answer.json()
        assert body["error"] == "invalid request"
        assert "got" in body["detail"]


async def test_draining_a_node_that_never_registered_is_a_404_unless_forced(
    control: Control,
) -> None:
    answer = await control.http.post("/v1/nodes/nosuchnode/drain")
    assert answer.status_code == 404
    assert "nosuchnode" in answer.json()["detail"]
    assert (await control.http.get("/v1/nodes")).json() == []
    forced = await control.http.post("/v1/nodes/nosuchnode/drain", params={"force": True})
    assert forced.status_code == 202
    assert [n["name"] for n in (await control.http.get("/v1/nodes")).json()] == ["nosuchnode"]


async def test_an_operator_frees_a_state_a_node_keeps_but_never_one_in_use(
    control: Control,
) -> None:
    assert (await control.http.post("/v1/apps/notes/state/release")).status_code == 404
    kept = AppState(
        app="notes", node="n9", epoch=4, sandbox="s1", archive="a" * 64, kept=True, error="big"
    )
    await control.store.put(keys.state("notes"), kept)
    await control.store.put(keys.node("n9"), Node(name="n9", address="n9"))
    running = Sandbox(id="s1", pool="notes-v1", app="notes", node="n9", status="running")
    await control.store.put(keys.sandbox("s1"), running)  # the controller stops it, no agent
    in_use = await control.http.post("/v1/apps/notes/state/release")
    assert in_use.status_code == 409 and "s1" in in_use.json()["detail"]
    await control.store.delete(keys.sandbox("s1"))
    freed = await control.http.post("/v1/apps/notes/state/release")
    assert freed.status_code == 200, freed.text
    record = await control.store.get(keys.state("notes"), AppState)
    assert record is not None
    assert (record.value.node, record.value.epoch, record.value.kept) == (None, 5, False)
    assert record.value.archive == "a" * 64  # its last archive is the state again
    assert "freed by an operator from node n9, which kept it: big" in record.value.error
    again = await control.http.post("/v1/apps/notes/state/release")
    assert again.status_code == 409 and again.json()["error"] == "not held"
    # Held by a node that is up and keeps nothing: it is handing it back itself (archiving
    # what the app last wrote); freeing it now would lose that.
    await control.store.put(keys.state("notes"), AppState(app="notes", node="n9", epoch=9))
    in_hand = await control.http.post("/v1/apps/notes/state/release")
    assert in_hand.status_code == 409 and in_hand.json()["error"] == "in hand"


async def test_a_node_whose_agent_is_down_can_still_be_cordoned(control: Control) -> None:
    settings = NodeSettings(store_url="memory://", node_name="n1", data_dir=control.data_dir)
    artifacts = LocalArtifacts(control.data_dir / "artifacts")
    keeper = StateKeeper(control.store, artifacts).for_node(settings.node_name)
    agent = NodeAgent(control.store, settings, artifacts, keeper, FakeSecrets())
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(agent.run)
        with anyio.fail_after(30):
            await agent.wait_registered()
        tasks.cancel_scope.cancel()  # the agent stops and its node record goes with it
    nodes = (await control.http.get("/v1/nodes")).json()
    assert all(not n["registered"] for n in nodes)
    answer = await control.http.post("/v1/nodes/n1/drain", params={"evacuate": False})
    assert answer.status_code == 202


async def test_a_retired_pool_reports_its_state_not_a_size_nobody_acts_on(
    control: Control,
) -> None:
    spec = AppSpec(command=["true"])
    old = Pool(name="web-v1", app="web", version="v1", spec=spec, desired_instances=4)
    await control.store.put("pools/web-v1", old.model_copy(update={"retired": True}))
    await control.store.put("pools/web-v2", Pool(name="web-v2", app="web", version="v2", spec=spec))
    with anyio.fail_after(10):
        while len(pools := (await control.http.get("/v1/pools")).json()) < 2:  # noqa: ASYNC110
            await anyio.sleep(0.02)
    by_name = {p["pool"]: p for p in pools}
    assert by_name["web-v1"]["state"] == "retired"
    assert by_name["web-v1"]["desired_instances"] == 0
    assert by_name["web-v2"]["state"] == "active"


async def test_deleting_an_app_removes_route_versions_and_unused_artifacts(
    control: Control,
) -> None:
    artifacts = control.plane.artifacts
    data = pack(HELLO)
    digest = digest_of(data)
    await artifacts.put(data)
    control.clock.advance(GRACE + 1)  # uploaded long ago
    spec = AppSpec(command=["true"])
    await control.store.put("apps/web", App(name="web", active_version="v1"))
    await control.store.put("apps/other", App(name="other", active_version="v1"))
    await control.store.put(
        "versions/web/v1", Version(app="web", version="v1", spec=spec, artifact=digest)
    )
    await control.store.put("pools/web-v1", Pool(name="web-v1", app="web", version="v1", spec=spec))
    await control.store.put(
        "pools/other-v1", Pool(name="other-v1", app="other", version="v1", spec=spec)
    )

    answer = await control.http.delete("/v1/apps/web")
    assert answer.status_code == 202, answer.text
    assert answer.json() == {
        "app": "web",
        "versions": 1,
        "pools": ["web-v1"],
        "artifacts_removed": 1,
    }
    assert await control.store.get("apps/web", App) is None
    assert (await control.store.list("versions/web/", Version)).items == []
    pool = await control.store.get("pools/web-v1", Pool)
    assert pool is not None and pool.value.retired and pool.value.deleted
    assert not artifacts.has(digest)
    other = await control.store.get("pools/other-v1", Pool)
    assert other is not None and not other.value.retired
    again = await control.http.delete("/v1/apps/web")
    assert again.status_code == 404
    assert "web" in again.json()["detail"]


async def test_an_artifact_another_app_uses_survives_a_delete(control: Control) -> None:
    artifacts = control.plane.artifacts
    data = pack(HELLO)
    digest = await artifacts.put(data)
    control.clock.advance(GRACE + 1)
    spec = AppSpec(command=["true"])
    for app in ("a", "b"):
        await control.store.put(f"apps/{app}", App(name=app, active_version="v1"))
        await control.store.put(
            f"versions/{app}/v1", Version(app=app, version="v1", spec=spec, artifact=digest)
        )
    answer = await control.http.delete("/v1/apps/a")
    assert answer.json()["artifacts_removed"] == 0
    assert artifacts.has(digest)


async def test_an_artifact_uploaded_just_before_a_delete_stays_for_the_grace(
    control: Control,
) -> None:
    """An upload in flight (its version not written yet) outlives the deletion of the app it
    was for; a later collection deletes it once the grace has passed."""
    data = pack(HELLO)
    digest = digest_of(data)
    assert (await control.http.put(f"/v1/artifacts/{digest}", content=data)).status_code == 201
    await control.store.put("apps/web", App(name="web", active_version="v1"))
    await control.store.put(
        "versions/web/v1",
        Version(app="web", version="v1", spec=AppSpec(command=["true"]), artifact=digest),
    )
    answer = await control.http.delete("/v1/apps/web")
    assert answer.json()["artifacts_removed"] == 0
    assert (await control.http.get(f"/v1/artifacts/{digest}")).status_code == 200
    control.clock.advance(GRACE - 1)
    assert await control.plane.deployer.collector.collect() == []
    control.clock.advance(2)
    assert await control.plane.deployer.collector.collect() == [digest]
    assert (await control.http.get(f"/v1/artifacts/{digest}")).status_code == 404


async def test_the_control_plane_collects_unreferenced_artifacts_on_its_own(
    tmp_path: Path,
) -> None:
    """The periodic collection: an upload nobody deployed goes once its grace has passed."""
    clock = ManualClock()
    async with running_control_plane(
        tmp_path, artifact_clock=clock, artifact_grace=60, artifact_gc_interval=0.05
    ) as running:
        artifacts = running.plane.artifacts
        digest = await artifacts.put(pack(HELLO))
        clock.advance(61)
        with anyio.fail_after(10):
            while artifacts.has(digest):  # noqa: ASYNC110 - a file on disk, no event
                await anyio.sleep(0.02)


async def stalled_upload(
    url: str, token: str, path: str = f"/v1/artifacts/{'0' * 64}"
) -> anyio.abc.SocketStream:
    """An upload that sends its head and one byte of body, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    stream = await anyio.connect_tcp(host, int(port))
    await stream.send(
        f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n".encode()
    )
    return stream


async def test_a_node_holds_one_state_upload_slot_and_never_a_deploy_s(
    control: Control, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hostile review: a node holding a state trickled four uploads a byte at a time, held
    every upload slot, and `wakeful deploy` got 503 for as long as it liked. A node now holds
    one state upload at a time, and artifacts (deploys) have slots of their own."""
    monkeypatch.setattr(deploy_api, "UPLOAD_SLOT_WAIT", 0.2)
    made = await control.http.post("/v1/tokens", json={"name": "n1", "role": "node"})
    node = made.json()["secret"]
    await control.store.put(keys.state("notes"), AppState(app="notes", node="n1", epoch=3))
    url = str(control.http.base_url).rstrip("/")
    state_path = f"/v1/states/notes/archives/{'0' * 64}?node=n1&epoch=3"
    stalled = [await stalled_upload(url, node, state_path) for _ in range(deploy_api.UPLOADS)]
    await anyio.sleep(0.3)  # the first holds n1's slot; the others waited for it and gave up
    for stream in stalled[1:]:
        with anyio.fail_after(10):
            assert (await stream.receive()).startswith(b"HTTP/1.1 503"), "one slot per node"
    data = pack(HELLO)
    deployed = await control.http.put(f"/v1/artifacts/{digest_of(data)}", content=data)
    assert deployed.status_code == 201, deployed.text
    for stream in stalled:
        await stream.aclose()


async def test_uploads_that_stall_are_refused_and_never_hold_every_slot(
    control: Control, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four uploads that send a byte and stop hold every slot: the next is told to come back
    (503 + Retry-After) rather than wait; a stalled one is refused (408) once it has sent
    nothing for the idle time, and its slot goes back."""
    token = control.http.headers["Authorization"].removeprefix("Bearer ")
    url = str(control.http.base_url).rstrip("/")
    monkeypatch.setattr(deploy_api, "UPLOAD_SLOT_WAIT", 0.2)
    monkeypatch.setattr(deploy_api, "UPLOAD_IDLE", 30.0)
    stalled = [await stalled_upload(url, token) for _ in range(deploy_api.UPLOADS)]
    await anyio.sleep(0.2)  # each has taken its slot
    busy = await control.http.put(f"/v1/artifacts/{'1' * 64}", content=b"x")
    assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
    for stream in stalled:
        await stream.aclose()
    monkeypatch.setattr(deploy_api, "UPLOAD_IDLE", 0.3)
    stream = await stalled_upload(url, token)
    async with stream:
        with anyio.fail_after(30):
            answer = await stream.receive()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"upload stalled" in answer


async def test_routed_waits_for_the_ingresses_behind_and_names_them_when_it_gives_up(
    control: Control,
) -> None:
    """What `wakeful deploy` waits for once its rollout is done: every ingress that says how
    far its routes have come (here two, in-process) routes the app as its record is now."""
    seen = control.plane.routes_seen
    written = await control.store.put(keys.app("shop"), App(name="shop", active_version="v1"))
    seen.saw("edge-1", "edge-1", written)
    seen.saw("edge-2", "edge-2", written - 1)
    answer = await control.http.get("/v1/apps/shop/routed", params={"within": 0.05})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "app": "shop",
        "revision": written,
        "ingresses": 2,
        "behind": {"edge-2": written - 1},
    }
    async with anyio.create_task_group() as tasks:
        waited: list[dict[str, object]] = []

        async def ask() -> None:
            asked = await control.http.get("/v1/apps/shop/routed", params={"within": 30})
            waited.append(asked.json())

        tasks.start_soon(ask)
        with anyio.fail_after(10):
            await eventually(lambda: seen.waiting == 1)
        await anyio.sleep(0.05)
        assert waited == []  # edge-2 is still behind: the answer waits
        seen.saw("edge-2", "edge-2", written + 3)
    assert waited[0]["behind"] == {}
    assert (await control.http.get("/v1/apps/nosuch/routed")).status_code == 404
    for within in ("-1", "31", "soon"):
        refused = await control.http.get("/v1/apps/shop/routed", params={"within": within})
        assert refused.status_code == 422, refused.text
