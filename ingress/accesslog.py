"""The ingress's access log (issue 40): a line per proxied request, shipped to the control
plane beside its traffic reports.

Theory of operation:
- At the end of each request the log covers (every app's with `WAKEFUL_ACCESS_LOG`, else an
  app's whose lease says `access_log`), `sample` makes one sampling decision
  (`wakeful.domain.sampling.Sampler`, per second of this ingress's clock, at most `rate`
  lines a second before it samples) and, when the line is kept, `record` appends one small
  dict. No I/O.
- `take` hands what was kept since the last call to the traffic report loop, which ships it
  (`Leases.access`). What waits is bounded (`max_held` lines, the oldest go first, counted):
  an activator out of reach never grows the ingress's memory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from wakeful.domain.logbatch import MAX_PATH
from wakeful.domain.sampling import Sampler
from wakeful.ingress.cacherules import CachedLease

OUTCOMES = ("kept", "sampled", "capped", "overflowed")


class _Outcomes(Collector):
    """What became of each request's line, counted in plain integers on the request path and
    exported as `wakeful_ingress_access_lines_total{outcome}`."""

    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        lines = CounterMetricFamily(
            "wakeful_ingress_access_lines",
            "Access lines by what became of them: kept, sampled (left out, a kept one stands "
            "for them), capped (past twice the rate in a second), overflowed (waiting to "
            "ship when the held lines were full)",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            lines.add_metric([outcome], self._counts[outcome])
        yield lines


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
        self._asked: dict[str, tuple[bool, bool]] = {}
        """Per app, what its last lease here said of its log (`wants`)."""
        self.counts = dict.fromkeys(OUTCOMES, 0)
        """What became of each request's line (`wakeful_ingress_access_lines_total`)."""
        registry.register(_Outcomes(self.counts))

    def wants(self, app: str, asked: tuple[bool, bool] | None) -> tuple[bool, bool]:
        """Whether `app`'s request gets a line, and with its query string: as its lease says
        (`asked`: its grant's `access_log` and `access_log_query`), or for a request that got
        none (a 503 while it woke, a 502), as its last lease here said (an app never leased
        here: only with `every_app`)."""
        if asked is not None:
            self._asked[app] = asked
        else:
            asked = self._asked.get(app, (False, False))
        return self.every_app or asked[0], asked[1]

    def sample(self) -> int:
        """Whether this request gets a line: 0 when it does not (counted: sampled, or capped
        past twice the rate in a second), else how many requests its line stands for, for
        `record`. Asked first, so that a request left out makes no line's fields."""
        sampler = self._sampler
        capped = sampler.dropped
        sample = sampler.keep(int(self._clock()))
        if not sample:
            if sampler.dropped != capped:
                self.counts["capped"] += 1
            else:
                self.counts["sampled"] += 1
        return sample

    def request(
        self,
        app: str,
        version: str | None,
        lease: CachedLease | None,
        method: str,
        target: bytes,
        status: int,
        sent: int,
        seconds: float,
        wake: str,
        request_id: str,
        grpc_status: int | None,
    ) -> None:
        """A request's line (`record`) when the log wants the app's requests (`wants`, asked
        by the app through its `lease`, if it got one) and samples this one; `version` when
        it got no lease."""
        wants, query = self.wants(app, None if lease is None else lease.log)
        if wants and (sample := self.sample()):
            self.record(
                app,
                (version or "") if lease is None else lease.grant.version,
                "" if lease is None else lease.sandbox_id,
                method,
                target,
                status,
                sent,
                seconds,
                wake,
                request_id,
                query,
                sample,
                grpc_status,
            )

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
        sample: int,
        grpc_status: int | None = None,
    ) -> None:
        """One request's line, `sample` (from `sample`, not 0) standing for that many; a gRPC
        call's holds the code it ended with (`grpc_status`, the number: `grpc.call_code`),
        other requests' have no such field."""
        path = target if query else target.partition(b"?")[0]
        if len(self._held) == self._held.maxlen:
            self.counts["overflowed"] += 1
        line: dict[str, object] = {
            "ts": round(self._clock(), 6),
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
        if grpc_status is not None:
            line["grpc_status"] = grpc_status
        self._held.append(line)
        self.counts["kept"] += 1

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
            self.counts["overflowed"] += len(lines) - room
            lines = lines[len(lines) - room :] if room > 0 else []
        self._held.extendleft(reversed(lines))
