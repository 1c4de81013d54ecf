"""The fault suite's short mode (`bench/faults.py --short`), as CI runs it: every scenario once
on the multi-process mode, with its goals asserted. The table it prints is the measurement;
this test holds the invariants that must not depend on a machine's speed: no request failed
that the goal says must not, every cold app woke, nothing leaked (leases, waiters, processes).
"""

from __future__ import annotations

import shutil

import pytest

from bench.faults import MAX_WAITERS, main, print_table

FLOOD_RSS_MIB = 32
"""What the ingresses' and activators' RSS may grow by over the flood."""
IN_FLIGHT_ON_THE_KILLED = 3
"""Requests the goal forgives when a replica or a sandbox is killed under them: those it was
answering at that instant (the prober sends one every 20 ms; each takes a few)."""


@pytest.mark.skipif(shutil.which("nginx") is None, reason="needs nginx (scripts/test installs it)")
@pytest.mark.anyio
async def test_the_fault_suite_in_its_short_mode_loses_nothing() -> None:
    rows = await main(True, [], 50.0)  # on the session's loop: anyio.run would find it running
    print_table(rows)
    by_name = {row.scenario: row for row in rows}
    for row in rows:
        assert not row.leaked, (row.scenario, row.leaked)
    for name in (
        "activator-sigterm",
        "activator-sigkill",
        "etcd-sigkill",
        "etcd-member-sigkill",
        "node-sigkill",
        "deploy-under-load",
        "aborted-downloads",
    ):
        assert by_name[name].failed == {}, (name, by_name[name].failed)
    for name in ("ingress-sigkill", "sandbox-sigkill"):
        assert sum(by_name[name].failed.values()) <= IN_FLIGHT_ON_THE_KILLED, by_name[name]
    for row in rows:
        if row.scenario not in ("flood", "aborted-downloads", "after all (traffic stopped)"):
            assert row.wake is not None, f"{row.scenario}: the cold app never woke"
            assert row.requests > 0
    flood = by_name["flood"]
    assert flood.failed == {}, flood  # only 200s and 503s with Retry-After
    # Memory stays flat: 1-4 MiB measured, so past FLOOD_RSS_MIB something of 80 KiB or more
    # stayed for each of the flood's 400 requests (a buffer, a parked waiter's state).
    assert flood.grown is not None and flood.grown < FLOOD_RSS_MIB, flood
    served = int(flood.notes[0].split()[0])
    assert served >= 1  # the app woke and what was admitted was answered
    assert flood.requests == 10 * MAX_WAITERS * 2  # every request got its answer
