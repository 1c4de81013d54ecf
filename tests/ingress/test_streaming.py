"""Bodies stream both ways with backpressure: big transfers pass intact in flat memory."""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import AsyncIterator, Callable

import pytest

from tests.support.ingress import stack

pytestmark = pytest.mark.anyio
SIZE = 200 * 1024 * 1024
CHUNK = 1024 * 1024
BOUND = 32 * 1024 * 1024
"""Peak Python memory the whole transfer may add: a sixth of one body."""


async def test_a_large_upload_and_its_echo_pass_through_intact_in_flat_memory(
    hello: Callable[[], int],
) -> None:
    sent = hashlib.sha256()

    async def body() -> AsyncIterator[bytes]:
        for n in range(SIZE // CHUNK):
            chunk = bytes([n % 251]) * CHUNK
            sent.update(chunk)
            yield chunk

    async with stack({"sb-1": hello()}) as s:
        tracemalloc.start()
        try:
            received = hashlib.sha256()
            length = 0
            async with s.client.stream(
                "POST", "/echo", content=body(), headers={"Content-Length": str(SIZE)}
            ) as answer:
                assert answer.status_code == 200
                async for chunk in answer.aiter_raw():
                    received.update(chunk)
                    length += len(chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert answer.headers["x-body-sha256"] == sent.hexdigest()  # the sandbox got it intact
    assert (length, received.hexdigest()) == (SIZE, sent.hexdigest())  # and so did we
    assert peak < BOUND, f"peak {peak / 2**20:.1f} MiB"


async def test_a_large_download_passes_through_intact_in_flat_memory(
    hello: Callable[[], int],
) -> None:
    expected = hashlib.sha256()
    block = b"w" * 65536
    for _ in range(SIZE // len(block)):
        expected.update(block)
    async with stack({"sb-1": hello()}) as s:
        tracemalloc.start()
        try:
            received = hashlib.sha256()
            async with s.client.stream("GET", f"/bytes?n={SIZE}") as answer:
                assert answer.headers["content-length"] == str(SIZE)
                async for chunk in answer.aiter_raw():
                    received.update(chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert received.hexdigest() == expected.hexdigest()
    assert peak < BOUND, f"peak {peak / 2**20:.1f} MiB"
