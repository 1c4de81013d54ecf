"""`InProcessLeases`: the activator in the same process (`wakeful up`), no serialisation and
no network."""

from __future__ import annotations

from collections.abc import Callable

from wakeful.activator.core import Activator
from wakeful.aio.marks import Marks
from wakeful.domain.leases import LeaseGrant, Riders
from wakeful.domain.traffic import TrafficReport


class InProcessLeases:
    """The activator in the same process: no serialisation, no network."""

    refused: str | None = None  # `Leases.refused`: never known here
    cancels_cleanly = True  # a grant is made and returned in one step of the acquire

    def __init__(self, activator: Activator, routes_seen: Marks | None = None) -> None:
        """`routes_seen`: where the ingress's `routes` go (the control plane's; None:
        nowhere, nobody waits for them)."""
        self._activator = activator
        self._routes_seen = routes_seen

    async def acquire(
        self, app: str, version: str | None = None, *, riders: Riders | None = None
    ) -> LeaseGrant:
        return (await self._activator.acquire(app, version, riders=riders)).grant()

    async def renew(self, lease_id: str, *, used: bool = False) -> LeaseGrant:
        return self._activator.renew_grant(lease_id, used=used)

    async def release(self, lease_id: str) -> None:
        self._activator.release(lease_id)

    def report(self, traffic: TrafficReport) -> None:
        self._activator.record_traffic(traffic)

    def routes(self, ingress: str, revision: int | None) -> None:
        seen = self._routes_seen
        if seen is None:
            return
        if revision is None:
            seen.gone(self, linger=False)
        else:
            seen.saw(self, ingress, revision, "in-process")

    def heed_short(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        return self._activator.spare_asks.heed(listener)

    def access(self, ingress: str, lines: list[dict[str, object]]) -> bool:
        self._activator.record_access(ingress, lines)
        return True
