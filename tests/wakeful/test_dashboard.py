"""The dashboard's server side (`wakeful.dashboard`) on a real control plane: the login
and its session cookie (signed under a key in the store, bound to the token), hostile posts,
and the event stream. The page itself is driven in a real browser in
tests/e2e/test_dashboard_browser.py."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from pydantic import ValidationError

from tests.support.control import Running, running_control_plane
from wakeful.controller.mirror import Mirror
from wakeful.dashboard.live import MAX_STREAMS, Dashboard
from wakeful.dashboard.sessions import COOKIE, SESSION_SECONDS, Sessions
from wakeful.domain import keys
from wakeful.domain.logbatch import LogBatch, OutputChunk
from wakeful.domain.models import App, AppSpec, Pool, Role, Sandbox, ScaleChange
from wakeful.store import open_store
from wakeful.store.tokenbook import TokenBook
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio


async def log_in(url: str, secret: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url) as http:
        return await http.post("/ui/login", data={"token": secret})


def session_of(answer: httpx.Response) -> str:
    cookie = answer.cookies.get(COOKIE)
    assert cookie, answer.headers
    return cookie


async def session_status(url: str, cookie: str) -> int:
    async with httpx.AsyncClient(base_url=url, cookies={COOKIE: cookie}) as http:
        return (await http.get("/ui/session")).status_code


async def test_the_page_is_a_login_form_until_the_admin_token_is_posted(tmp_path: Path) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        page = await http.get("/ui")
        assert page.status_code == 200
        assert 'id="login"' in page.text and "EventSource" not in page.text
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert (await http.get("/ui/session")).status_code == 401
        assert (await http.get("/ui/events")).status_code == 401
        bearer = {"Authorization": f"Bearer {running.token}"}  # a session, not a bearer token
        assert (await http.get("/ui/events", headers=bearer)).status_code == 401

        wrong = await http.post("/ui/login", data={"token": "not-the-token"})
        assert wrong.status_code == 401 and "not valid" in wrong.text
        assert COOKIE not in wrong.cookies

        answer = await http.post("/ui/login", data={"token": running.token})
        assert answer.status_code == 303 and answer.headers["location"] == "/ui"
        assert running.token not in answer.headers["location"]
        set_cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie
        assert "Path=/ui" in set_cookie
        assert running.token not in set_cookie  # a signature over a fingerprint, not the secret
        cookie = session_of(answer)
        http.cookies.set(COOKIE, cookie)
        page = await http.get("/ui")
        assert 'id="apps"' in page.text and 'id="login"' not in page.text
        assert (await http.get("/ui/session")).json() == {"token": "admin"}
        # The bearer-token API is not opened by a session cookie.
        assert (await http.get("/v1/pools")).status_code == 401


async def test_tokens_of_other_roles_are_refused_and_a_rotated_token_ends_its_sessions(
    tmp_path: Path,
) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as api,
    ):
        made = {}
        for name, role in (("n1", "node"), ("edge", "ingress"), ("ops", "admin")):
            answer = await api.post("/v1/tokens", json={"name": name, "role": role})
            assert answer.status_code == 201, answer.text
            made[name] = answer.json()["secret"]
        for name in ("n1", "edge"):
            refused = await log_in(running.url, made[name])
            assert refused.status_code == 403 and "needs the admin token" in refused.text
            assert COOKIE not in refused.cookies

        ops = session_of(await log_in(running.url, made["ops"]))
        admin = session_of(await log_in(running.url, running.token))
        assert await session_status(running.url, ops) == 200
        assert (await api.post("/v1/tokens/ops/rotate")).status_code == 200
        assert await session_status(running.url, ops) == 401  # its secret changed
        assert await session_status(running.url, admin) == 200
        # A new session with the new secret works; revoking the token ends it.
        rotated = (await api.get("/v1/tokens")).json()
        assert any(t["name"] == "ops" for t in rotated)
        assert (await api.delete("/v1/tokens/ops")).status_code == 200
        assert await session_status(running.url, ops) == 401


async def test_a_session_survives_a_restart_and_a_forged_one_is_refused(tmp_path: Path) -> None:
    async with open_store("memory://") as store:
        async with running_control_plane(tmp_path, store=store) as first:
            cookie = session_of(await log_in(first.url, first.token))
        async with running_control_plane(tmp_path, store=store) as second:
            # Another process (a restart, a new leader): the key is the store's, not its own.
            assert await session_status(second.url, cookie) == 200
            encoded, _, signature = cookie.partition(".")
            flipped = signature[:-1] + ("0" if signature[-1] != "0" else "1")
            for forged in (f"{encoded}.{flipped}", encoded, "", "x" * 5000, "a.b.c"):
                assert await session_status(second.url, forged) == 401, forged
    async with running_control_plane(tmp_path / "other") as elsewhere:
        # A store of its own has a key of its own: a cookie from another cluster means nothing.
        assert await session_status(elsewhere.url, cookie) == 401


@pytest.mark.parametrize(
    ("headers", "content", "status"),
    [
        ({"content-type": "application/x-www-form-urlencoded"}, b"token=" + b"a" * 8000, 413),
        ({"content-type": "application/json"}, b'{"token": "x"}', 415),
        (
            {
                "content-type": "application/x-www-form-urlencoded",
                "origin": "https://evil.example",
            },
            b"token=x",
            403,
        ),
        ({"content-type": "application/x-www-form-urlencoded"}, b"token=%ff%fe&&&=", 401),
        ({"content-type": "application/x-www-form-urlencoded"}, b"a=1&" * 200, 400),
    ],
    ids=["too-long", "not-a-form", "cross-site", "garbage", "many-fields"],
)
async def test_hostile_logins_get_a_clear_4xx(
    tmp_path: Path, headers: dict[str, str], content: bytes, status: int
) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        answer = await http.post("/ui/login", headers=headers, content=content)
        assert answer.status_code == status, answer.text
        assert COOKIE not in answer.cookies
        assert 'id="login-error"' in answer.text


async def snapshots(running: Running, cookie: str) -> AsyncIterator[dict[str, Any]]:
    async with (
        httpx.AsyncClient(base_url=running.url, cookies={COOKIE: cookie}, timeout=30) as http,
        http.stream("GET", "/ui/events") as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        async for line in stream.aiter_lines():
            if line.startswith("data: ") and line != "data: {}":
                yield json.loads(line[6:])


async def test_the_event_stream_carries_apps_pools_and_scale_events(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        cookie = session_of(await log_in(running.url, running.token))
        spec = AppSpec(command=["true"])
        await running.store.put(keys.app("web"), App(name="web", active_version="v1"))
        pool = Pool(name="web-v1", app="web", version="v1", spec=spec)
        revision = await running.store.put(keys.pool("web-v1"), pool)
        with anyio.fail_after(30):
            async for snapshot in snapshots(running, cookie):
                apps = {a["app"]: a for a in snapshot["apps"]}
                if "web" in apps and apps["web"]["pools"]:
                    break
        web = apps["web"]
        assert web["version"] == "v1"
        assert web["pools"][0] | {"desired": 0, "ready": 0} == web["pools"][0]
        assert len(web["series"]["requests_per_s"]) == 90
        assert snapshot["events"] == []

        change = ScaleChange(
            at=1000.0,
            by="demand",
            from_instances=0,
            to_instances=3,
            reason="demand: 0 leased + 25 waiting at 10 per sandbox",
        )
        grown = pool.model_copy(update={"desired_instances": 3, "last_scale": change})
        await running.store.update(keys.pool("web-v1"), grown, expect_revision=revision)
        with anyio.fail_after(30):
            async for snapshot in snapshots(running, cookie):
                if snapshot["events"]:
                    break
        assert snapshot["events"] == [
            {
                "at": 1000.0,
                "app": "web",
                "pool": "web-v1",
                "kind": "scale_up",
                "from": 0,
                "to": 3,
                "reason": "demand: 0 leased + 25 waiting at 10 per sandbox",
            }
        ]
        assert snapshot["apps"][0]["pools"][0]["desired"] == 3


async def test_event_streams_are_bounded(tmp_path: Path) -> None:
    async with running_control_plane(tmp_path) as running:
        cookie = session_of(await log_in(running.url, running.token))
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=running.url,
                    cookies={COOKIE: cookie},
                    timeout=30,
                    limits=httpx.Limits(max_connections=MAX_STREAMS + 8),
                )
            )
            readers = []  # each stream's reader, kept: one collected would close its stream
            for _ in range(MAX_STREAMS):
                stream = await stack.enter_async_context(http.stream("GET", "/ui/events"))
                assert stream.status_code == 200
                readers.append(stream.aiter_lines())
                with anyio.fail_after(30):  # registered once its first line is out
                    assert await anext(readers[-1]) == "retry: 2000"
            busy = await http.get("/ui/events")
            assert busy.status_code == 503 and busy.headers["retry-after"] == "5"


async def test_a_closed_stream_gives_its_place_back_and_streams_end_with_the_control_plane(
    tmp_path: Path,
) -> None:
    async with running_control_plane(tmp_path) as running:
        cookie = session_of(await log_in(running.url, running.token))
        async with httpx.AsyncClient(
            base_url=running.url,
            cookies={COOKIE: cookie},
            timeout=30,
            limits=httpx.Limits(max_connections=MAX_STREAMS + 8),
        ) as http:
            async with contextlib.AsyncExitStack() as stack:
                readers = []
                for _ in range(MAX_STREAMS):
                    stream = await stack.enter_async_context(http.stream("GET", "/ui/events"))
                    readers.append(stream.aiter_lines())
                    with anyio.fail_after(30):
                        assert await anext(readers[-1]) == "retry: 2000"
                assert (await http.get("/ui/events")).status_code == 503
            # All closed by their clients: every place is free again.
            with anyio.fail_after(30):
                while (await http.get("/ui/session")).status_code == 200:
                    async with http.stream("GET", "/ui/events") as again:
                        if again.status_code == 200:
                            break
                    await anyio.sleep(0.05)
        async with (
            httpx.AsyncClient(base_url=running.url, cookies={COOKIE: cookie}, timeout=60) as http,
            http.stream("GET", "/ui/events") as stream,
        ):
            lines = stream.aiter_lines()
            assert await anext(lines) == "retry: 2000"
            ended = anyio.Event()

            async def read_to_the_end() -> None:
                async for _ in lines:  # a clean end of the body, not a connection cut
                    pass
                ended.set()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read_to_the_end)
                # Stopping the control plane ends the stream (its graceful shutdown does
                # not wait on it): the reader sees the body end, not an error.
                running.plane.tasks.cancel_scope.cancel()
                with anyio.fail_after(30):
                    await ended.wait()


async def test_an_open_stream_ends_when_its_token_is_revoked(tmp_path: Path) -> None:
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(
            base_url=running.url, headers={"Authorization": f"Bearer {running.token}"}
        ) as api,
    ):
        secret = (await api.post("/v1/tokens", json={"name": "ops", "role": "admin"})).json()
        cookie = session_of(await log_in(running.url, secret["secret"]))
        seen: list[str] = []
        async with (
            httpx.AsyncClient(base_url=running.url, cookies={COOKIE: cookie}, timeout=60) as http,
            http.stream("GET", "/ui/events") as stream,
        ):
            with anyio.fail_after(60):
                async for line in stream.aiter_lines():
                    seen.append(line)
                    if line == "event: snapshot" and len(seen) < 10:
                        assert (await api.delete("/v1/tokens/ops")).status_code == 200
        assert "event: ended" in seen  # told, then the body ended


def test_a_session_expires_after_its_lifetime() -> None:
    clock = ManualClock(1_000_000.0)
    tokens = TokenBook.of({"secret": Role.ADMIN})
    sessions = Sessions(b"k" * 32, tokens, clock=clock)
    token = tokens.verify("secret")
    assert token is not None
    cookie = sessions.issue(token)
    clock.advance(SESSION_SECONDS - 1)
    assert sessions.check(cookie) == token
    clock.advance(2)
    assert sessions.check(cookie) is None
    assert Sessions(b"x" * 32, tokens, clock=clock).check(sessions.issue(token)) is None


@pytest.mark.parametrize("number", ["-1e999", "1e999", "NaN", "Infinity"])
def test_a_record_holding_an_infinite_time_is_refused(number: str) -> None:
    """JSON has no infinity: a sandbox record with one (a hostile node can write `-1e999` to
    etcd; our own writes cannot) would make every browser refuse every snapshot while it
    exists. Every stored model refuses it, so every reader counts the record as invalid."""
    with pytest.raises(ValidationError, match="finite number"):
        Sandbox.model_validate_json(
            f'{{"id": "evil", "pool": "web-v1", "app": "web", "created_at": {number}}}'
        )


async def test_a_stopping_dashboard_ends_every_stream_at_once(tmp_path: Path) -> None:
    """So the control API's graceful shutdown (10 s for requests in flight) does not wait on
    browsers that would never leave by themselves."""
    async with running_control_plane(tmp_path) as running:
        dashboard = Dashboard(running.plane.activator, lambda: None, running.store)
        queue = dashboard.open_stream()
        assert queue is not None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(dashboard.run)
            await anyio.lowlevel.checkpoint()
            tasks.cancel_scope.cancel()
        assert queue.get_nowait() == ""  # the end, for `messages` to return on


async def test_a_snapshot_that_fails_is_logged_and_the_loop_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant 19: an observing loop never ends its process. The pool controller's mirror
    raising once must not end the dashboard (nor, through its task group, the control
    plane); the next tick serves, with nodes that registered once from the store probe."""
    failures = [RuntimeError("a mirror that broke once")]

    def mirror() -> Mirror:
        if failures:
            raise failures.pop()
        return Mirror()

    async with running_control_plane(tmp_path) as running:
        dashboard = Dashboard(
            running.plane.activator,
            mirror,
            running.store,
            seen=lambda: {"gone-node"},
            interval=0.01,
        )
        queue = dashboard.open_stream()
        assert queue is not None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(dashboard.run)
            with anyio.fail_after(30):
                message = await queue.get()
            tasks.cancel_scope.cancel()
    assert "could not build its snapshot" in caplog.text and not failures
    snapshot = json.loads(message.split("data: ", 1)[1])
    assert snapshot["nodes"] == [
        {
            "name": "gone-node",
            "registered": False,
            "cordoned": False,
            "evacuating": False,
            "sandboxes": 0,
            "reachable": None,
        }
    ]


