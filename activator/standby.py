"""What an activator serves on its control API's port while another one leads.

`/healthz` answers 200 (the process is up), and `/metrics` the standby's own (whether the
store answers it, and `wakeful_activator_leading 0`: a Prometheus that scrapes every activator
sees the store from each, and which one leads); everything else, `/readyz` included, answers
503 with Retry-After and says where the leader is, so a load balancer that checks `/readyz`
sends traffic to the leader only, and a person pointing the CLI at a standby reads why it
refused. A WebSocket (the lease channel) is accepted and closed at once with 1013 ("try again
later"): an ingress that reached a standby looks the leader up again. No token is checked: a
standby serves nothing but this, and names only the leader's public URL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from wakeful.domain.models import Leader

LOOKUP_SECONDS = 1.0
"""The leader's record is read at most this often, however many requests come."""


class StandbyApp:
    def __init__(
        self,
        leader: Callable[[], Awaitable[Leader | None]],
        clock: Callable[[], float] = time.monotonic,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self._leader = leader
        self._clock = clock
        self._metrics = metrics
        self._known: tuple[float, Leader | None] | None = None

    async def _where(self) -> Leader | None:
        now = self._clock()
        if self._known is None or now - self._known[0] >= LOOKUP_SECONDS:
            try:
                found = await self._leader()
            except Exception:  # the store is away: say nothing about a leader
                found = None
            self._known = (now, found)
        return self._known[1]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 1013, "reason": "standby"})
            return
        if scope["type"] != "http":
            return
        if scope["path"] == "/healthz":
            await _answer(send, 200, {"status": "standby"})
            return
        if scope["path"] == "/metrics" and self._metrics is not None:
            data = self._metrics()
            headers = [
                (b"content-type", CONTENT_TYPE_LATEST.encode()),
                (b"content-length", str(len(data)).encode()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            return
        leader = await self._where()
        where = f"the leader is at {leader.url}" if leader and leader.url else "no leader yet"
        body = {
            "error": "standby",
            "detail": f"this activator is a standby; {where}",
            "leader": leader.url if leader else None,
        }
        await _answer(send, 503, body, [(b"retry-after", b"1")])


async def _answer(
    send: Any, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
