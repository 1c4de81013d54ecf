"""The etcd store on a cluster of three members, one of them killed: calls go on through the
others, and a timeout around a call caught by the death is a timeout, never a bare
cancellation (grpc raises CancelledErrors an anyio scope does not recognise as its own; one
once ended an activator's election loop in silence: `EtcdStore`'s `_isolated`)."""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from wakeful.store import StoreError, open_store
from wakeful.store.testing import EtcdCluster

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


async def test_calls_timed_out_by_a_members_death_are_timeouts_and_the_others_serve() -> None:
    cluster = EtcdCluster(3)
    await anyio.to_thread.run_sync(cluster.start)
    try:
        async with open_store(cluster.url, namespace="/cluster/") as store:
            lease = await store.grant(30)
            await store.put("a/x", Counter(n=0))
            cluster.leader().kill()
            outcomes: list[str] = []
            with anyio.fail_after(60):
                for n in range(1, 40):
                    for call in (
                        lambda: store.keep_alive(lease),
                        lambda: store.get("a/x", Counter),
                        lambda n=n: store.put("a/x", Counter(n=n)),
                    ):
                        try:
                            with anyio.fail_after(0.2):
                                await call()
                            outcomes.append("ok")
                        except TimeoutError:
                            outcomes.append("timeout")
                        except StoreError:
                            outcomes.append("unavailable")
                    await anyio.sleep(0.05)
            # No CancelledError escaped above (it would have ended this test); and once a
            # new leader is elected, the two members left serve everything.
            assert outcomes[-9:] == ["ok"] * 9, outcomes
            found = await store.get("a/x", Counter)
            assert found is not None and found.value.n == 39
    finally:
        cluster.close()


def _cmdlines() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.append((proc / "cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return found


def test_a_member_that_cannot_start_leaves_no_member_running() -> None:
    """A failed start once left the members it had started running for the rest of a CI
    run: each failure of a start leaked etcd processes."""
    cluster = EtcdCluster(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", cluster.members[2].client_port))
        taken.listen()
        with pytest.raises(RuntimeError, match="etcd exited at start"):
            cluster.start(timeout=30)
    dirs = [str(member.data_dir) for member in cluster.members]
    assert not [cmd for cmd in _cmdlines() if any(d in cmd for d in dirs)]