async def test_the_logs_panel_shows_an_apps_newest_lines_behind_the_session(
    tmp_path: Path,
) -> None:
    """Issue 40: an app's newest output and access lines, from the log directory, as text with
    what the app controls shown as escapes; only with a session."""
    async with (
        running_control_plane(tmp_path) as running,
        httpx.AsyncClient(base_url=running.url) as http,
    ):
        await running.store.put("apps/hello", App(name="hello"))
        chunk = OutputChunk(
            sandbox="sb-1", app="hello", created_at=1, offset=0, size=14, text="ready \x1b[2J ok\n"
        )
        await running.plane.logbook.ship(
            LogBatch(node="n1", interval=1, pending=0, dropped=0, chunks=[chunk])
        )
        access = {
            "ts": time.time(),
            "app": "hello",
            "sandbox": "sb-1",
            "method": "GET",
            "path": "/x",
        }
        running.plane.logbook.take_access("edge", [access | {"status": 200, "bytes": 2, "ms": 1}])
        assert (await http.get("/ui/logs?app=hello")).status_code == 401
        cookie = session_of(await log_in(running.url, running.token))

        async def panel() -> dict[str, list[str]]:
            async with httpx.AsyncClient(base_url=running.url, cookies={COOKIE: cookie}) as ui:
                answer = await ui.get("/ui/logs?app=hello")
            assert answer.status_code == 200
            return dict(answer.json())

        with anyio.fail_after(10):
            while not (shown := await panel())["access"]:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert [line.split(" ", 1)[1] for line in shown["output"]] == ["[sb-1] ready \\x1b[2J ok"]
        assert shown["access"][0].endswith("[sb-1] GET /x 200 2B 1ms")
        async with httpx.AsyncClient(base_url=running.url, cookies={COOKIE: cookie}) as ui:
            assert (await ui.get("/ui/logs?app=Nope")).status_code == 404
