"""Random interleavings of acquire, release, cancel and sandbox death: capacity always returns."""

from __future__ import annotations

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support.activator import make_activator, seed, set_status
from wakeful.activator.ledger import Lease
from wakeful.domain.models import SandboxStatus
from wakeful.store import open_store
from wakeful.testing import ManualClock

pytestmark = pytest.mark.anyio

SANDBOXES = ["sb-0", "sb-1", "sb-2"]

steps = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, 0)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
        st.tuples(st.just("kill"), st.integers(0, len(SANDBOXES) - 1)),
        st.tuples(st.just("revive"), st.integers(0, len(SANDBOXES) - 1)),
        st.tuples(st.just("yield"), st.integers(0, 5)),
    ),
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=steps)
@example(plan=[("kill", 0), ("acquire", 0), ("yield", 2), ("cancel", 0)])
@example(plan=[("acquire", 0), ("acquire", 0), ("kill", 0), ("revive", 0), ("acquire", 0)])
async def test_every_sandbox_returns_to_zero_leased(plan: list[tuple[str, int]]) -> None:
    async with open_store("memory://") as store:
        # rpi 1: the second request on a sandbox is already over target (overflow); two of
        # the three sandboxes start booting, so kills soon leave nothing routable (waiters).
        await seed(
            store,
            rpi=1,
            sandboxes={
                "sb-0": SandboxStatus.RUNNING,
                "sb-1": SandboxStatus.BOOTING,
                "sb-2": SandboxStatus.BOOTING,
            },
        )
        # Time stands still: no lease expires and no waiter times out behind the plan's back.
        activator = make_activator(store, clock=ManualClock())
        held: list[Lease] = []
        pending: list[anyio.CancelScope] = []

        async def acquire(scope: anyio.CancelScope) -> None:
            with scope:
                held.append(await activator.acquire("hello"))

        async with activator.running():
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tasks:
                    for action, n in plan:
                        if action == "acquire":
                            scope = anyio.CancelScope()
                            pending.append(scope)
                            tasks.start_soon(acquire, scope)
                        elif action == "release" and held:
                            activator.release(held.pop(n % len(held)).lease_id)
                        elif action == "cancel" and pending:
                            pending.pop(n % len(pending)).cancel()
                        elif action == "kill":
                            await set_status(store, SANDBOXES[n], SandboxStatus.DEAD)
                        elif action == "revive":
                            await set_status(store, SANDBOXES[n], SandboxStatus.RUNNING)
                        for _ in range(n if action == "yield" else 1):
                            await anyio.lowlevel.checkpoint()
                    for scope in pending:
                        scope.cancel()
                # The task group has ended: every request was either granted (it is in
                # `held`) or cancelled while it waited; none is still on its way.
            for lease in held:
                activator.release(lease.lease_id)
            assert [activator.leased_on(s) for s in SANDBOXES] == [0, 0, 0]
            (snapshot,) = activator.snapshot()
            assert (snapshot.leased, snapshot.overflow, snapshot.waiters) == (0, 0, 0)
