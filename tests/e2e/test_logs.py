"""Logs that last (issue 40), against a real `wakeful up`: what `wakeful logs` showed survives a
SIGKILL of the control plane; the access log holds one line per proxied request, as the client
saw it; a full log disk drops lines, counts them and says so, and never stops an app serving.

The sample app is examples/hello with `HELLO_LOG` set: it prints a line per request it
answers (`"GET /path HTTP/1.1" 200 -`), so each request path the test sends is a line of
output the test can look for.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.support.faults import fill, small_filesystem
from tests.support.prober import Prober
from tests.support.up import Up, cli_async, make_app, start_up, stop_up
from wakeful.deploy.logdir import FAILING_PAUSE

pytestmark = pytest.mark.anyio

Record = dict[str, Any]


def printing_app(root: Path) -> Path:
    """examples/hello, printing a line per request; never idle long enough to stop."""
    app = make_app(root, delay="600s")
    with (app / "wakeful.toml").open("a") as manifest:
        manifest.write('[env]\nHELLO_LOG = "1"\n')
    return app


async def logs(up: Up, *args: str, app: str = "hello") -> list[Record]:
    """`wakeful logs APP --json ARGS`: the records it printed."""
    done = await cli_async(up, "logs", app, "--json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def logs_until(
    up: Up, check: Callable[[list[Record]], bool], *args: str, within: float = 60
) -> list[Record]:
    """`logs(up, *args)` asked again (another process: polled) until `check` holds for it or
    `within` seconds passed; the last answer, for the caller's assertions to show."""
    deadline = time.monotonic() + within
    while True:
        found = await logs(up, *args)
        if check(found) or time.monotonic() > deadline:
            return found
        await anyio.sleep(0.2)


def requested(records: list[Record], mark: str) -> list[str]:
    """The paths under `/<mark>/` that the app printed a line for."""
    return [
        m.group(1)
        for r in records
        if (m := re.search(rf'"GET (/{mark}/\d+) HTTP', str(r.get("line", ""))))
    ]


async def send(client: httpx.AsyncClient, up: Up, mark: str, count: int) -> None:
    for i in range(count):
        answer = await client.get(f"/{mark}/{i}", headers=up.host())
        assert answer.status_code == 200, answer.text


async def test_lines_shown_before_a_sigkill_are_shown_after_the_restart(tmp_path: Path) -> None:
    app = printing_app(tmp_path)
    up = start_up(tmp_path, app)
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            await send(client, up, "before", 1)  # awake: the rest are answered at once
            async with anyio.create_task_group() as group:

                async def keep_asking() -> None:  # lines still coming when the kill lands
                    with contextlib.suppress(httpx.TransportError):
                        for i in range(1, 100_000):
                            await client.get(f"/before/{i}", headers=up.host())
                            await anyio.sleep(0.01)

                group.start_soon(keep_asking)
                shown = await logs_until(
                    up, lambda found: len(requested(found, "before")) >= 20, "--since", "1h"
                )
                assert len(requested(shown, "before")) >= 20, shown[-5:]
                up.process.kill()  # SIGKILL; its sandboxes die with it (parent-death signal)
                up.process.wait()
    finally:
        stop_up(up)
    (up.data_dir / "control.json").unlink()  # the next run writes it once it serves
    again = start_up(tmp_path, app)
    try:
        after = await logs(again, "--since", "1h")
        as_text = Counter(json.dumps(r, sort_keys=True) for r in after)
        lost = [r for r in shown if as_text[json.dumps(r, sort_keys=True)] == 0]
        assert lost == [], f"{len(lost)} of {len(shown)} lines lost, e.g. {lost[:3]}"
        paths = requested(after, "before")
        assert len(paths) == len(set(paths)), Counter(paths).most_common(3)  # none twice
        async with httpx.AsyncClient(base_url=again.proxy, timeout=60) as client:
            await send(client, again, "after", 5)
        after = await logs_until(
            again, lambda found: len(requested(found, "after")) == 5, "--since", "1h"
        )
        assert sorted(requested(after, "after")) == [f"/after/{i}" for i in range(5)], after[-5:]
    finally:
        stop_up(again)


