"""The lease channel's `routes` operation (how far an ingress's routes have come, which a
deploy waits on) and when its client opens a lost channel again: over a real WebSocket
through uvicorn, as `test_channel.py`."""

from __future__ import annotations

import anyio
import pytest
import websockets
import websockets.asyncio.server

from tests.support.activator import TOKEN, Leading, Served, answered_alone, serve_activator
from tests.support.waiting import eventually
from wakeful.activator.client import ChannelLeases
from wakeful.activator.client.channel import reopen_at_once

pytestmark = pytest.mark.anyio


async def test_routes_open_the_channel_and_are_told_again_on_every_new_one(api: Served) -> None:
    """An idle ingress (no lease asked) is known where it must be: the routes revision it
    reports opens the channel; a lost channel is opened again at once, on the activator
    that leads by then, and told it (the old one keeps it a few seconds, for its next
    channel); an ingress that says it stops is forgotten at once, and opens no channel
    for it again."""
    leading = Leading(api.url)
    seen = api.routes_seen
    async with ChannelLeases(api.url, TOKEN, locate=leading.locate) as leases:
        leases.routes("edge-1", 5)
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(6) == {"edge-1": 5})
        leases.routes("edge-1", 9)
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(9) == {} and len(seen) == 1)
        async with serve_activator(api.store) as heir:
            await leading.move_to(heir.url, leases)  # nothing is asked of the client after
            with anyio.fail_after(10):
                await eventually(lambda: heir.routes_seen.behind(10) == {"edge-1": 9})
            assert seen.behind(10) == {"edge-1": 9}  # lost, lingering
            leases.routes("edge-1", None)  # it stops (drains)
            with anyio.fail_after(10):
                await eventually(lambda: len(heir.routes_seen) == 0)
            await leading.move_to(api.url, leases)
            await anyio.sleep(0.2)
            assert leases._link is None or not leases._link.alive  # not opened again
    answers = await answered_alone(
        api,
        [
            {"id": 1, "op": "routes", "ingress": "e", "revision": -1},
            {"id": 2, "op": "routes", "ingress": "e" * 129, "revision": 1},
            {"id": 3, "op": "routes", "ingress": "e", "revision": 2**63},
            {"id": 4, "op": "routes", "revision": 1},
            {"id": 5, "op": "routes", "ingress": "edge\n1", "revision": 1},
            {"id": 6, "op": "routes", "ingress": "", "revision": 1},
            {"id": 7, "op": "routes", "ingress": "e", "revision": 1, "instance": "A1"},
            {"id": 8, "op": "routes", "ingress": "e", "revision": 1, "instance": "a" * 33},
            {"id": 9, "op": "routes", "ingress": "e", "revision": 1, "instance": None},
            {"id": 10, "op": "routes", "ingress": "e", "revision": 3, "instance": "0af3"},
        ],
    )
    assert answers[10] == {"id": 10, "recorded": 1}


async def test_two_ingresses_of_one_name_are_both_waited_for_and_told_of(
    api: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """Two machines of one short hostname: both ingresses default to `host-8080`. Each
    reports its routes on a channel of its own with its own instance id: a deploy waits for
    both from their first reports, one's channel lost and opened again changes nothing, and
    the activator says, once, that they share a name."""
    seen = api.routes_seen
    leading = Leading(api.url)
    async with (
        ChannelLeases(api.url, TOKEN, locate=leading.locate) as one,
        ChannelLeases(api.url, TOKEN) as other,
    ):
        one.routes("host-8080", 5)
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(6) == {"host-8080": 5})
        other.routes("host-8080", 6)
        shown = f"host-8080 ({one.instance})"
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(6) == {shown: 5} and len(seen) == 2)
        await leading.move_to(api.url, one)  # one's channel lost; it opens another at once
        with anyio.fail_after(10):
            await eventually(lambda: one._link is not None and one._link.alive)
        one.routes("host-8080", 7)
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(7) == {f"host-8080 ({other.instance})": 6})
        assert len(seen) == 2
        other.routes("host-8080", 7)
        with anyio.fail_after(10):
            await eventually(lambda: seen.behind(7) == {})
    said = [r.getMessage() for r in caplog.records if " call themselves " in r.getMessage()]
    assert said == [
        "two ingresses of token:t0 call themselves 'host-8080': a deploy waits for both, "
        f"this one as 'host-8080 ({other.instance})', but their tunnels would collide; give "
        "each a name of its own (WAKEFUL_TUNNEL_REPLICA)"
    ]


async def test_an_activator_that_closes_every_channel_as_it_opens_is_tried_once_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not a refusal (1013) but a close as soon as opened (an activator deposed but still
    serving says 1012; a proxy 1000): the first is a takeover's ordinary close, opened again
    at once; the next in a row is a failed attempt. An idle ingress that keeps its channel for
    its routes would else open one, lose it, and open the next, thousands of times a second."""
    opened = 0

    async def closing(connection: websockets.asyncio.server.ServerConnection) -> None:
        nonlocal opened
        opened += 1
        await connection.close(1012, "this activator stopped leading")

    async with websockets.asyncio.server.serve(closing, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with ChannelLeases(f"http://127.0.0.1:{port}", TOKEN) as leases:
            leases.routes("edge-1", 1)
            await anyio.sleep(2)
    assert 2 <= opened <= 5, opened
    said = [r for r in caplog.records if "keeps closing the lease channel" in r.getMessage()]
    assert len(said) == 1  # said once for the spell, not at every attempt


@pytest.mark.parametrize(
    ("refused", "brief_in_a_row", "at_once"),
    [
        (False, 0, True),  # a channel that lived: lost, opened again at once
        (False, 1, True),  # closed as it opened once: a takeover's close
        (False, 2, False),  # twice running: an activator closing every channel
        (False, 9, False),
        (True, 0, False),  # 1013: the activator would not keep it
        (True, 1, False),
    ],
)
def test_reopen_at_once(refused: bool, brief_in_a_row: int, at_once: bool) -> None:
    assert reopen_at_once(refused, brief_in_a_row) is at_once
