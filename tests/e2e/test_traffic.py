"""Traffic between versions under `wakeful up` (issue 39), as a user drives it: a canary deploy
that takes its share evenly, a tag that reaches a version at 0% (which scales to zero and wakes
through its tag), `wakeful traffic`, promote and rollback; a prober beside it all the while
sees no failed request."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import anyio
import httpx
import pytest

from tests.support.up import Up, cli_async, start_up, stop_up

pytestmark = pytest.mark.anyio

APP = """\
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(__file__)
VERSION = open(os.path.join(HERE, "VERSION")).read().strip()
FAILING = os.path.exists(os.path.join(HERE, "FAIL"))  # then 3 of every 10 answers are 500s
COUNT = [0]


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = VERSION.encode()
        COUNT[0] += 1
        self.send_response(500 if FAILING and COUNT[0] % 10 < 3 else 200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), Handler).serve_forever()
"""


WEB = {"Host": "web.localhost"}


def versioned_app(root: Path) -> Path:
    app = root / "web"
    app.mkdir()
    (app / "app.py").write_text(APP)
    (app / "VERSION").write_text("1\n")
    (app / "wakeful.toml").write_text(
        'name = "web"\ncommand = ["python3", "app.py"]\nshutdown_timeout = 5\n'
        '[health]\npath = "/"\ntimeout = 20\n'
        '[concurrency]\nrequests_per_instance = 20\nscale_down_delay = "5s"\n'
        # Verdicts on errors here: p99 verdicts are table-tested (tests/domain/test_split.py)
        # and must not hang on a loaded machine's noise in an end-to-end test.
        "[rollout]\nmin_requests = 20\nmin_p99_increase_ms = 2000\n"
    )
    return app


async def at_zero(up: Up, pool: str, within: float = 60) -> dict[str, object]:
    """The pool's report once none of its sandboxes is live."""
    with anyio.fail_after(within):
        for _ in range(int(within * 10)):
            found = {str(p["pool"]): p for p in await up.pools()}[pool]
            if not found["live"]:
                return found
            await anyio.sleep(0.1)
    raise AssertionError(f"{pool} never went to zero")


async def wakeful(up: Up, *args: str) -> str:
    done = await cli_async(up, *args)
    assert done.returncode == 0, f"wakeful {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


Answer = tuple[float, int, str]
"""When a probed request was answered, its status and its body."""


async def probe(http: httpx.AsyncClient, answers: list[Answer], pause: float = 0.02) -> None:
    """Ask `web` until cancelled, noting every answer."""
    while True:
        answer = await http.get("/", headers=WEB)
        answers.append((anyio.current_time(), answer.status_code, answer.text[:200]))
        await anyio.sleep(pause)


