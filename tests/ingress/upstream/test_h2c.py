"""h2c to the sandboxes of an app with `protocol = "h2c"` (`upstream.h2c`), against a sandbox
written with h2 in the test (`tests.support.h2sandbox`): many requests share one connection;
a stream the sandbox refused, or left out of its GOAWAY, is sent again and answered; a reset
mid-answer, a head past the bound and silence are 502/504 with the lease given back; a client
that leaves resets its stream on the sandbox; an HTTP/1.1 client of an h2c app is served."""

from __future__ import annotations

import asyncio
import itertools

import h2.connection
import h2.errors
import httpx
import pytest

from tests.support.h2sandbox import H2Sandbox, ok
from tests.support.ingress import Stack, stack
from tests.support.waiting import eventually
from wakeful.domain.models import AppSpec, Concurrency

pytestmark = pytest.mark.anyio

H2C = {
    "spec": AppSpec(
        command=["serve"],
        protocol="h2c",
        concurrency=Concurrency(requests_per_instance=100, max_instances=20),
    )
}
Conn = h2.connection.H2Connection


def h2_client(s: Stack) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=s.url, http1=False, http2=True, headers={"host": "hello.localhost"}, timeout=30
    )


async def settled(s: Stack) -> None:
    await eventually(lambda: s.sample("requests_in_flight", app="hello") == 0, 5)


async def test_many_requests_share_one_connection() -> None:
    with H2Sandbox() as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s, h2_client(s) as client:
            answers = await asyncio.gather(*(client.get(f"/n/{i}") for i in range(40)))
            assert [a.text for a in answers] == [f"/n/{i}" for i in range(40)]
            plain = await s.client.get("/from-http11")  # an HTTP/1.1 client of an h2c app
            assert plain.status_code == 200 and plain.text == "/from-http11"
        assert sandbox.connections == 1
        head = sandbox.requests[0]
        assert head[b":authority"] == b"hello.localhost" and head[b"te"] == b"trailers"
        assert head[b":scheme"] == b"http" and b"x-request-id" in head


@pytest.mark.parametrize("how", ["refused", "goaway"])
async def test_a_stream_the_sandbox_never_processed_is_sent_again(how: str) -> None:
    first = itertools.count()

    def answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
        if next(first) == 0:
            if how == "refused":
                conn.reset_stream(stream, h2.errors.ErrorCodes.REFUSED_STREAM)
            else:
                conn.close_connection(last_stream_id=0)  # going away, this one not taken
            return
        ok(conn, stream, head, body)

    with H2Sandbox(answer) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            answer_ = await s.client.get("/again")
            assert answer_.status_code == 200 and answer_.text == "/again"
            await settled(s)
        assert len(sandbox.requests) == 2


def reset_mid_answer(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    conn.send_headers(stream, [(b":status", b"200")])
    conn.send_data(stream, b"part of it")
    conn.reset_stream(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)


def huge_head(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    """70 KB of head, past the 64 KiB bound (hpack takes a while to encode it: ~0.5 s)."""
    conn.send_headers(stream, [(b":status", b"200"), (b"x-big", b"b" * 70_000)])


def silent(conn: Conn, stream: int, head: dict[bytes, bytes], body: bytes) -> None:
    return


@pytest.mark.parametrize(
    ("answer", "status", "silence"),
    [(huge_head, 502, 30), (silent, 504, 0.5)],
    ids=["huge-head", "silent"],
)
async def test_a_sandbox_that_misbehaves_before_its_answer_gets_an_error_answer(
    answer: object, status: int, silence: float
) -> None:
    with H2Sandbox(answer) as sandbox:  # type: ignore[arg-type]
        async with stack({"s1": sandbox.port}, pool_update=H2C, request_timeout=silence) as s:
            got = await s.client.get("/")
            assert got.status_code == status, got.text
            await settled(s)
            assert all(e.uses == 0 for e in s.ingress.cache.snapshot())
        assert len(sandbox.requests) == 1  # it answered (badly) or took it: never sent again


async def test_a_reset_mid_answer_cuts_the_client_off_and_gives_the_lease_back() -> None:
    with H2Sandbox(reset_mid_answer) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s, h2_client(s) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get("/")
            await settled(s)
            assert s.sample("upstream_errors_total", app="hello", kind="failed") == 1


async def test_a_client_that_leaves_resets_its_stream_on_the_sandbox() -> None:
    with H2Sandbox(silent) as sandbox:
        async with stack({"s1": sandbox.port}, pool_update=H2C) as s:
            with pytest.raises(httpx.ReadTimeout):
                await s.client.get("/", timeout=0.3)
            await settled(s)
            await eventually(lambda: sandbox.resets == [h2.errors.ErrorCodes.CANCEL], 5)
