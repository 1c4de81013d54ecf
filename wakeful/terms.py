"""The pieces that run one at a time, elected on the store: who they say they are in their
election, and what an activator does with each term it wins (invariant 20).

Any number of activators may run on one store: one is elected (`leaders/activator`) and runs
the control plane with every write fenced by its term; the others serve `StandbyApp` on the
same port and wait to take over (`wakeful.leadership.Standby`). `Election.lead` runs
`Terms.lead` for each term won and cancels it when the term is lost (a store away for half
the election TTL, a long pause): the leader then stops granting at once, closes its lease
channels, stops its control plane and stands by again in the same process (a store outage
ends no process, invariant 19). One told to stop resigns, so a standby takes over at once.
Idle monitors run apart from the activators the same way (`leaders/idle-monitor`): one acts,
its writes fenced by its term, and the others wait to take over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, cast

import anyio

from wakeful.activator.settings import ActivatorSettings
from wakeful.domain import keys
from wakeful.domain.models import Leader
from wakeful.leadership import Standby
from wakeful.process import identity, settle_heap
from wakeful.store import Store, StoreError
from wakeful.store.backup import SchemaError
from wakeful.store.base import StoreBase
from wakeful.store.election import Election, Term

log = logging.getLogger(__name__)


def activator_election(store: Store, settings: ActivatorSettings) -> Election:
    """`leaders/activator`: this process, at the URL ingresses and nodes reach it at."""
    return Election(
        cast(StoreBase, store),
        keys.leader("activator"),
        Leader(holder=identity(), url=settings.advertised(), since=time.time()),
        ttl=settings.election_ttl,
    )


def idle_monitor_election(store: Store) -> Election:
    """`leaders/idle-monitor`: this process."""
    leader = Leader(holder=identity())
    return Election(cast(StoreBase, store), keys.leader("idle-monitor"), leader)


async def idle_monitor_greeting(election: Election, interval: float) -> str:
    """What an idle monitor says as it starts: its tick, and who acts when another does."""
    holder = await election.current()
    standing_by = f", standing by: {holder.holder} acts" if holder else ""
    return f"idle monitor: every {interval:g} s{standing_by}"


class Grants(Protocol):
    def stop_granting(self) -> None: ...


class Plane(Protocol):
    """What a term needs of the control plane it runs: its activator, to stop granting."""

    @property
    def activator(self) -> Grants: ...


PlaneFor = Callable[[Term, bool], AbstractAsyncContextManager[Plane]]
"""The control plane for a term, every write fenced by it; the flag: whether it is this
process's first term (the admin token is reset, when asked, only then)."""


class Terms:
    """The control plane for each term this activator wins; it announces each (the first as
    the start's line, the next ones as leading again)."""

    def __init__(
        self, plane_for: PlaneFor, standby: Standby, announce: Callable[[str], None], listen: str
    ) -> None:
        self._plane_for = plane_for
        self._standby = standby
        self._announce = announce
        self._listen = listen
        self._first = True

    async def lead(self, term: Term) -> None:
        """The control plane, every write fenced by `term`, until cancelled; one the store
        failed as it started is given up (the candidate campaigns again). A store whose schema
        this wakeful cannot use (`SchemaError`) ends the process."""
        try:
            async with self._plane_for(term, self._first) as plane:
                self._first = False
                if not self._standby.quiet:
                    self._announce(f"activator listening on http://{self._listen} (leading)")
                    self._standby.quiet = True
                else:  # after "stopped leading: ...; standing by again" (a store away)
                    self._announce(f"activator leading again on http://{self._listen}")
                settle_heap()
                try:
                    await anyio.sleep_forever()
                finally:
                    plane.activator.stop_granting()
        except SchemaError:
            raise
        except StoreError as exc:
            log.error("could not start leading: %s; standing by again", exc)