async def test_a_canary_a_tag_and_a_promotion_with_no_failed_request(tmp_path: Path) -> None:
    app = versioned_app(tmp_path)
    up = start_up(tmp_path, app)
    answers: list[Answer] = []
    try:
        async with (
            httpx.AsyncClient(base_url=up.proxy, timeout=60) as http,
            anyio.create_task_group() as probing,
        ):
            web = WEB
            assert (await http.get("/", headers=web)).text == "1"
            probing.start_soon(probe, http, answers)

            (app / "VERSION").write_text("2\n")
            said = await wakeful(up, "deploy", str(app), "--canary", "10")
            assert "web v2 takes 10% beside v1" in said
            shown = (await wakeful(up, "traffic", "web")).splitlines()
            assert shown[0].split()[:3] == ["VERSION", "SHARE", "TAGS"]
            assert [line.replace("*", " ").split()[:3] for line in shown[1:]] == [
                ["v1", "90%", "-"],
                ["v2", "10%", "-"],
            ]
            assert shown[1].startswith("* v1")

            got: Counter[str] = Counter()

            async def some(n: int) -> None:
                for _ in range(n):
                    got[(await http.get("/", headers=web)).text] += 1

            async with anyio.create_task_group() as load:
                for _ in range(10):
                    load.start_soon(some, 100)
            # One ingress spreads a split exactly (the prober's requests are among its
            # picks too, so these 1,000 are within a few of it).
            assert 90 <= got["2"] <= 110 and got["1"] + got["2"] == 1000, got
            # Each version's figures, from the ingress's reports (every ~2 s).
            with anyio.fail_after(30):
                for _ in range(300):
                    figures = json.loads(await wakeful(up, "traffic", "web", "--json"))["figures"]
                    if sum(f["requests"] for f in figures.values()) >= 1000:
                        break
                    await anyio.sleep(0.1)
            share = figures["v2"]["requests"] / (
                figures["v1"]["requests"] + figures["v2"]["requests"]
            )
            assert 0.08 < share < 0.12, figures
            assert figures["v2"]["error_ratio"] == 0 and figures["v2"]["p99_ms"] > 0

            # A tag reaches v2 at 0%, which then goes to zero and wakes through its tag.
            await wakeful(up, "tag", "web", "v2", "beta")
            await wakeful(up, "traffic", "web", "v1=100")
            beta = {"Host": "beta--web.localhost"}
            assert (await http.get("/", headers=beta)).text == "2"
            for _ in range(50):
                assert (await http.get("/", headers=web)).text == "1"
            v2 = await at_zero(up, "web-v2")
            assert v2["state"] == "active" and v2["desired_instances"] == 0
            assert (await http.get("/", headers=beta)).text == "2"

            # Split again, then promote: everything to v2; rollback: everything to v1.
            await wakeful(up, "traffic", "web", "v1=50", "latest=50")
            assert {(await http.get("/", headers=web)).text for _ in range(10)} == {"1", "2"}
            await wakeful(up, "promote", "web")
            assert {(await http.get("/", headers=web)).text for _ in range(50)} == {"2"}
            await wakeful(up, "rollback", "web")
            assert {(await http.get("/", headers=web)).text for _ in range(50)} == {"1"}
            assert (await http.get("/", headers=beta)).text == "2"  # the tag outlives it all
            probing.cancel_scope.cancel()
    finally:
        stop_up(up)
    assert [a for a in answers if a[1] != 200] == []


async def test_a_failing_ramp_rolls_back_by_itself_and_a_healthy_one_reaches_100(
    tmp_path: Path,
) -> None:
    """`deploy --ramp`: a version answering 500 on 30% of requests is sent back by itself
    (the command says why and exits 1; the prober sees no 500 after); the next, healthy, goes
    1% → 100% in steps with no failed request."""
    app = versioned_app(tmp_path)
    up = start_up(tmp_path, app)
    answers: list[Answer] = []
    try:
        async with (
            httpx.AsyncClient(base_url=up.proxy, timeout=60) as http,
            anyio.create_task_group() as probing,
        ):
            web = WEB
            assert (await http.get("/", headers=web)).text == "1"
            for _ in range(4):
                probing.start_soon(probe, http, answers, 0.01)

            (app / "VERSION").write_text("2\n")
            (app / "FAIL").write_text("")
            done = await cli_async(up, "deploy", str(app), "--ramp", "60s", "--canary", "20")
            ended = anyio.current_time()
            assert done.returncode == 1, done.stdout + done.stderr
            assert "web v2 rolled back at 20%: 5xx on" in done.stdout, done.stdout
            await anyio.sleep(3)
            late = [a for a in answers if a[0] > ended + 0.5]
            assert late and all(status == 200 and text == "1" for _, status, text in late)

            (app / "VERSION").write_text("3\n")
            (app / "FAIL").unlink()
            start = len(answers)
            said = await wakeful(up, "deploy", str(app), "--ramp", "12s")
            assert "web v3 is live: the ramp reached 100%" in said, said
            during = answers[start:]
            assert all(status == 200 for _, status, _ in during), [a for a in during if a[1] != 200]
            assert {text for _, _, text in during} == {"1", "3"}
            for _ in range(20):
                assert (await http.get("/", headers=web)).text == "3"
            probing.cancel_scope.cancel()
    finally:
        stop_up(up)
