from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

from wakeful.node.jail.tmpfs import unmount_under
from wakeful.store import Store, open_store
from wakeful.store.etcd import EtcdStore
from wakeful.store.testing import EtcdServer
from wakeful.testing import ManualClock

BACKENDS = ["memory", "sqlite", "etcd"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """asyncio only: the etcd client is grpc.aio, which runs on asyncio."""
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
async def session_loop(anyio_backend: str) -> AsyncIterator[asyncio.AbstractEventLoop]:
    """One event loop for the whole session, under every async test and fixture.

    anyio's pytest plugin keeps one test runner (one event loop) only while a test or an async
    fixture holds it, and closes it when the last lets go: without this fixture every test
    ran on a loop of its own, closed at its end. grpc.aio (the etcd client) has one process-wide
    poller and reading socket that every loop it was ever used on keeps listening to; a grpc
    completion that arrives after its loop closed (a cancelled watch or keep-alive stream, a
    closed channel's calls) is then handed, by whichever loop reads it next, to the closed one:
    `RuntimeError: Event loop is closed` at a later etcd test's setup. Held from the start of
    the session to its end, this runner's loop is the only one grpc ever sees, and it never
    closes while grpc is in use."""
    # A generator, not a coroutine: anyio holds the runner for as long as this is suspended.
    yield asyncio.get_running_loop()  # noqa: PT022


def _of_the_runner(task: asyncio.Task[object]) -> bool:
    """anyio's test runner drives each test and fixture step from a task of its own (one is
    running this teardown): not a leftover."""
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and code.co_qualname.startswith("TestRunner.")


@pytest.fixture(autouse=True)
async def cancel_leftover_tasks() -> AsyncIterator[None]:
    """Cancel the tasks a test leaves running, as closing a loop of its own used to.

    On the session's one loop such a task would run on into later tests, or be collected there
    still pending and fail whichever test runs then (etcd3aio's watch left one for each stream
    an etcd restart cut, until `wakeful.store.etcd` opened its streams itself). Exceptions of
    the cancelled tasks are dropped, as they were when the loop closed."""
    before = asyncio.all_tasks()
    yield
    leftovers = {task for task in asyncio.all_tasks() - before if not _of_the_runner(task)}
    for task in leftovers:
        task.cancel()
    if leftovers:
        await asyncio.wait(leftovers, timeout=10)
        for task in leftovers:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved, so never logged as unretrieved


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the session. A missing etcd fails the run: it is never skipped."""
    with EtcdServer() as server:
        yield server


@pytest.fixture(scope="session")
async def etcd_session(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    """One etcd client (one grpc channel) for the session, on the session's loop. Each etcd
    test gets a view of it under its own namespace (the `store` fixture)."""
    connection = EtcdStore([etcd_server.endpoint], namespace="/t/")
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.aclose()


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    backend = request.param
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    server: EtcdServer = request.getfixturevalue("etcd_server")
    return server.url


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace per test, so tests sharing one etcd never see each other's keys."""
    return f"/t/{uuid.uuid4().hex[:12]}/"


@pytest.fixture
def etcd_connection(request: pytest.FixtureRequest, store_url: str) -> EtcdStore | None:
    """The session's etcd client when this test runs on etcd, else None. (Resolved here, in a
    plain fixture: an async fixture cannot ask for another async fixture by name.)"""
    if not store_url.startswith("etcd://"):
        return None
    connection: EtcdStore = request.getfixturevalue("etcd_session")
    return connection


@pytest.fixture
def ttl_clock(store_url: str) -> ManualClock | None:
    """The clock the embedded stores' TTLs run on, moved by hand; None on etcd, which keeps
    its own time (see `pass_time`)."""
    return None if store_url.startswith("etcd://") else ManualClock(time.time())


@pytest.fixture
async def store(
    store_url: str,
    namespace: str,
    etcd_connection: EtcdStore | None,
    session_loop: asyncio.AbstractEventLoop,
    ttl_clock: ManualClock | None,
) -> AsyncIterator[Store]:
    if etcd_connection is not None:
        assert asyncio.get_running_loop() is session_loop, "grpc must stay on the session loop"
        yield etcd_connection.view(namespace)
        return
    async with open_store(store_url, namespace=namespace, clock=ttl_clock) as opened:
        yield opened


@pytest.fixture(scope="session", autouse=True)
def no_mount_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A node agent stopped while it started a sandbox can leave the sandbox's tmpfs mounted
    in its data directory (its next start would undo it: `clear_sandboxes`, which a test's
    agent never gets). Detached at the end of the session, as pytest's own clean-up of old
    temporary directories would otherwise fail on it (EBUSY) in a later run."""
    yield
    if os.geteuid() == 0:
        unmount_under(tmp_path_factory.getbasetemp())


EXCLUSIVE = ("tests/node/jail/test_isolation.py", "tests/node/jail/test_peers.py")
"""Modules that set the machine's nftables sets to addresses of their own and check what a
sandbox uid then reaches: any agent starting meanwhile (in another test) installs its own sets
and would change the answer. They run alone, after the parallel run (`scripts/test`)."""
TOGETHER = ("tests/containers/",)
"""Folders whose tests share one costly session fixture (wakeful's image, built once)."""
FIRST = ("tests/containers/", "tests/e2e/", "tests/security/")
"""The folders of the longest tests, first in the order the workers are given modules
(`scripts/test` keeps it: `--no-loadscope-reorder`), so the quick modules fill the end of the
run and neither worker waits long for the other's last module."""


class Modules(LoadFileScheduling):
    """`--dist loadfile`, with the folders in `TOGETHER` one unit each: each module runs on one
    worker, its module fixtures made once, and a folder in `TOGETHER` on one worker.

    Not xdist's `loadgroup`: it hands the groups of `xdist_group` marks to its scheduler by
    writing them into the node ids, which pytest 9.2 (its structured ids) no longer takes, and
    the groups went unseen without a word; the image was built on both workers at once."""

    def _split_scope(self, nodeid: str) -> str:
        where = nodeid.split("::", 1)[0]
        return next((folder for folder in TOGETHER if where.startswith(folder)), where)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Modules | None:
    return Modules(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The `EXCLUSIVE` modules are marked so that `scripts/test` runs them apart, and the
    folders in `FIRST` go first."""
    root = Path(str(config.rootpath))
    for item in items:
        if Path(str(item.path)).relative_to(root).as_posix() in EXCLUSIVE:
            item.add_marker(pytest.mark.exclusive)
    items.sort(
        key=lambda item: not Path(str(item.path)).relative_to(root).as_posix().startswith(FIRST)
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_url" in metafunc.fixturenames:
        metafunc.parametrize("store_url", BACKENDS, indirect=True, ids=BACKENDS)
