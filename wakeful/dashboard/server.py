"""The dashboard: a page the control API serves at `/ui`, kept live by server-sent events.

- **Login.** `/ui` answers the login form until the browser holds a session: the admin token,
  posted once (never in a URL), becomes a cookie signed with HMAC-SHA256 under a key kept in
  the store (`ui/session-key`, made by the first control plane that needs it), so a session
  survives a restart and a change of leader. The cookie names the token and carries a keyed
  fingerprint of its digest: rotating or revoking the token ends every session made with it.
  It is `HttpOnly`, `SameSite=Strict`, scoped to `/ui`, `Secure` over HTTPS, and expires after
  `SESSION_SECONDS`.
- **Live.** `Dashboard` runs one loop per control plane (not one per browser, nor per row):
  every `interval` it records scale events (each pool record's `last_scale`, written in the
  same compare-and-set as the size), and while a browser listens, builds one snapshot of the
  apps, pools, sandboxes, nodes, rollouts, events and charts from what the process already
  holds (the activator's view and ledger, the pool controller's mirror, the traffic ring) and
  sends it to every stream when it changed. Rollouts are listed from the store every few
  seconds, only while someone watches; nodes that registered once come from the store probe.
  Streams are bounded (`MAX_STREAMS`, then 503 + Retry-After); each holds at most one unsent
  snapshot (a slow browser gets the newest).
- **Hostile input.** The login body is read up to `MAX_LOGIN_BYTES` (413 past it) before any
  token is known; a POST whose `Origin` is another site is refused (403). Every page carries a
  Content-Security-Policy that allows only this origin's script and style, and the page puts
  server data in with `textContent` only.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from importlib import resources
from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from wakeful.activator.core import Activator, PoolSnapshot, WakeTally
from wakeful.controller.mirror import Mirror
from wakeful.controller.plan import with_cordon
from wakeful.domain import keys
from wakeful.domain.models import (
    App,
    Role,
    RolloutRecord,
    SessionKey,
    Token,
)
from wakeful.store import AlreadyExists, Store, StoreError
from wakeful.store.tokenbook import TokenBook

log = logging.getLogger(__name__)

COOKIE = "wakeful_session"
SESSION_SECONDS = 12 * 3600
MAX_LOGIN_BYTES = 4096
MAX_STREAMS = 32
"""Event streams open at once, every browser together."""
MAX_APPS = 100
"""Apps in one snapshot, busiest first (the count says how many there are): a snapshot costs
the control plane's event loop time in proportion, every second someone watches."""
MAX_SANDBOXES = 500
"""Sandboxes listed in one snapshot (the count says how many there are)."""
MAX_EVENTS = 50
MAX_ROLLOUTS = 20
HEARTBEAT_SECONDS = 15.0
RESEND_SECONDS = 5.0
"""A snapshot goes out at least this often while it is unchanged: its ages move on."""
SHARE = 20
"""The loop waits at least this many times as long as its last snapshot took to build."""
LIST_SECONDS = 3.0
"""How often rollouts are listed from the store while someone watches."""

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: a browser then sends `Origin: null` with the login form's own post,
    # and the origin check below could not tell it from a post made elsewhere.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


async def session_key(store: Store) -> bytes:
    """The key sessions are signed with (`ui/session-key`): made once, by whichever control
    plane needs it first, and shared by every one after (restarts, new leaders)."""
    found = await store.get(keys.UI_SESSION_KEY, SessionKey)
    if found is None:
        made = SessionKey(key=secrets.token_hex(32), created_at=time.time())
        with contextlib.suppress(AlreadyExists):  # another control plane made it first
            await store.create(keys.UI_SESSION_KEY, made)
        found = await store.get(keys.UI_SESSION_KEY, SessionKey)
        if found is None:
            raise StoreError("the dashboard's session key vanished as it was made")
    return bytes.fromhex(found.value.key)


