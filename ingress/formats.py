"""Error answers in the client's format, with one stable shape.

JSON `{"error", "detail", "request_id"[, "log"]}` for clients that accept JSON, a short HTML
page for browsers, plain text otherwise. Pure: the edge sends what these return.

A detail or a boot log can hold text an app wrote, and a text or HTML answer often lands on a
terminal (`curl`): there, control characters are shown as escapes (`wakeful.domain.shown`),
newlines kept in the log. The JSON answer has the exact text, its control characters escaped
as JSON escapes them.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from wakeful.domain.leases import ActivatorError, AppFailedToBoot, Unavailable, UnknownApp
from wakeful.domain.shown import CONTINUED, shown
from wakeful.ingress.errors import (
    ActivatorUnreachable,
    BadRequest,
    ClientBusy,
    ClientTooSlow,
    HeadersTooLarge,
    NoRoute,
    UpstreamBusy,
    UpstreamError,
    UpstreamTimeout,
)

CLIENT_GONE: Final = 499
"""nginx's code for a client that left before its answer: logged and counted, never sent."""


class Format(StrEnum):
    JSON = "json"
    HTML = "html"
    TEXT = "text"


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    status: int
    error: str
    detail: str
    retry_after: int | None = None
    log: str | None = None


def choose_format(accept: str) -> Format:
    """JSON when asked for by name, HTML for browsers, text for everything else (curl's */*).

    Browsers send `text/html,...,*/*;q=0.8`, so `text/html` is checked before `*/*` matters;
    JSON wins a tie because API clients that send both want the machine-readable shape.
    """
    kinds = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    if kinds & {"application/json", "application/problem+json"} or any(
        kind.endswith("+json") for kind in kinds
    ):
        return Format.JSON
    if "text/html" in kinds or "application/xhtml+xml" in kinds:
        return Format.HTML
    return Format.TEXT


def render(
    answer: ErrorAnswer, fmt: Format, request_id: str
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The body and headers (content type, Retry-After) of an error answer."""
    headers: list[tuple[bytes, bytes]] = []
    if answer.retry_after is not None:
        headers.append((b"retry-after", str(answer.retry_after).encode()))
    if fmt is Format.JSON:
        doc: dict[str, str] = {"error": answer.error, "detail": answer.detail}
        if answer.log is not None:
            doc["log"] = answer.log
        doc["request_id"] = request_id
        body = json.dumps(doc).encode()
        content_type = b"application/json"
    elif fmt is Format.HTML:
        error, detail = html.escape(shown(answer.error)), html.escape(shown(answer.detail))
        log = f"<pre>{html.escape(shown(answer.log, multiline=True))}</pre>\n" if answer.log else ""
        body = (
            "<!doctype html>\n<html><head><meta charset=utf-8>"
            f"<title>{answer.status} {error}</title></head>\n"
            f"<body><h1>{answer.status} {error}</h1>\n"
            f"<p>{detail}</p>\n{log}"
            f"<p><small>request {html.escape(shown(request_id))}</small></p></body></html>\n"
        ).encode()
        content_type = b"text/html; charset=utf-8"
    else:
        log = f"\n{CONTINUED}{shown(answer.log, multiline=True, indent=True)}" if answer.log else ""
        body = f"{answer.status} {shown(answer.error)}: {shown(answer.detail)}{log}\n".encode()
        content_type = b"text/plain; charset=utf-8"
    headers.append((b"content-type", content_type))
    headers.append((b"content-length", str(len(body)).encode()))
    return body, headers


def answer_for(exc: Exception, show_boot_log: bool = False) -> ErrorAnswer:
    """The status and shape of an error answer, for errors raised before the answer started.

    An app's boot log goes to anonymous clients only when `show_boot_log` says so: it can hold
    configuration, paths and secrets. Operators read it with `wakeful logs`.
    """
    if isinstance(exc, NoRoute):
        return ErrorAnswer(404, "unknown host", str(exc))
    if isinstance(exc, UnknownApp):
        return ErrorAnswer(404, "unknown app", str(exc))
    if isinstance(exc, ClientTooSlow):
        return ErrorAnswer(408, "request timeout", str(exc))
    if isinstance(exc, HeadersTooLarge):
        return ErrorAnswer(431, "request header fields too large", str(exc))
    if isinstance(exc, BadRequest):
        return ErrorAnswer(400, "bad request", str(exc))
    if isinstance(exc, AppFailedToBoot):
        log_lines = exc.log if show_boot_log else None
        return ErrorAnswer(503, "app failed to boot", str(exc), exc.retry_after, log_lines)
    if isinstance(exc, Unavailable):
        return ErrorAnswer(503, "no capacity", str(exc), exc.retry_after)
    if isinstance(exc, ClientBusy):
        return ErrorAnswer(429, "too many requests", str(exc), exc.retry_after)
    if isinstance(exc, UpstreamBusy):
        return ErrorAnswer(503, "upstream busy", str(exc), exc.retry_after)
    if isinstance(exc, ActivatorUnreachable | ActivatorError):
        return ErrorAnswer(503, "activator unavailable", str(exc), 5)
    if isinstance(exc, UpstreamTimeout):
        return ErrorAnswer(504, "upstream timed out", str(exc))
    if isinstance(exc, UpstreamError):
        return ErrorAnswer(502, "upstream failed", str(exc))
    return ErrorAnswer(500, "internal error", f"{type(exc).__name__}: {exc}")
