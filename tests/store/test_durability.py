"""Guarantees particular to one backend: the embedded store's file, etcd's restarts."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from wakeful.store import Event, Store, Unavailable, open_store
from wakeful.store.testing import EtcdServer

pytestmark = pytest.mark.anyio


class Counter(BaseModel):
    n: int


async def test_sqlite_keeps_data_and_revisions_across_a_process_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'data' / 'store.db'}"
    writer = textwrap.dedent(
        f"""
        import anyio
        from pydantic import BaseModel
        from wakeful.store import open_store

        class Counter(BaseModel):
            n: int

        async def main():
            async with open_store({url!r}) as store:
                for n in range(5):
                    await store.put(f"pools/p{{n}}", Counter(n=n))
                print(await store.put("pools/p0", Counter(n=100)))

        anyio.run(main)
        """
    )
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, "-c", writer], check=False)
    assert done.returncode == 0, done.stderr.decode()
    last_revision = int(done.stdout.decode().strip())

    async with open_store(url) as store:
        listing = await store.list("pools/", Counter)
        assert [(i.key, i.value.n) for i in listing.items] == [
            ("pools/p0", 100),
            ("pools/p1", 1),
            ("pools/p2", 2),
            ("pools/p3", 3),
            ("pools/p4", 4),
        ]
        assert listing.revision == last_revision
        # revisions continue from where the other process stopped, and history replays
        assert await store.put("pools/p9", Counter(n=9)) == last_revision + 1
        stream = store.watch("pools/", 1)
        with anyio.fail_after(5):
            first = await stream.__anext__()
        assert isinstance(first, Event) and (first.key, first.revision) == ("pools/p0", 1)
        await stream.aclose()  # type: ignore[attr-defined]


async def until_it_answers(store: Store, within: float = 30) -> None:
    """Wait for `store` to answer again after its etcd restarted. etcd is healthy once `start()`
    returns, but grpc's connection to it may still be in reconnect backoff from the refusals
    while etcd was down (longer the slower the restart, as under load), and calls fail fast
    as Unavailable until it reconnects; a new client to the same address shares that
    connection."""
    with anyio.fail_after(within):
        while True:
            try:
                await store.get("w/a", Counter)
                return
            except Unavailable:
                await anyio.sleep(0.1)


async def test_etcd_watch_continues_without_a_gap_across_sigkill_and_restart() -> None:
    with EtcdServer() as server:
        async with open_store(server.url, namespace="/restart/") as store:
            before = await store.put("w/a", Counter(n=1))
            stream = store.watch("w/", before)
            with anyio.fail_after(10):
                first = await stream.__anext__()
            assert isinstance(first, Event) and first.revision == before

            server.kill()
            server.start()
            await until_it_answers(store)

            async with open_store(server.url, namespace="/restart/") as writer:
                revisions = [await writer.put(f"w/k{n}", Counter(n=n)) for n in range(5)]

            seen: list[int] = []
            with anyio.fail_after(30):
                async for event in stream:
                    assert isinstance(event, Event), event
                    seen.append(event.revision)
                    if len(seen) == len(revisions):
                        break
            assert seen == revisions
            await stream.aclose()  # type: ignore[attr-defined]
