"""A browser's HTTP/2 through the ingress: Debian's headless chromium (selenium, as the
dashboard's browser test) against the ingress's TLS listener, certificates from a test CA,
hello sandboxes behind it speaking HTTP/1.1.

The page and what it fetches arrive over `h2` (ALPN), many requests at once on one connection
(multiplexed: the resource timings all name `h2`), a POST's body crosses, and the sandbox was
sent HTTP/1.1 marked https.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.browser import chromium, needs_chromium
from tests.support.certs import ingress_pki
from tests.support.ingress import stack

pytestmark = [pytest.mark.anyio, needs_chromium]

FETCHES = """
const done = arguments[arguments.length - 1];
const body = 'x'.repeat(100000);
Promise.all([
  ...Array.from({length: 20}, (_, i) => fetch('/sleep?s=0.2&i=' + i).then(r => r.text())),
  fetch('/echo', {method: 'POST', body}).then(r => r.text()),
]).then(texts => done({
  texts,
  protocols: performance.getEntriesByType('resource').map(e => e.nextHopProtocol),
  page: performance.getEntriesByType('navigation')[0].nextHopProtocol,
})).catch(e => done({error: String(e)}));
"""


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium(
        "--host-resolver-rules=MAP hello.localhost 127.0.0.1",
        "--ignore-certificate-errors",  # the test CA is not the browser's
    ) as driver:
        driver.set_script_timeout(60)
        yield driver


async def test_a_browser_gets_http2_over_tls_and_many_requests_on_one_connection(
    browser: Any, hello: Callable[[], int], tmp_path: Path
) -> None:
    _, certs = ingress_pki(tmp_path)
    async with stack({"s1": hello(), "s2": hello()}, tls_listen="127.0.0.1:0", tls_dir=certs) as s:
        url = f"https://hello.localhost:{s.ingress.tls_address[1]}/headers"

        def visit() -> tuple[str, dict[str, Any]]:
            browser.get(url)
            page = browser.find_element("tag name", "body").text
            return page, browser.execute_async_script(FETCHES)

        page, result = await anyio.to_thread.run_sync(visit)
        assert "error" not in result, result
        assert result["page"] == "h2", result
        assert result["protocols"] and set(result["protocols"]) == {"h2"}, result
        texts = result["texts"]
        assert all(t.startswith("slept in ") for t in texts[:20]), texts
        assert texts[20] == "x" * 100_000
        seen = page.lower()  # what the sandbox was sent for the page: HTTP/1.1, https
        assert "x-forwarded-proto: https" in seen and "host: hello.localhost" in seen
        assert s.sample("requests_total", app="hello", status_class="2xx") >= 22  # + favicon
