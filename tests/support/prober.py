"""A prober: one app asked in a loop from a thread of its own while a test changes something
under it, every answer recorded, so the test can say that no request failed."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Answer:
    at: float
    """`time.monotonic()` when it came."""
    status: int | str
    """The status, or the name of the error that stood for one (a refused connection...)."""
    text: str


class Prober:
    """GET `path` with `Host: host` through `proxy` every `pause` seconds until the `with`
    block ends."""

    def __init__(
        self, proxy: str, host: str, path: str = "/", pause: float = 0.02, timeout: float = 60
    ) -> None:
        self.answers: list[Answer] = []
        self._proxy, self._host, self._path, self._pause = proxy, host, path, pause
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=180)

    def _run(self) -> None:
        with httpx.Client(base_url=self._proxy, timeout=self._timeout) as client:
            while not self._stop.is_set():
                try:
                    answer = client.get(self._path, headers={"Host": self._host})
                    status: int | str = answer.status_code
                    text = answer.text
                except httpx.HTTPError as exc:
                    status, text = type(exc).__name__, str(exc)
                self.answers.append(Answer(time.monotonic(), status, text))
                self._stop.wait(self._pause)

    def failed(self, since: float = 0.0) -> list[Answer]:
        """The answers from `since` (`time.monotonic()`) on that were not 200."""
        return [a for a in self.answers if a.at >= since and a.status != 200]

    def served(self) -> int:
        """How many answers were 200."""
        return sum(1 for answer in self.answers if answer.status == 200)

    def wait_served(self, more: int, within: float = 30) -> None:
        """Until `more` answers of 200 came after the call (or `within` passed)."""
        target = self.served() + more
        deadline = time.monotonic() + within
        while self.served() < target and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_for(self, text: str, times: int = 10, within: float = 120) -> None:
        """Until the last `times` answers all read `text` (every sandbox serves it)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            last = self.answers[-times:]
            if len(last) == times and all(answer.text == text for answer in last):
                return
            time.sleep(0.05)
        raise AssertionError(f"never {times} answers of {text!r} in a row: {self.answers[-5:]}")
