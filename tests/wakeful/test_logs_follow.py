"""`wakeful logs -f` against the real control plane: each line is printed once, also after a
sandbox has more lines than `--tail`, and a line the node sent in two batches as two pieces."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

from tests.support.control import TOKEN, running_control_plane
from wakeful import logs_cli
from wakeful.bootstrap import ControlPlane
from wakeful.domain.logbatch import LogBatch, OutputChunk
from wakeful.domain.models import App
from wakeful.remote import ApiUnreachable, ControlClient, Endpoint
from wakeful.store.testing import free_port

pytestmark = pytest.mark.anyio


@dataclass
class Node:
    """Ships sandbox output to the control plane's log book the way a node agent does: each
    chunk names its bytes of the sandbox's output stream."""

    plane: ControlPlane
    offsets: dict[str, int] = field(default_factory=dict)

    async def write(self, sandbox: str, text: str) -> None:
        offset = self.offsets.get(sandbox, 0)
        size = len(text.encode())
        self.offsets[sandbox] = offset + size
        chunk = OutputChunk(
            sandbox=sandbox,
            app="hello",
            created_at=1 if sandbox == "sb-1" else 2,
            offset=offset,
            size=size,
            text=text,
        )
        await self.plane.logbook.ship(
            LogBatch(node="n1", interval=1, pending=0, dropped=0, chunks=[chunk])
        )


@dataclass
class Running:
    node: Node
    endpoint: Endpoint


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with running_control_plane(tmp_path) as control:
        await control.store.put("apps/hello", App(name="hello"))
        yield Running(Node(control.plane), Endpoint(control.url, control.token))


class Stop(Exception):
    pass


async def test_follow_prints_each_line_once_as_the_window_slides(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    node = running.node
    await node.write("sb-1", "".join(f"line {i}\n" for i in range(5)))
    polls = iter(
        [
            [("sb-1", "line 5\nline 6\n")],
            [],
            [("sb-2", "ready\n")],
            [("sb-1", "line 7\nline 8 par")],
            [("sb-1", "t\n")],
            [("sb-1", "line 9\n"), ("sb-2", "GET /\nGET /\n")],
        ]
    )

    async def write(lines: list[tuple[str, str]]) -> None:
        for sandbox, text in lines:
            await node.write(sandbox, text)

    def pause(seconds: float) -> None:
        """Between two polls: what the node pushed meanwhile arrives."""
        assert seconds == logs_cli.POLL
        step = next(polls, None)
        if step is None:
            raise Stop
        anyio.from_thread.run(write, step)

    def follow() -> int:
        with ControlClient(running.endpoint) as api:
            return logs_cli.logs(api, "hello", tail=3, follow=True, pause=pause)

    with pytest.raises(Stop):
        await anyio.to_thread.run_sync(follow)
    assert untimed(capsys.readouterr().out) == [
        "[sb-1] line 2",
        "[sb-1] line 3",
        "[sb-1] line 4",
        "[sb-1] line 5",
        "[sb-1] line 6",
        "[sb-2] ready",
        "[sb-1] line 7",
        "[sb-1] line 8 par",  # the line being written when the node shipped: two pieces
        "[sb-1] t",
        "[sb-1] line 9",
        "[sb-2] GET /",
        "[sb-2] GET /",
    ]


@pytest.mark.parametrize(
    ("as_json", "printed"),
    [
        (False, ["[sb-1] ready", "[sb-1] \\x1b]52;c;cHduZWQ=\\x07\\x1b[2K\\r\\x9b1m"]),
        (True, ["ready", "\x1b]52;c;cHduZWQ=\x07\x1b[2K\r\x9b1m"]),
    ],
    ids=["control characters shown", "--json keeps them exact"],
)
async def test_follow_shows_what_arrives_later_as_it_shows_the_rest(
    running: Running, capsys: pytest.CaptureFixture[str], as_json: bool, printed: list[str]
) -> None:
    await running.node.write("sb-1", "ready\n")
    later = iter(["\x1b]52;c;cHduZWQ=\x07\x1b[2K\r\x9b1m\n"])

    def pause(seconds: float) -> None:
        text = next(later, None)
        if text is None:
            raise Stop
        anyio.from_thread.run(running.node.write, "sb-1", text)

    def follow() -> int:
        with ControlClient(running.endpoint) as api:
            return logs_cli.logs(api, "hello", tail=3, follow=True, as_json=as_json, pause=pause)

    with pytest.raises(Stop):
        await anyio.to_thread.run_sync(follow)
    out = capsys.readouterr().out
    if as_json:
        assert out.isascii()
        assert [json.loads(line)["line"] for line in out.splitlines()] == printed
    else:
        assert untimed(out) == printed


def untimed(out: str) -> list[str]:
    """The lines printed, each without the time it begins with."""
    return [line.split(" ", 1)[1] for line in out.splitlines()]


class Lines:
    """A process's stdout, line by line, each read waiting at most 30 s."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None
        self._stream = TextReceiveStream(process.stdout)
        self._buffered = ""

    async def next(self, count: int) -> list[str]:
        with anyio.fail_after(30):
            while self._buffered.count("\n") < count:
                self._buffered += await self._stream.receive()
        *found, self._buffered = self._buffered.split("\n", count)
        return found


async def test_the_real_command_prints_new_lines_only_until_interrupted(
    running: Running,
) -> None:
    node = running.node
    await node.write("sb-1", "".join(f"line {i}\n" for i in range(5)))
    env = {k: v for k, v in os.environ.items() if k != "WAKEFUL_API"} | {"WAKEFUL_TOKEN": TOKEN}
    # Ctrl-C as a terminal sends it, even when this test runs where SIGINT is ignored (a
    # background job of a script): Python leaves an inherited "ignore" in place.
    wakeful = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from wakeful.cli import main; sys.exit(main())"
    )
    command = [sys.executable, "-c", wakeful, "--api", running.endpoint.api]
    async with await anyio.open_process(
        [*command, "logs", "hello", "-f", "--tail", "3"], env=env
    ) as process:
        try:
            await follow_until_interrupted(process, node)
        finally:
            if process.returncode is None:  # never wait forever on a follow that did not end
                process.kill()


async def follow_until_interrupted(process: Process, node: Node) -> None:
    stdout = Lines(process)
    assert untimed("\n".join(await stdout.next(3))) == [f"[sb-1] line {i}" for i in (2, 3, 4)]
    await node.write("sb-1", "line 5\nline 6\n")
    assert untimed("\n".join(await stdout.next(2))) == ["[sb-1] line 5", "[sb-1] line 6"]
    # Had it printed a line again (line 6 first), the next line would not be this one.
    await node.write("sb-1", "line 7\n")
    assert untimed("\n".join(await stdout.next(1))) == ["[sb-1] line 7"]
    process.send_signal(signal.SIGINT)
    with anyio.fail_after(30):
        assert await process.wait() == 130


def test_follow_says_once_that_the_control_plane_is_away_and_asks_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through a takeover the API is out of reach for a few seconds: `-f` goes on."""
    pauses = iter(range(3))

    def pause(seconds: float) -> None:
        if next(pauses, None) is None:
            raise Stop

    away = Endpoint(f"http://127.0.0.1:{free_port()}", TOKEN)
    with ControlClient(away) as api, pytest.raises(Stop):
        logs_cli.logs(api, "hello", follow=True, pause=pause)
    err = capsys.readouterr().err
    assert err.count("cannot reach the control plane") == 1, err
    assert "asking again" in err
    with ControlClient(away) as api, pytest.raises(ApiUnreachable):  # without -f: the error
        logs_cli.logs(api, "hello", pause=pause)
