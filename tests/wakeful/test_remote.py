"""The one client of the control API (`wakeful.remote`): how a command finds the control plane
(--api, WAKEFUL_API/WAKEFUL_TOKEN, the data directory's control file), and how every way a
call can fail becomes one `ControlApiError` that the CLI prints as one line and exits 1. The
calls go to the real control plane, served in-process on the memory store."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.abc
import pytest
from pydantic import SecretStr

from tests.support.control import TOKEN, running_control_plane
from wakeful import commands
from wakeful.aio.marks import Marks
from wakeful.cli import main
from wakeful.commands import USAGE
from wakeful.datadir import CONTROL_FILE, write_control_file
from wakeful.domain import keys
from wakeful.domain.artifacts import ArtifactError, ArtifactUnavailable
from wakeful.domain.models import App, AppState, Cordon, Node
from wakeful.node.secrets import SecretsRefused
from wakeful.remote import (
    ApiRefused,
    ApiUnreachable,
    CliSettings,
    ControlApiError,
    ControlClient,
    Endpoint,
    HttpArtifacts,
    HttpKeeper,
    HttpSecrets,
    NoControlPlane,
    locate,
)
from wakeful.store import Store
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio

T = TypeVar("T")


@pytest.fixture(autouse=True)
def _no_control_plane_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WAKEFUL_API", raising=False)
    monkeypatch.delenv("WAKEFUL_TOKEN", raising=False)


# -- finding the control plane ----------------------------------------------------------------


def settings(api: str | None = None, token: str | None = None) -> CliSettings:
    return CliSettings(api=api, token=SecretStr(token) if token else None)


@pytest.mark.parametrize(
    ("flag", "env_api", "env_token", "recorded", "found"),
    [
        (None, None, None, ("http://file", "t-file"), ("http://file", "t-file")),
        ("http://flag", "http://env", "t-env", None, ("http://flag", "t-env")),
        (None, "http://env", "t-env", ("http://file", "t-file"), ("http://env", "t-env")),
        ("http://file", None, None, ("http://file", "t-file"), ("http://file", "t-file")),
        (None, None, "t-env", ("http://file", "t-file"), ("http://file", "t-env")),
    ],
    ids=[
        "the control file alone is enough",
        "--api wins over WAKEFUL_API",
        "the environment wins over the control file",
        "--api naming the recorded control plane takes its token",
        "WAKEFUL_TOKEN with the control file's address",
    ],
)
def test_the_control_plane_is_found_by_flag_then_environment_then_control_file(
    tmp_path: Path,
    flag: str | None,
    env_api: str | None,
    env_token: str | None,
    recorded: tuple[str, str] | None,
    found: tuple[str, str],
) -> None:
    if recorded is not None:
        write_control_file(tmp_path, recorded[0], recorded[1], None)
    endpoint = locate(settings(env_api, env_token), tmp_path / CONTROL_FILE, flag)
    assert (endpoint.api, endpoint.token) == found
    assert found[1] not in repr(endpoint)


def test_the_recorded_token_never_goes_to_another_address(tmp_path: Path) -> None:
    write_control_file(tmp_path, "http://file", "t-file", None)
    with pytest.raises(NoControlPlane, match=r"^no token for http://elsewhere: set WAKEFUL_TOKEN"):
        locate(settings(), tmp_path / CONTROL_FILE, "http://elsewhere")


@pytest.mark.parametrize(
    ("content", "env_api", "message"),
    [
        (None, None, "does not exist; start `wakeful up`, or pass --api and set WAKEFUL_TOKEN"),
        (None, "http://env", "no token for http://env: set WAKEFUL_TOKEN"),
        ("{not json", None, "not JSON"),
        ('{"api": "http://x"}', None, "expected the strings `api` and `token`"),
        ("[1, 2]", None, "expected the strings `api` and `token`"),
    ],
    ids=["nothing at all", "an address but no token", "not JSON", "no token in it", "a list"],
)
def test_no_usable_control_plane_is_an_error_naming_the_control_file(
    tmp_path: Path, content: str | None, env_api: str | None, message: str
) -> None:
    control = tmp_path / CONTROL_FILE
    if content is not None:
        control.write_text(content)
    with pytest.raises(NoControlPlane, match=r"control\.json") as caught:
        locate(settings(env_api), control)
    assert message in str(caught.value)
    assert str(control) in str(caught.value)


# -- calls against the real control plane ---------------------------------------------------


@dataclass
class Plane:
    store: Store
    endpoint: Endpoint
    data_dir: Path
    routes_seen: Marks
    """The activator's: how far each ingress says its routes have come."""


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    async with running_control_plane(tmp_path) as running:
        endpoint = Endpoint(running.url, running.token)
        yield Plane(running.store, endpoint, tmp_path, running.plane.routes_seen)


