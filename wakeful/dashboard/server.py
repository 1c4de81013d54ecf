"""The dashboard's routes: `/ui` and its parts, on the control API.

- **Login.** `/ui` answers the login form until the browser holds a session (`sessions.py`):
  the admin token, posted once to `/ui/login` (never in a URL), becomes a cookie that is
  `HttpOnly`, `SameSite=Strict`, scoped to `/ui`, `Secure` over HTTPS, and expires after
  `SESSION_SECONDS`.
- **Live.** `/ui/events` is a server-sent event stream of snapshots, fed by the one
  `Dashboard` loop (`live.py`); past `MAX_STREAMS` it answers 503 + Retry-After. A stream
  checks its session before each message and ends when the session does.
- **Hostile input.** The login body is read up to `MAX_LOGIN_BYTES` (413 past it) before any
  token is known; a POST whose `Origin` is another site is refused (403). Every page carries a
  Content-Security-Policy that allows only this origin's script and style, and the page puts
  server data in with `textContent` only.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from wakeful.deploy import logread
from wakeful.domain.logfiles import KINDS, Kind, line_text, short_time
from wakeful.domain.models import NAME_PATTERN, Role, Token
from wakeful.domain.shown import shown
from wakeful.store.tokenbook import TokenBook

from .live import Dashboard
from .sessions import COOKIE, SESSION_SECONDS, Sessions

log = logging.getLogger(__name__)

MAX_LOGIN_BYTES = 4096
LOG_LINES = 50
"""Lines of each kind the dashboard's logs panel shows."""
HEARTBEAT_SECONDS = 15.0

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


def dashboard_router(
    dashboard: Dashboard, sessions: Sessions, tokens: TokenBook, logs: Path | None = None
) -> APIRouter:
    """`/ui` and its parts. Their access is `SESSION` (`wakeful.activator.roles`): no bearer
    token; each checks the session cookie itself. `logs`: the log directory, whose newest
    lines of an app `/ui/logs?app=APP` shows."""
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

    @router.get("/ui/logs")
    async def app_logs(request: Request, app: str = "") -> Response:
        """The app's newest `LOG_LINES` lines of output and of its access log, as text."""
        if session(request) is None:
            return unauthorized()
        if logs is None or not re.fullmatch(NAME_PATTERN, app):
            return Response('{"error":"unknown app"}', 404, headers=HEADERS)
        found = {
            kind: await anyio.to_thread.run_sync(
                logread.tail, logs, app, kind, logread.Query(), LOG_LINES
            )
            for kind in KINDS
        }
        body = {kind: [_shown_line(line, kind) for line in lines] for kind, lines in found.items()}
        return Response(json.dumps(body), headers=HEADERS, media_type="application/json")

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


def _shown_line(line: bytes, kind: Kind) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        return ""
    return f"{short_time(record)} {shown(line_text(record, kind))}"


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