class Sessions:
    """Signed session cookies for admin tokens (see the module docstring)."""

    def __init__(
        self, key: bytes, tokens: TokenBook, clock: Callable[[], float] = time.time
    ) -> None:
        self._key = key
        self._tokens = tokens
        self._clock = clock

    def _sign(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def _fingerprint(self, token: Token) -> str:
        return self._sign("token:" + token.sha256)[:32]

    def issue(self, token: Token) -> str:
        expires = int(self._clock() + SESSION_SECONDS)
        payload = f"{token.name}|{self._fingerprint(token)}|{expires}"
        encoded = base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")
        return f"{encoded}.{self._sign(payload)}"

    def check(self, cookie: str | None) -> Token | None:
        """The admin token a cookie was issued for, while it is valid, current and unexpired."""
        if not cookie or len(cookie) > 1024:
            return None
        encoded, _, signature = cookie.partition(".")
        try:
            payload = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            return None
        if not hmac.compare_digest(self._sign(payload), signature):
            return None
        name, fingerprint, expires = [*payload.split("|"), "", "", ""][:3]
        if not expires.isdigit() or int(expires) < self._clock():
            return None
        token = self._tokens.by_name(name)
        if token is None or token.role is not Role.ADMIN:
            return None
        if not hmac.compare_digest(self._fingerprint(token), fingerprint):
            return None  # rotated since
        return token


class Dashboard:
    """One loop that keeps scale events and feeds every open event stream (module docstring)."""

    def __init__(
        self,
        activator: Activator,
        mirror: Callable[[], Mirror | None],
        store: Store,
        *,
        seen: Callable[[], Iterable[str]] = tuple,
        interval: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`seen`: every node that ever registered (the store probe's last listing of
        `seen/`, `wakeful.controller.health.StoreProbe`: listed once, not again here)."""
        self._activator = activator
        self._mirror = mirror
        self._seen = seen
        self._store = store
        self._interval = interval
        self._clock = clock
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_EVENTS)
        """Scale events, newest first."""
        self._seen_scales: dict[str, float] = {}
        """Per pool, the `last_scale.at` already recorded."""
        self._streams: set[asyncio.Queue[str]] = set()
        self._rollouts: list[RolloutRecord] = []
        self._listed_at = -LIST_SECONDS
        self._sent = ""
        self._sent_at = 0.0

    @property
    def watched(self) -> bool:
        return bool(self._streams)

    async def run(self) -> None:
        try:
            while True:
                took = 0.0
                try:
                    self._record_scales()
                    if self._streams:
                        await self._list_now_and_then()
                        started = time.perf_counter()
                        self._publish()
                        took = time.perf_counter() - started
                except Exception:  # a chart is never worth the control plane
                    log.exception("the dashboard could not build its snapshot")
                # At most ~5% of the event loop (leases, the API and the election share it):
                # with thousands of apps a snapshot takes longer, and comes less often.
                await anyio.sleep(max(self._interval, took * SHARE))
        finally:
            # The control plane stops: every stream ends now, so the API's graceful shutdown
            # does not wait on them (a browser reconnects to whoever serves next).
            for queue in self._streams:
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait("")

    def _record_scales(self) -> None:
        mirror = self._mirror()
        if mirror is None:
            return
        fresh: list[dict[str, Any]] = []
        for item in mirror.pools.items.values():
            pool = item.value
            change = pool.last_scale
            if change is None or self._seen_scales.get(pool.name) == change.at:
                continue
            self._seen_scales[pool.name] = change.at
            fresh.append(
                {
                    "at": change.at,
                    "app": pool.app,
                    "pool": pool.name,
                    "kind": "scale_up"
                    if change.to_instances > change.from_instances
                    else ("scale_down"),
                    "from": change.from_instances,
                    "to": change.to_instances,
                    "reason": change.reason,
                }
            )
        for event in sorted(fresh, key=lambda e: float(e["at"])):
            self.events.appendleft(event)
        gone = set(self._seen_scales) - {i.value.name for i in mirror.pools.items.values()}
        for name in gone:
            del self._seen_scales[name]

    async def _list_now_and_then(self) -> None:
        """Rollouts, from the store every `LIST_SECONDS` (a store away keeps the last
        listing; the page shows the rest)."""
        now = time.monotonic()
        if now - self._listed_at < LIST_SECONDS:
            return
        self._listed_at = now
        try:
            with anyio.fail_after(2):
                rollouts = await self._store.list(keys.ROLLOUTS, RolloutRecord)
        except (StoreError, TimeoutError) as exc:
            log.debug("dashboard could not list rollouts: %s", exc)
            return
        records = sorted((i.value for i in rollouts.items), key=lambda r: -r.started_at)
        self._rollouts = records[:MAX_ROLLOUTS]

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        pools = self._activator.snapshot()
        ready = {p.pool: p.ready for p in pools}
        by_app: dict[str, list[PoolSnapshot]] = collections.defaultdict(list)
        for counted in pools:
            by_app[counted.app].append(counted)

        def busy(record: App) -> tuple[bool, str]:
            mine = by_app.get(record.name, ())
            return (not any(p.live or p.waiters or p.desired_instances for p in mine), record.name)

        known = self._activator.apps()
        apps = []
        for record in sorted(known, key=busy)[:MAX_APPS]:
            mine = sorted(
                by_app.get(record.name, ()),
                key=lambda p: (p.version != record.active_version, p.pool),
            )
            apps.append(
                {
                    "app": record.name,
                    "version": record.active_version,
                    "hosts": list(record.hosts),
                    "pools": [
                        {
                            "pool": p.pool,
                            "version": p.version,
                            "state": p.state,
                            "desired": p.desired_instances,
                            "live": p.live,
                            "ready": p.ready,
                            "suspended": p.suspended,
                            "leased": p.leased,
                            "overflow": p.overflow,
                            "waiters": p.waiters,
                        }
                        for p in mine
                    ],
                    "series": self._activator.traffic.series(record.name, now),
                    "wakes": _wakes(self._activator.wakes(record.name)),
                }
            )
        mirror = self._mirror()
        sandboxes: list[dict[str, Any]] = []
        nodes: list[dict[str, Any]] = []
        total = 0
        if mirror is not None:
            records = sorted(
                (i.value for i in mirror.sandboxes.items.values()),
                key=lambda s: (s.node or "", s.app, s.id),
            )
            total = len(records)
            for sandbox in records[:MAX_SANDBOXES]:
                sandboxes.append(
                    {
                        "id": sandbox.id,
                        "app": sandbox.app,
                        "pool": sandbox.pool,
                        "node": sandbox.node,
                        "status": sandbox.status.value,
                        "ready": sandbox.ready,
                        "created_at": sandbox.created_at or None,
                    }
                )
            per_node = collections.Counter(s.node for s in records if s.node)
            cordons = {i.value.node: i.value for i in mirror.cordons.items.values()}
            registered = {}
            for item in mirror.nodes.items.values():
                node = with_cordon(item.value, cordons.get(item.value.name))
                registered[node.name] = node
            for name in sorted(set(registered) | set(self._seen())):
                found = registered.get(name)
                cordon = cordons.get(name)
                nodes.append(
                    {
                        "name": name,
                        "registered": found is not None,
                        "cordoned": found.cordoned if found else cordon is not None,
                        "evacuating": (
                            found.evacuating if found else bool(cordon and cordon.evacuate)
                        ),
                        "sandboxes": per_node.get(name, 0),
                        "reachable": found.tunnel.reachable if found and found.tunnel else None,
                    }
                )
        rollouts = [
            {
                "app": r.app,
                "version": r.version,
                "phase": r.phase,
                "ready": ready.get(r.pool, 0),
                "target_ready": r.target_ready,
                "message": r.message[:500],
                "started_at": r.started_at,
            }
            for r in self._rollouts
        ]
        return {
            "at": now,
            "apps": apps,
            "apps_total": len(known),
            "sandboxes": sandboxes,
            "sandboxes_total": total,
            "events": list(self.events),
            "rollouts": rollouts,
            "nodes": nodes,
        }

    def _publish(self) -> None:
        snapshot = self.snapshot()
        at = snapshot.pop("at")
        body = json.dumps(snapshot, separators=(",", ":"))
        if body == self._sent and at - self._sent_at < RESEND_SECONDS:
            return
        self._sent, self._sent_at = body, at
        message = f'event: snapshot\ndata: {body[:-1]},"at":{at!r}}}\n\n'  # one encoding
        for queue in self._streams:
            if queue.full():  # a browser that reads slowly gets the newest, never a backlog
                queue.get_nowait()
            queue.put_nowait(message)

    def open_stream(self) -> asyncio.Queue[str] | None:
        """A queue of snapshot messages for one more event stream (the current state comes
        first), or None at `MAX_STREAMS`. Counted here, in the same step as the check, so
        streams opened at once cannot pass the bound together; `close_stream` gives it back."""
        if len(self._streams) >= MAX_STREAMS:
            return None
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._streams.add(queue)
        self._sent = ""
        return queue

    def close_stream(self, queue: asyncio.Queue[str]) -> None:
        self._streams.discard(queue)


class _EventStream(StreamingResponse):
    """A stream that gives its place back however it ends, also when its client left before
    the first byte (Starlette then never starts the body's generator, whose own `finally`
    would never run)."""

    def __init__(self, content: AsyncIterator[str], done: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={**HEADERS, "X-Accel-Buffering": "no"},
        )
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


def _asset(name: str) -> bytes:
    return resources.files("wakeful.dashboard.ui").joinpath(name).read_bytes()


def dashboard_router(dashboard: Dashboard, sessions: Sessions, tokens: TokenBook) -> APIRouter:
    """`/ui` and its parts. Their access is `SESSION` (`wakeful.activator.roles`): no bearer
    token; each checks the session cookie itself."""
    router = APIRouter(include_in_schema=False)
    login_page = _asset("login.html").decode()
    page = _asset("dashboard.html")
    script = _asset("dashboard.js")
    style = _asset("dashboard.css")

    def html(body: str | bytes, status: int = 200) -> Response:
        return Response(body, status, headers=HEADERS, media_type="text/html; charset=utf-8")

    def login_form(error: str = "", status: int = 200) -> Response:
        # `error` is one of the fixed sentences below: nothing a client sent.
        return html(login_page.replace("<!--error-->", error), status)

    def unauthorized() -> Response:
        return Response(
            '{"error":"unauthorized","detail":"log in at /ui"}',
            401,
            headers=HEADERS,
            media_type="application/json",
        )

    def session(request: Request) -> Token | None:
        return sessions.check(request.cookies.get(COOKIE))

    @router.get("/ui")
    async def ui(request: Request) -> Response:
        return html(page) if session(request) is not None else login_form()

    @router.get("/ui/dashboard.js")
    async def ui_script() -> Response:
        return Response(script, headers=HEADERS, media_type="text/javascript; charset=utf-8")

    @router.get("/ui/dashboard.css")
    async def ui_style() -> Response:
        return Response(style, headers=HEADERS, media_type="text/css; charset=utf-8")

    @router.post("/ui/login")
    async def login(request: Request) -> Response:
        if not _same_origin(request):
            return login_form("This form was posted from another site.", 403)
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/x-www-form-urlencoded":
            return login_form("The form was not sent as a form.", 415)
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_LOGIN_BYTES:
                    return login_form("That is far longer than a token.", 413)
        except ClientDisconnect:  # it left mid-body: nobody reads an answer, nothing to log
            return Response(status_code=400, headers=HEADERS)
        try:
            fields = urllib.parse.parse_qs(body.decode("latin-1"), max_num_fields=8)
        except ValueError:  # more fields than a login form has
            return login_form("The form had more fields than a login form has.", 400)
        secret = (fields.get("token") or [""])[0].strip()
        token = tokens.verify(secret) if secret else None
        if token is None:
            return login_form("That token is not valid.", 401)
        if token.role is not Role.ADMIN:
            return login_form(
                f"That is a {token.role.value} token: the dashboard needs the admin token.", 403
            )
        answer = Response(status_code=303, headers={**HEADERS, "Location": "/ui"})
        answer.set_cookie(
            COOKIE,
            sessions.issue(token),
            max_age=SESSION_SECONDS,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        log.info("dashboard login with token %s", token.name)
        return answer

    @router.post("/ui/logout")
    async def logout(request: Request) -> Response:
        if not _same_origin(request):
            return login_form("This form was posted from another site.", 403)
        answer = Response(status_code=303, headers={**HEADERS, "Location": "/ui"})
        answer.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return answer

    @router.get("/ui/session")
    async def ui_session(request: Request) -> Response:
        token = session(request)
        if token is None:
            return unauthorized()
        body = json.dumps({"token": token.name})
        return Response(body, headers=HEADERS, media_type="application/json")

    @router.get("/ui/events")
    async def events(request: Request) -> Response:
        cookie = request.cookies.get(COOKIE)
        if sessions.check(cookie) is None:
            return unauthorized()
        queue = dashboard.open_stream()
        if queue is None:
            return Response(
                '{"error":"busy","detail":"too many dashboards open"}',
                503,
                headers={**HEADERS, "Retry-After": "5"},
                media_type="application/json",
            )

        async def messages() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            while True:
                try:
                    with anyio.fail_after(HEARTBEAT_SECONDS):
                        message = await queue.get()
                except TimeoutError:
                    message = ": still here\n\n"
                if not message:  # the control plane stops
                    return
                if sessions.check(cookie) is None:  # revoked, rotated or expired
                    yield "event: ended\ndata: {}\n\n"
                    return
                yield message

        return _EventStream(messages(), lambda: dashboard.close_stream(queue))

    return router


def _same_origin(request: Request) -> bool:
    """A form post from this origin, or from a client that is no browser (curl: no Origin, no
    `Sec-Fetch-Site`). A browser says where a post comes from in both."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    parsed = urllib.parse.urlsplit(origin)
    return parsed.netloc == host and parsed.scheme in ("http", "https")


def _wakes(tally: WakeTally | None) -> dict[str, Any] | None:
    """How an app's waiting requests woke it: by `thaw` of a suspended sandbox or `start`."""
    if tally is None:
        return None
    return {
        "thaw": tally.thaw,
        "start": tally.start,
        "last_kind": tally.last_kind,
        "last_ms": round(tally.last_seconds * 1000, 1),
        "last_at": tally.last_at,
    }
