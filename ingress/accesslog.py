"""The ingress's access log (issue 40): a line per proxied request, shipped to the control
plane beside its traffic reports.

Theory of operation:
- `record` runs at the end of each request the log covers (every app's with
  `WAKEFUL_ACCESS_LOG`, else an app's whose lease says `access_log`): one sampling decision
  (`wakeful.domain.logfiles.Sampler`, per second of this ingress's clock, at most `rate`
  lines a second before it samples) and, when kept, one small dict appended. No I/O.
- `take` hands what was kept since the last call to the traffic report loop, which ships it
  (`Leases.access`). What waits is bounded (`max_held` lines, the oldest go first, counted):
  an activator out of reach never grows the ingress's memory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from wakeful.domain.logbatch import MAX_PATH
from wakeful.domain.logfiles import Sampler


class AccessLog:
    def __init__(
        self,
        every_app: bool,
        rate: int,
        registry: CollectorRegistry,
        *,
        max_held: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.every_app = every_app
        """`WAKEFUL_ACCESS_LOG`: every app's requests, not only those of apps that ask."""
        self._sampler = Sampler(rate)
        self._held: deque[dict[str, object]] = deque(maxlen=max_held or 10 * rate)
        self._clock = clock
        self.lines = Counter(
            "wakeful_ingress_access_lines_total",
            "Access lines by what became of them: kept, sampled (left out, a kept one stands "
            "for them), capped (past twice the rate in a second), overflowed (waiting to "
            "ship when the held lines were full)",
            ["outcome"],
            registry=registry,
        )
        self._kept = self.lines.labels(outcome="kept")
        self._sampled = self.lines.labels(outcome="sampled")
        self._capped = self.lines.labels(outcome="capped")
        self._overflowed = self.lines.labels(outcome="overflowed")

    def record(
        self,
        app: str,
        version: str,
        sandbox: str,
        method: str,
        target: bytes,
        status: int,
        sent: int,
        seconds: float,
        wake: str,
        request_id: str,
        query: bool,
    ) -> None:
        now = self._clock()
        capped = self._sampler.dropped
        sample = self._sampler.keep(int(now))
        if not sample:
            if self._sampler.dropped != capped:
                self._capped.inc()
            else:
                self._sampled.inc()
            return
        path = target if query else target.partition(b"?")[0]
        if len(self._held) == self._held.maxlen:
            self._overflowed.inc()
        self._held.append(
            {
                "ts": round(now, 6),
                "app": app,
                "version": version,
                "sandbox": sandbox,
                "method": method,
                "path": path[:MAX_PATH].decode("latin-1"),
                "status": status,
                "bytes": sent,
                "ms": round(seconds * 1000, 3),
                "wake": wake,
                "id": request_id,
                "sample": sample,
            }
        )
        self._kept.inc()

    def take(self) -> list[dict[str, object]]:
        """Every line kept since the last call, oldest first."""
        lines = list(self._held)
        self._held.clear()
        return lines

    def keep(self, lines: list[dict[str, object]]) -> None:
        """`lines` from `take` that could not go: held again before the newer ones, within the
        bound (the oldest go first, counted)."""
        room = (self._held.maxlen or 0) - len(self._held)
        if len(lines) > room:
            self._overflowed.inc(len(lines) - room)
            lines = lines[len(lines) - room :] if room > 0 else []
        self._held.extendleft(reversed(lines))
