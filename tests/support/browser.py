"""Debian's headless chromium driven through selenium and Debian's chromedriver (scripts/test
installs both), for the tests that need a real browser."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (scripts/test installs them)",
)


@contextlib.contextmanager
def chromium(*flags: str) -> Iterator[Any]:
    """A headless chromium (a selenium driver), with `flags` besides the usual ones."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in CI; the pages are the tests'
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        *flags,
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
