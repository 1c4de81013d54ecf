"""The activator tests' fixtures (their helpers are `tests.support.activator`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.activator import ACTIVATION_TIMEOUT, Served, seed, serve_activator
from wakeful.domain.models import SandboxStatus
from wakeful.store import open_store


@pytest.fixture
async def api() -> AsyncIterator[Served]:
    """The activator's API on uvicorn, over the sample app with one running sandbox."""
    async with open_store("memory://") as store:
        await seed(
            store,
            rpi=10,
            activation_timeout=ACTIVATION_TIMEOUT,
            sandboxes={"sb-1": SandboxStatus.RUNNING},
        )
        async with serve_activator(store) as served:
            yield served