async def test_the_access_log_has_one_line_per_request_as_the_client_saw_it(
    tmp_path: Path,
) -> None:
    count = 200
    run = secrets.token_hex(4)
    up = start_up(tmp_path, make_app(tmp_path))  # `wakeful up` logs every app's access
    sent: set[tuple[str, str, str, int, int]] = set()
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            for i in range(count):
                request_id = f"{run}-{i:03d}"
                headers = {**up.host(), "X-Request-Id": request_id}
                if i % 10 == 3:  # hello has no PUT: 501
                    method, path, target = "PUT", f"/put/{i}", f"/put/{i}"
                elif i % 10 == 7:  # a query string the log must leave out
                    method, path, target = "GET", f"/q/{i}", f"/q/{i}?token=s3cret{i}"
                else:
                    method, path, target = "GET", f"/get/{i}", f"/get/{i}"
                answer = await client.request(method, target, headers=headers)
                sent.add((request_id, method, path, answer.status_code, len(answer.content)))
        assert {status for _, _, _, status, _ in sent} == {200, 501}
        found = await logs_until(up, lambda lines: len(lines) >= count, "--access", "--since", "5m")
        got = Counter((r["id"], r["method"], r["path"], r["status"], r["bytes"]) for r in found)
        assert set(got) == sent
        assert max(got.values()) == 1, got.most_common(3)
        assert {r["sample"] for r in found} == {1}
        assert {r["app"] for r in found} == {"hello"}
        assert not [r for r in found if "?" in r["path"] or "s3cret" in json.dumps(r)]
    finally:
        stop_up(up)


@pytest.fixture
def small_log_dir(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB filesystem for the log directory, so a test can fill it (the data directory,
    and the store in it, stay on the usual disk)."""
    with contextlib.ExitStack() as stack:
        try:
            mount = stack.enter_context(small_filesystem(tmp_path / "logs", "2m"))
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"could not mount a tmpfs: {exc}")
        yield mount


async def dropped_for_disk(up: Up) -> float:
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.get(
            f"{up.api}/metrics", headers={"Authorization": f"Bearer {up.token}"}
        )
    answer.raise_for_status()
    found = re.search(
        r'^wakeful_logs_lines_dropped_total\{reason="disk"\} (\S+)$', answer.text, re.M
    )
    assert found is not None, answer.text
    return float(found.group(1))


async def test_a_full_log_disk_drops_lines_counted_and_said_and_the_app_serves(
    tmp_path: Path, small_log_dir: Path
) -> None:
    up = start_up(tmp_path, printing_app(tmp_path), env={"WAKEFUL_LOG_DIR": str(small_log_dir)})
    try:
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            await send(client, up, "warm", 1)
        warm = await logs_until(up, lambda found: requested(found, "warm") != [])
        assert requested(warm, "warm") == ["/warm/0"], warm
        filler = fill(small_log_dir)
        with Prober(up.proxy, "hello.localhost", "/full") as prober:
            # Each request makes an output line and an access line. Past the requests made
            # (the warm one, those answered, the one in flight), the drops cannot all be
            # access lines: output lines were dropped too. (What a segment's last page had
            # free takes a few lines first.)
            with anyio.fail_after(60):  # another process's metric: polled
                while await dropped_for_disk(up) <= 2 + len(prober.answers):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
        assert prober.failed() == []
        served = prober.served()
        assert up.process.poll() is None, stop_up(up)
        filler.unlink()
        # For a second after its last failed write an app's lines are dropped untried (its
        # last probe lines may have failed just now): the freed lines come after that.
        await anyio.sleep(FAILING_PAUSE + 0.5)
        async with httpx.AsyncClient(base_url=up.proxy, timeout=60) as client:
            await send(client, up, "freed", 5)

        def told(found: list[Record]) -> bool:
            freed = [r for r in found if "/freed/" in str(r.get("line", r.get("path")))]
            return len(freed) == 5 and any("wakeful" in r for r in found)

        output = await logs_until(up, told, "--since", "5m")
        access = await logs_until(up, told, "--access", "--since", "5m")
        assert told(output), output[-5:]
        assert told(access), access[-5:]
        # Every line counted is said lost in the log it was meant for: what was dropped
        # before the space came back is said with the first lines written after.
        said = [r["wakeful"] for r in output + access if "wakeful" in r]
        assert all(" lines lost here" in text for text in said), said
        assert sum(int(text.split()[0]) for text in said) == await dropped_for_disk(up), said
        # And a line is either in the log or counted lost, never both: a write the full disk
        # took only part of was cut back.
        shown = sum('"GET /full' in str(r.get("line", "")) for r in output)
        lost = sum(int(r["wakeful"].split()[0]) for r in output if "wakeful" in r)
        assert shown + lost == served, (shown, lost, served)
    finally:
        stop_up(up)