async def in_thread(call: Callable[[], T]) -> T:
    """The client blocks: it runs beside the event loop that serves the control plane."""
    return await anyio.to_thread.run_sync(call)


async def test_an_error_answer_becomes_api_refused_with_its_status_and_detail(
    plane: Plane,
) -> None:
    with ControlClient(plane.endpoint) as api:
        with pytest.raises(ApiRefused) as refused:
            await in_thread(lambda: api.rollback("nope"))
        assert refused.value.status == 404
        assert str(refused.value) == (
            "the control plane answered 404: unknown app: no app named 'nope'"
        )
        with pytest.raises(ApiRefused, match="answered 422") as invalid:
            await in_thread(lambda: api.app_logs("hello", tail=-5).__enter__())
        assert "tail" in str(invalid.value)
        # A name is one path segment: `a?b` is refused, not taken for the app `a`.
        with pytest.raises(ApiRefused, match=r"answered 422: invalid request: .*'a\?b'"):
            await in_thread(lambda: api.delete_app("a?b"))
        with pytest.raises(ApiRefused, match="answered 404: Not Found"):
            await in_thread(lambda: api.rollout("a/b", "v1"))
        assert await in_thread(api.pools) == []


async def test_a_wrong_token_is_refused_as_401(plane: Plane) -> None:
    with (
        ControlClient(Endpoint(plane.endpoint.api, "wrong")) as api,
        pytest.raises(ApiRefused, match="answered 401") as refused,
    ):
        await in_thread(api.apps)
    assert refused.value.status == 401


async def test_no_answer_becomes_api_unreachable_naming_the_address() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    with (
        ControlClient(Endpoint(nowhere, TOKEN), timeout=5) as api,
        pytest.raises(ApiUnreachable, match=f"cannot reach the control plane at {nowhere}"),
    ):
        await in_thread(api.nodes)
    with pytest.raises(ControlApiError, match="not a control API URL"):
        ControlClient(Endpoint("http://[::1", TOKEN))


async def test_a_node_gets_artifact_errors_not_httpx_ones(plane: Plane) -> None:
    """A refusal is an `ArtifactError` (trying again will not help); a control API that
    cannot be reached is `ArtifactUnavailable` (an OSError: the node tries again)."""
    missing = "0" * 64
    await plane.store.put(
        keys.state("notes"), AppState(app="notes", node="n1", epoch=3, sandbox="s1")
    )
    async with HttpArtifacts(plane.endpoint.api, TOKEN) as artifacts:
        with pytest.raises(ArtifactError, match="404"):
            await artifacts.fetch(missing)
    async with HttpKeeper(plane.endpoint.api, TOKEN, "n1") as keeper:
        with pytest.raises(ArtifactError, match="400"):  # not the archive its name says
            await keeper.store("notes", 3, b"not a tar", missing)
        with pytest.raises(ArtifactError, match="409"):  # a state this node does not hold
            await keeper.store("notes", 2, b"not a tar", missing)
    async with HttpArtifacts(f"http://127.0.0.1:{free_port()}", TOKEN) as artifacts:
        with pytest.raises(ArtifactUnavailable, match="cannot fetch"):
            await artifacts.fetch(missing)
    async with HttpKeeper(f"http://127.0.0.1:{free_port()}", TOKEN, "n1") as keeper:
        with pytest.raises(ArtifactUnavailable, match="cannot reach"):
            await keeper.store("notes", 3, b"x", missing)
        with pytest.raises(ArtifactUnavailable, match="cannot reach"):
            await keeper.release("notes", 3)


SECRET = "s3cr3t-never-shown"


