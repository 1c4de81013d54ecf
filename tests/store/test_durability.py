"""Guarantees particular to one backend: the embedded store's file, etcd's restarts."""

from __future__ import annotations

import asyncio
import gc
import logging
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


def _request_tasks() -> set[asyncio.Task[object]]:
    """grpc's tasks that feed streaming calls their requests, one per open stream."""
    return {
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "").endswith("_consume_request_iterator")
    }


async def test_an_etcd_restart_leaves_no_task_of_the_broken_watch_stream_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The watch stream etcd broke as it stopped is re-opened, and the broken one leaves nothing
    running: etcd3aio's left grpc's task that fed it requests waiting for ever, and once the
    garbage collector found it: "Task was destroyed but it is pending!" and "aclose():
    asynchronous generator is already running" (an activator's, a node agent's log)."""
    caplog.set_level(logging.ERROR, logger="asyncio")
    others = _request_tasks()
    with EtcdServer() as server:
        async with open_store(server.url, namespace="/broken/") as store:
            before = await store.put("w/a", Counter(n=1))
            stream = store.watch("w/", before)
            with anyio.fail_after(10):
                await stream.__anext__()
            server.stop()  # SIGTERM: the stream ends with UNAVAILABLE
            await anyio.sleep(1)
            server.start()
            await until_it_answers(store)
            after = await store.put("w/b", Counter(n=2))
            with anyio.fail_after(10):
                event = await stream.__anext__()
            assert isinstance(event, Event) and event.revision == after
            assert len(_request_tasks() - others) == 1  # the re-opened stream's only
            await stream.aclose()  # type: ignore[attr-defined]
            left = _request_tasks() - others
            if left:
                await asyncio.wait(left, timeout=5)
            assert not _request_tasks() - others
    for _ in range(2):
        gc.collect()
        await anyio.sleep(0.05)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
