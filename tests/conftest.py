from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from wakeful.store import Store, open_store
from wakeful.store.testing import EtcdServer

BACKENDS = ["memory", "sqlite", "etcd"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """One event loop for the whole session: grpc.aio binds its poller to the first loop it
    sees and fails on a later one (the etcd client is grpc-based)."""
    return "asyncio"


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd for the session. A missing etcd fails the run: it is never skipped."""
    with EtcdServer() as server:
        yield server


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
async def store(store_url: str, namespace: str) -> AsyncIterator[Store]:
    async with open_store(store_url, namespace=namespace) as opened:
        yield opened


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_url" in metafunc.fixturenames:
        metafunc.parametrize("store_url", BACKENDS, indirect=True, ids=BACKENDS)