@contextlib.asynccontextmanager
async def answering(status: int, body: bytes) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A control API that answers every request with `status` and `body`; the request heads
    it read, in order."""
    heads: list[bytes] = []

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await stream.receive()
            heads.append(head)
            await stream.send(
                b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (status, len(body), body)
            )

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, answer)
        yield f"http://127.0.0.1:{port}", heads
        tasks.cancel_scope.cancel()


def secrets_body(env: object) -> bytes:
    return json.dumps({"generation": 2, "env": env}).encode()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(200, secrets_body({"DB": SECRET}), {"DB": SECRET}, id="200: the env"),
        pytest.param(200, secrets_body({}), {}, id="200 with none: an empty env"),
        pytest.param(
            403,
            b'{"error": "not yours", "detail": "sandbox s1 is not recorded on node n1"}',
            SecretsRefused,
            id="403 (another node's sandbox, or not starting): refused",
        ),
        pytest.param(404, b'{"error": "unknown sandbox"}', SecretsRefused, id="404: refused"),
        pytest.param(503, b'{"error": "standby"}', OSError, id="503: unavailable, an OSError"),
        pytest.param(
            200, secrets_body({"DB": 7, "X": SECRET}), OSError, id="200 not of strings: unavailable"
        ),
        pytest.param(200, SECRET.encode(), OSError, id="200 not JSON: unavailable"),
    ],
)
async def test_a_node_gets_its_sandboxs_secrets_or_an_error_naming_no_value(
    status: int, body: bytes, expected: dict[str, str] | type[Exception]
) -> None:
    """`HttpSecrets`: the node's token in a header, the sandbox in the path, and nothing of
    an answer's body in an error (the runner records the error as the sandbox's last log)."""
    async with answering(status, body) as (api, heads), HttpSecrets(api, TOKEN, "n1") as source:
        if isinstance(expected, dict):
            assert await source.env_for("web-v1-0a1b") == expected
        else:
            with pytest.raises(expected) as raised:
                await source.env_for("web-v1-0a1b")
            assert SECRET not in repr(raised.value)
            assert raised.value.__cause__ is None or SECRET not in repr(raised.value.__cause__)
            assert "web-v1-0a1b" in str(raised.value)
    request = heads[0].decode()
    assert request.startswith("GET /v1/sandboxes/web-v1-0a1b/secrets HTTP/1.1\r\n")
    assert f"\r\nauthorization: Bearer {TOKEN}\r\n" in request.replace(
        "Authorization", "authorization"
    )


async def test_a_control_api_that_cannot_be_reached_leaves_secrets_unavailable() -> None:
    async with HttpSecrets(f"http://127.0.0.1:{free_port()}", TOKEN, "n1") as source:
        with pytest.raises(OSError, match="cannot reach the control API"):
            await source.env_for("s1")


# -- the CLI around it ----------------------------------------------------------------------


async def test_the_cli_finds_the_control_plane_through_its_control_file_or_the_environment(
    plane: Plane, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await plane.store.put("apps/hello", App(name="hello"))
    data_dir = str(plane.data_dir)
    write_control_file(plane.data_dir, plane.endpoint.api, TOKEN, None)
    assert await in_thread(lambda: main(["--data-dir", data_dir, "status"])) == 0
    assert capsys.readouterr().out.startswith("POOL  APP  VERSION  STATE")
    assert await in_thread(lambda: main(["--data-dir", data_dir, "versions", "nope"])) == 1
    assert capsys.readouterr().err == "wakeful: error: no app named 'nope'\n"
    assert await in_thread(lambda: main(["--data-dir", data_dir, "status", "nope"])) == 1
    assert capsys.readouterr().err == "wakeful: error: no app named 'nope'\n"
    assert await in_thread(lambda: main(["--data-dir", data_dir, "status", "hello"])) == 0
    assert capsys.readouterr().out.startswith("POOL  APP  VERSION  STATE")  # no pool yet
    bad = ["--data-dir", data_dir, "deploy", "--image", "UPPER/Case::x", "--name", "x"]
    assert await in_thread(lambda: main(bad)) == USAGE
    shown = capsys.readouterr()
    assert shown.out == ""  # not "pulling UPPER/Case::x" first
    assert shown.err.startswith("wakeful: error: deploy refused: image 'UPPER/Case::x': ")

    (plane.data_dir / CONTROL_FILE).unlink()
    monkeypatch.setenv("WAKEFUL_API", plane.endpoint.api)
    monkeypatch.setenv("WAKEFUL_TOKEN", TOKEN)
    assert await in_thread(lambda: main(["--data-dir", data_dir, "apps"])) == 0
    assert capsys.readouterr().out == "hello  active=None  versions=\n"
    assert await in_thread(lambda: main(["--data-dir", data_dir, "rollback", "nope"])) == 1
    assert capsys.readouterr().err == (
        "wakeful: error: the control plane answered 404: unknown app: no app named 'nope'\n"
    )

    monkeypatch.setenv("WAKEFUL_TOKEN", "wrong")
    assert await in_thread(lambda: main(["--data-dir", data_dir, "nodes"])) == 1
    assert "answered 401" in capsys.readouterr().err
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert await in_thread(lambda: main(["--api", nowhere, "nodes"])) == 1
    assert capsys.readouterr().err.startswith(
        f"wakeful: error: cannot reach the control plane at {nowhere}: "
    )


async def test_a_deploy_names_an_ingress_that_does_not_route_its_app_in_time(
    plane: Plane, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `wakeful deploy` prints once its rollout is done and an ingress is still behind
    (here one whose routes stopped at an older revision): a note, not a failure; nothing when
    every ingress routes it, or when the app is gone (404)."""
    written = await plane.store.put(keys.app("shop"), App(name="shop", active_version="v1"))
    seen = plane.routes_seen
    seen.saw("a", "edge-1", written)
    seen.saw("b", "edge-2", written - 1)
    done = {"app": "shop", "version": "v1", "phase": "done", "message": "live"}
    with ControlClient(plane.endpoint) as api:
        # What `wakeful deploy` and `rollback` do once their rollout is over.
        assert await in_thread(lambda: commands.follow_rollout(api, done, print, 0.05)) == 0
        assert capsys.readouterr().err == (
            f"wakeful: ingress edge-2 does not route shop as deployed yet (its routes at "
            f"revision {written - 1}, the app's record at {written}): a request there may get "
            "the previous version, or 404 for a new app, for a moment\n"
        )
        failed = {**done, "phase": "failed"}  # abandoned: nothing to wait for
        assert await in_thread(lambda: commands.follow_rollout(api, failed, print, 0.05)) == 1
        assert capsys.readouterr().err == ""
        seen.saw("b", "edge-2", written)
        await in_thread(lambda: commands.wait_routed(api, "shop", within=0.05))
        await in_thread(lambda: commands.wait_routed(api, "gone", within=0.05))
        assert capsys.readouterr().err == ""


