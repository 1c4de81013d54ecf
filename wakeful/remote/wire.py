"""What every client of the control API from outside the control plane shares: where the API
is and the bearer token it wants (`Endpoint`), a name made one path segment, and an error
answer read as one line.

The token goes in a header, never in a URL, never in a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

import httpx


@dataclass(frozen=True)
class Endpoint:
    """Where the control API is, and the bearer token it wants."""

    api: str
    """One URL; for a node or an ingress, possibly several, comma-separated: every activator
    that may lead (`apis`)."""
    token: str = field(repr=False)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def apis(self) -> list[str]:
        return [url.strip() for url in self.api.split(",") if url.strip()]


def segment(name: str) -> str:
    """A name as one path segment: a `?` or `#` in it cannot cut the path short."""
    return quote(name, safe="")


def reason(answer: httpx.Response) -> str:
    """An error answer in one line: the control API's `{"error", "detail"}` body, else text."""
    try:
        body = answer.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return f"{body['error']}: {body.get('detail')}"
    if isinstance(body, dict) and "detail" in body:  # FastAPI's own answers (an unknown route)
        return str(body["detail"])
    return " ".join(answer.text.split())[:300]  # a proxy's HTML page, say: on one line
