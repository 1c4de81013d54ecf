"""What an activator says of the terms it wins (`wakeful.terms.Terms`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import cast

import anyio
import pytest

from wakeful.activator.settings import ActivatorSettings
from wakeful.leadership import Standby
from wakeful.store import open_store
from wakeful.store.election import Term
from wakeful.terms import Plane, Terms, activator_election

pytestmark = pytest.mark.anyio


async def test_a_term_won_again_after_one_lost_is_announced() -> None:
    """It said "stopped leading: ...; standing by again" when a store outage cost it its term,
    and nothing when it led again (the second walkthrough): the operator could not tell."""
    said: list[str] = []
    stopped: list[int] = []

    @contextlib.asynccontextmanager
    async def plane_for(term: Term, first: bool) -> AsyncIterator[Plane]:
        grants = SimpleNamespace(stop_granting=lambda: stopped.append(term.revision))
        yield cast(Plane, SimpleNamespace(activator=grants))

    async with open_store("memory://") as store:
        settings = ActivatorSettings(store_url="memory://", listen="127.0.0.1:8082")
        election = activator_election(store, settings)
        standby = Standby(election, store, settings.listen, said.append)
        terms = Terms(plane_for, standby, said.append, settings.listen)
        for revision in (1, 2):
            async with anyio.create_task_group() as leading:
                leading.start_soon(terms.lead, Term("leaders/activator", revision, 0))
                await anyio.wait_all_tasks_blocked()
                leading.cancel_scope.cancel()
    assert said == [
        "activator listening on http://127.0.0.1:8082 (leading)",
        "activator leading again on http://127.0.0.1:8082",
    ]
    assert stopped == [1, 2]