async def test_a_node_stopped_for_good_is_listed_until_its_cordon_is_lifted(
    plane: Plane, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stopping agent cordons its node and lifts it when it is back: one that never comes
    back was listed `cordoned (not registered)` for good, with nothing said of how to remove
    it (the second walkthrough). It is `not running, cordoned`, and `wakeful drain N --undo`
    says it goes from the list; a running node's undo says it takes sandboxes again."""
    stopped = Cordon(node="n2", evacuate=False, since=1.0, by_agent=True)
    await plane.store.put(keys.cordon("n2"), stopped)
    await plane.store.put(keys.node("n1"), Node(name="n1", address="10.0.0.1"))
    await plane.store.put(keys.cordon("n1"), Cordon(node="n1", evacuate=False, since=1.0))
    with ControlClient(plane.endpoint) as api:
        await in_thread(lambda: commands.nodes(api))
        listed = capsys.readouterr().out.splitlines()
        assert [line.split("  ")[:2] for line in listed] == [
            ["n1", "cordoned"],
            ["n2", "not running, cordoned"],
        ]
        for node in ("n1", "n2"):
            await in_thread(
                lambda node=node: commands.drain(api, node, evacuate=True, force=False, undo=True)
            )
        assert capsys.readouterr().out.splitlines() == [
            "n1 takes new sandboxes again",
            "n2 is not running: uncordoned, and no longer listed until it starts again",
        ]
        assert [node["name"] for node in await in_thread(api.nodes)] == ["n1"]
        with pytest.raises(commands.CliError, match="no node named 'n3' is listed"):
            await in_thread(
                lambda: commands.drain(api, "n3", evacuate=True, force=False, undo=True)
            )
