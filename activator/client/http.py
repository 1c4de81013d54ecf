"""`HttpLeases`: the activator's HTTP API (`POST /v1/leases`, ...), a request per call, through
one long-lived httpx client (`wakeful ingress` uses the lease channel, `ChannelLeases`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx

from wakeful.activator.lease_errors import from_http
from wakeful.domain.leases import LeaseGrant, Riders, Unreachable
from wakeful.domain.traffic import TrafficReport


class HttpLeases:
    """The activator's HTTP API, through one long-lived httpx client."""

    refused: str | None = None  # `Leases.refused`: never known here
    cancels_cleanly = False

    def __init__(
        self, base_url: str, token: str, *, timeout: float = 130.0, per_app: int = 128
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self._per_app = per_app
        self._app_slots: dict[str, anyio.Semaphore] = {}
        """At most `per_app` acquires of one app in flight: a cold app's parked requests must
        not take every connection while other apps have capacity (invariant 12, per app)."""
        # Two pools: acquires may park for the activation timeout, and must never starve the
        # renewals and releases that keep every other lease alive.
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=5.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
        )
        self._upkeep = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=httpx.Timeout(10.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> LeaseGrant:
        """Over plain HTTP an ask says how many ride it when it is sent, and no more: those
        that join later are not counted upstream (`ChannelLeases` follows them)."""
        requests = 1 if riders is None else max(1, riders.count)
        body: dict[str, str | int] = {"app": app, "requests": requests}
        if version is not None:
            body["version"] = version
        slots = self._app_slots.get(app)
        if slots is None:
            slots = self._app_slots[app] = anyio.Semaphore(self._per_app)
        async with slots:
            answer = await self._send("POST", "/v1/leases", json=body)
        return LeaseGrant.model_validate(self._checked(answer).json())

    async def renew(self, lease_id: str, *, used: bool = False) -> LeaseGrant:
        answer = await self._send(
            "POST", f"/v1/leases/{lease_id}/renew", json={"used": used}, client=self._upkeep
        )
        return LeaseGrant.model_validate(self._checked(answer).json())

    async def release(self, lease_id: str) -> None:
        self._checked(await self._send("DELETE", f"/v1/leases/{lease_id}", client=self._upkeep))

    def report(self, traffic: TrafficReport) -> None:
        """Plain HTTP sends no traffic reports (a request each would cost more than the
        charts are worth); `ChannelLeases`, what `wakeful ingress` uses, does."""

    def routes(self, ingress: str, revision: int | None) -> None:
        """Plain HTTP keeps nothing open to say it on: deploys do not wait for this ingress."""

    def heed_short(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Plain HTTP cannot be told: only renewals say a pool is short."""
        return lambda: None

    def access(self, ingress: str, lines: list[dict[str, object]]) -> bool:
        """Nor access lines: they are dropped here (`ChannelLeases` sends them)."""
        return True

    async def _send(
        self, method: str, path: str, client: httpx.AsyncClient | None = None, **kwargs: Any
    ) -> httpx.Response:
        """httpx's transport errors become ours here, at the adapter's edge."""
        try:
            return await (client or self._client).request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(f"the activator did not answer: {exc}", retry_after=1) from exc

    @staticmethod
    def _checked(answer: httpx.Response) -> httpx.Response:
        """A success, or the error it stands for (`activator/lease_errors.py`)."""
        if answer.is_success:
            return answer
        try:
            body = answer.json()
        except ValueError:
            body = None
        raise from_http(answer.status_code, body, answer.text, answer.headers.get("Retry-After"))

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._upkeep.aclose()

    async def __aenter__(self) -> HttpLeases:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
