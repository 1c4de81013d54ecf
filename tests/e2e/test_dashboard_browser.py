"""The dashboard in a real browser: Debian's headless chromium driven through selenium and
Debian's chromedriver (scripts/test installs both), against a real `wakeful up`.

A wrong token is refused; the admin token logs in; the app shows at zero; one request through
the ingress (its answer carries `Server-Timing` with the wake) brings the app's row to 1 ready
without a reload, with the scale-up event and its demand numbers; then the control plane is
restarted and the same page, never reloaded, goes back to live on its own. Screenshots go to
`WAKEFUL_TEST_ARTIFACTS` (default `.artifacts/` in the checkout).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.browser import chromium, needs_chromium
from tests.support.up import Up, cli, make_app, start_up, stop_up
from wakeful.testing import up_command

ARTIFACTS = Path(os.environ.get("WAKEFUL_TEST_ARTIFACTS", Path(__file__).parents[2] / ".artifacts"))
WAIT = 90.0
"""A generous bound for what takes a second on an idle machine (CI machines are loaded)."""

pytestmark = needs_chromium


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium("--window-size=1280,1000") as driver:
        yield driver


def until(driver: Any, check: Callable[[Any], Any], what: str) -> Any:
    """Poll `check` in the page until it holds (selenium's wait), naming what failed."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(check)
    except TimeoutException:
        shot(driver, "failed")
        raise AssertionError(f"the page never showed {what}") from None


def text(driver: Any, selector: str) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.CSS_SELECTOR, selector).text).strip()
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def shot(driver: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"dashboard-{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def log_in(driver: Any, url: str, secret: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/ui")
    field = until(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#login input"), "a form")
    field.clear()
    field.send_keys(secret)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()


def choose_logs_of(driver: Any, app: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def offered(d: Any) -> bool:
        options = Select(d.find_element(By.ID, "logs-app")).options
        return app in [o.get_attribute("value") for o in options]

    until(driver, offered, f"{app} in the logs panel's list")
    Select(driver.find_element(By.ID, "logs-app")).select_by_value(app)


def restart(up: Up) -> subprocess.Popen[str]:
    """`wakeful up` again on the same ports and data directory: the app is in its store."""
    stop_up(up)
    ports = [urlsplit(url).port for url in (up.proxy, up.api, up.admin)]
    proxy, api, admin = (int(p or 0) for p in ports)
    process = subprocess.Popen(
        up_command(up.data_dir, [], proxy=proxy, api=api, admin=admin, idle_interval=1.0),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        text=True,
    )
    up.process = process
    return process


def test_log_in_watch_an_app_wake_and_follow_a_restart(tmp_path: Path, browser: Any) -> None:
    up = start_up(tmp_path, make_app(tmp_path, rpi=2, delay="300s"))
    try:
        log_in(browser, up.api, "not-the-token")
        until(browser, lambda d: "not valid" in (text(d, "#login-error") or ""), "a refusal")
        assert browser.get_cookie("wakeful_session") is None

        log_in(browser, up.api, up.token)
        until(browser, lambda d: text(d, "#conn") == "live", "the stream live")
        assert up.token not in browser.current_url
        row = '[data-app="hello"]'
        until(browser, lambda d: text(d, f'{row} [data-field="ready"]') == "0", "hello at zero")
        assert text(browser, f'{row} [data-field="desired"]') == "0"
        browser.execute_script("window.wakefulNotReloaded = true")

        answer = httpx.get(up.proxy + "/", headers=up.host(), timeout=WAIT)
        assert answer.status_code == 200
        timing = answer.headers["server-timing"]  # on under `wakeful up`
        assert "queue;dur=" in timing and "wake;dur=" in timing and "upstream;dur=" in timing

        until(browser, lambda d: text(d, f'{row} [data-field="ready"]') == "1", "hello ready")
        event = until(
            browser,
            lambda d: text(d, '#events li[data-kind="scale_up"]'),
            "the scale-up event",
        )
        assert "hello" in event and "demand: 0 leased + 1 waiting at 2 per sandbox" in event
        woke = until(browser, lambda d: text(d, f"{row} [data-wakes]"), "how it woke")
        assert woke.startswith("woke it: 0 thaw · 1 start · last: start, ")
        assert browser.execute_script("return window.wakefulNotReloaded") is True
        shot(browser, "live")

        # The control plane goes away and comes back: the page follows without a reload,
        # with the session it had (its key is in the store).
        process = restart(up)
        until(browser, lambda d: text(d, "#conn") != "live", "the stream lost")
        deadline = time.monotonic() + WAIT
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(up.api + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        until(browser, lambda d: text(d, "#conn") == "live", "the stream live again")
        until(browser, lambda d: text(d, row) is not None, "hello after the restart")
        assert browser.execute_script("return window.wakefulNotReloaded") is True
        shot(browser, "after-restart")

        # The logs panel (issue 40): the request from before the restart is in the access
        # log, the app's output too: both were on disk, not in the old process's memory.
        choose_logs_of(browser, "hello")
        access = until(browser, lambda d: text(d, "#logs .log:nth-child(2) pre"), "access lines")
        assert " GET / 200 " in access and "woke=start" in access, access
        output = until(browser, lambda d: text(d, "#logs .log:nth-child(1) pre"), "output")
        assert "[hello-v1-" in output, output

        # A canary: the card shows the split, the rollouts what it did (issue 39).
        app_dir = tmp_path / "hello"
        (app_dir / "NEW").write_text("v2\n")
        done = cli(up, "deploy", str(app_dir), "--canary", "10")
        assert done.returncode == 0, done.stdout + done.stderr
        split = until(browser, lambda d: text(d, f"{row} .traffic"), "the split on the card")
        assert split == "split v1 90% · v2 10%"
        canary = until(
            browser, lambda d: text(d, '[data-rollout="hello/v2"] .message'), "the canary"
        )
        assert "hello v2 takes 10% beside v1" in canary
    finally:
        stop_up(up)
