"""Who leads the control plane, seen from the pieces: an activator standing by while another
leads, and the others finding the leader's control API.

Any number of activators may run on one store; `leaders/activator` names the one elected
(`wakeful.store.election`). A candidate campaigns through `Standby.campaign`, which serves
`StandbyApp` on the control API's port meanwhile (who leads, and a /metrics of its own: the
store as this standby sees it, and `wakeful_activator_leading 0`). The node agents and the
ingresses reach the leader through `leader_locator`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

import anyio
from prometheus_client import CollectorRegistry, generate_latest

from wakeful.activator.standby import StandbyApp
from wakeful.controller.health import StoreProbe, leading_gauge
from wakeful.domain import keys
from wakeful.domain.models import Leader
from wakeful.serving import serve_asgi
from wakeful.store import Store, StoreError
from wakeful.store.election import Election, Term

log = logging.getLogger(__name__)


class Standby:
    def __init__(
        self, election: Election, store: Store, listen: str, announce: Callable[[str], None]
    ) -> None:
        self._election = election
        self._listen = listen
        self._announce = announce
        self._registry = CollectorRegistry()
        self._probe = StoreProbe(store)
        self._registry.register(self._probe)
        leading_gauge(self._registry).set(0)  # the leader's control plane exports its own
        self.quiet = False
        """Set once this candidate has led: standing by again, it says nothing."""

    async def campaign(self, previous: Term | None) -> Term:
        """`Election.campaign`, serving `StandbyApp` on the control API's port meanwhile."""
        async with anyio.create_task_group() as standby:
            app = StandbyApp(
                self._election.current, metrics=partial(generate_latest, self._registry)
            )
            standby.start_soon(serve_asgi, app, self._listen, "control API address")
            standby.start_soon(self._probe.run)
            try:
                holder = await self._election.current()
            except StoreError:
                holder = None  # the campaign waits the store out
            if holder is not None and not self.quiet:
                self._announce(
                    f"activator standing by on http://{self._listen}: {holder.holder} leads"
                )
            term = await self._election.campaign(previous)
            standby.cancel_scope.cancel()
        return term


def leader_locator(store: Store, apis: Sequence[str]) -> Callable[[], Awaitable[str]]:
    """Where the leading activator's control API is: the configured URL its record in the
    store (`leaders/activator`) names, else the configured URLs in turn (a store away, a
    leader being elected, or one URL in front of them all: a load balancer). A URL only the
    store names gets no token: it is not one this piece was told to trust."""
    turn = itertools.cycle(apis)
    known = {url.rstrip("/") for url in apis}

    async def locate() -> str:
        try:
            item = await store.get(keys.leader("activator"), Leader)
        except StoreError as exc:
            log.warning("could not read the leading activator's record: %s", exc)
            item = None
        if item is not None and item.value.url.rstrip("/") in known:
            return item.value.url
        return next(turn)

    return locate
