"""The two adapters of `wakeful.domain.leases.Leases` (what the ingress needs of the
activator): in-process, and over HTTP. Both raise the same errors, so the ingress cannot tell
them apart.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from wakeful.activator.core import Activator
from wakeful.domain.leases import (
    ActivatorError,
    AppFailedToBoot,
    LeaseGone,
    LeaseGrant,
    NoCapacity,
    Unauthorized,
    UnknownApp,
    Unreachable,
)


class InProcessLeases:
    """The activator in the same process: no serialisation, no network."""

    def __init__(self, activator: Activator) -> None:
        self._activator = activator

    async def acquire(self, app: str, version: str | None = None) -> LeaseGrant:
        return (await self._activator.acquire(app, version)).grant()

    async def renew(self, lease_id: str, *, used: bool = False) -> LeaseGrant:
        return self._activator.renew(lease_id, used=used).grant()

    async def release(self, lease_id: str) -> None:
        self._activator.release(lease_id)


class HttpLeases:
    """The activator's HTTP API, through one long-lived httpx client."""

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

    async def acquire(self, app: str, version: str | None = None) -> LeaseGrant:
        body: dict[str, str] = {"app": app}
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
        if answer.is_success:
            return answer
        try:
            body = answer.json()
            error, detail = str(body.get("error", "")), str(body.get("detail", ""))
        except ValueError:
            body, error, detail = {}, "", answer.text[:200]
        retry_after = float(answer.headers.get("Retry-After", "5") or 5)
        if answer.status_code in (401, 403):  # no valid token, or one of another role
            raise Unauthorized(detail or "the activator refused the token")
        if answer.status_code == 404:
            raise (LeaseGone if error == "lease gone" else UnknownApp)(detail)
        if answer.status_code == 503:
            if error == "app failed to boot":
                raise AppFailedToBoot(detail, retry_after, str(body.get("log", "")))
            raise NoCapacity(detail, retry_after)
        raise ActivatorError(f"activator answered {answer.status_code}: {error} {detail}")

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._upkeep.aclose()

    async def __aenter__(self) -> HttpLeases:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
