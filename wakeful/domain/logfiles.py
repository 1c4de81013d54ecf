"""The log directory's rules (issue 40): how segments are named, which a read opens, what
retention deletes, and how an ingress samples its access log. Pure: the writer
(`wakeful.deploy.logdir`) and the reader (`wakeful.deploy.logread`) do the I/O.

The layout, under the log directory (`WAKEFUL_LOG_DIR`), documented for shippers:

    apps/<app>/<kind>/<start>-<writer>.jsonl              a segment being written
    apps/<app>/<kind>/<start>-<end>-<writer>.jsonl.gz     a closed one, compressed

`kind` is `output` (what the app's sandboxes wrote) or `access` (the ingresses' access log);
`start` and `end` are the times of the first and last line, UTC milliseconds since the epoch,
13 digits, so names sort by time; `writer` names the control plane that wrote the segment (its
term: `t<revision>` of the election, or `u<id>` for one `wakeful up`). A writer only ever
opens segments that bear its own name, so a deposed leader's late appends land in its own
files and never in the new leader's: the fence is the file name. Every line is one JSON
object ending in "\n"; a last line without its "\n" (a crash mid-write) is not a line.

Rules:
- A read opens only segments whose span meets the asked range: an open segment spans from its
  start to now; a closed one to its end.
- Retention deletes closed segments only, oldest end first: those ended before the retention
  age, then an app's oldest while the app holds more than its bound, then the oldest of all
  while the directory holds more than its bound. An open segment is closed when it passes
  its size or its age, so every line becomes deletable within one segment's span.
- Sampling (`wakeful.domain.sampling.Sampler`, compiled with the ingress: it decides for
  every request): an ingress keeps every access line while it logs at most `rate` per window;
  past that it keeps one in `k`, `k` sized from the previous window, each kept line saying
  `k` (it stands for `k` requests); and it never keeps more than twice the rate in a window.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from wakeful.domain.grpcstatus import code_name

Kind = Literal["output", "access"]
KINDS: tuple[Kind, ...] = ("output", "access")
OPEN_SUFFIX = ".jsonl"
CLOSED_SUFFIX = ".jsonl.gz"
WRITER = re.compile(r"[a-z][a-z0-9]{0,39}")
_OPEN = re.compile(r"(\d{13})-([a-z][a-z0-9]{0,39})\.jsonl")
_CLOSED = re.compile(r"(\d{13})-(\d{13})-([a-z][a-z0-9]{0,39})\.jsonl\.gz")


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment file of an app's log of one kind."""

    app: str
    kind: Kind
    start: int
    """Milliseconds: the first line's time."""
    end: int | None
    """Milliseconds: the last line's time; None while the segment is open."""
    writer: str
    size: int = 0
    """Bytes on disk."""

    @property
    def name(self) -> str:
        if self.end is None:
            return f"{self.start:013d}-{self.writer}{OPEN_SUFFIX}"
        return f"{self.start:013d}-{self.end:013d}-{self.writer}{CLOSED_SUFFIX}"

    def meets(self, since: int | None, until: int | None) -> bool:
        """Whether it may hold lines in [since, until] (ms; None: unbounded)."""
        if until is not None and self.start > until:
            return False
        return since is None or self.end is None or self.end >= since


def parse_segment(app: str, kind: Kind, name: str, size: int = 0) -> Segment | None:
    """The segment a file name describes; None for any other file (a temporary one, say)."""
    if match := _OPEN.fullmatch(name):
        return Segment(app, kind, int(match[1]), None, match[2], size)
    if match := _CLOSED.fullmatch(name):
        start, end = int(match[1]), int(match[2])
        return Segment(app, kind, start, end, match[3], size) if end >= start else None
    return None


def reading_order(segments: Iterable[Segment]) -> list[Segment]:
    """Segments in the order their lines are read: by start, then closed before open. A
    closed segment hides the open file it was made from (same start and writer) while the
    writer removes that file."""
    closed = {(s.app, s.kind, s.start, s.writer) for s in segments if s.end is not None}
    kept = [
        s for s in segments if s.end is not None or (s.app, s.kind, s.start, s.writer) not in closed
    ]
    return sorted(kept, key=lambda s: (s.start, s.end is None, s.writer))


@dataclass(frozen=True, slots=True)
class Limits:
    retention: float
    """Seconds a line is kept."""
    max_bytes: int
    """The whole directory."""
    app_max_bytes: int
    """One app, both kinds."""


def expired(segments: Sequence[Segment], now_ms: int, limits: Limits) -> list[Segment]:
    """The closed segments retention deletes now, oldest first (see the module's rules)."""
    gone: dict[Segment, None] = {}
    cutoff = now_ms - int(limits.retention * 1000)
    closed = sorted((s for s in segments if s.end is not None), key=lambda s: (s.end, s.start))
    for segment in closed:
        if segment.end is not None and segment.end < cutoff:
            gone[segment] = None
    per_app: dict[str, int] = {}
    for segment in segments:
        per_app[segment.app] = per_app.get(segment.app, 0) + segment.size
    for segment in gone:
        per_app[segment.app] -= segment.size
    for segment in closed:
        if segment not in gone and per_app[segment.app] > limits.app_max_bytes:
            gone[segment] = None
            per_app[segment.app] -= segment.size
    total = sum(per_app.values())
    for segment in closed:
        if total <= limits.max_bytes:
            break
        if segment not in gone:
            gone[segment] = None
            total -= segment.size
    return list(gone)


# -- times ------------------------------------------------------------------------------------


def to_ms(seconds: float) -> int:
    return int(seconds * 1000)


def iso(seconds: float) -> str:
    """`2026-12-05T05:40:01.123456Z`: a line's `time` field (each line's: the second's part
    is formatted once a second)."""
    micros = int(seconds * 1_000_000)
    return f"{_second(micros // 1_000_000)}.{micros % 1_000_000:06d}Z"


@functools.lru_cache(maxsize=8)
def _second(whole: int) -> str:
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")


_AGE = re.compile(r"([0-9]{1,12}(?:\.[0-9]{1,9})?)(ms|s|m|h|d)")
LATEST = 1e11
"""The largest time a line or a query may name (the year 5138): beyond any clock's."""
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_age(value: object) -> object:
    """Seconds of "90s", "15m", "1h", "7d"; anything else as it is (pydantic names it)."""
    if isinstance(value, str) and (match := _AGE.fullmatch(value.strip())):
        return float(match[1]) * _UNIT[match[2]]
    return value


def parse_time(value: str, now: float) -> float:
    """Seconds since the epoch of `--since`/`--until`: a duration back from `now` ("90s",
    "15m", "1h", "2d"), an RFC 3339 time ("2026-12-05T05:40:00Z"; without a zone, UTC), or a
    number of seconds since the epoch. ValueError names the value."""
    text = value.strip()
    age = parse_age(text)
    if isinstance(age, float):
        return now - age
    if re.fullmatch(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", text) and float(text) <= LATEST:
        return float(text)
    try:
        if len(text) > 40 or not re.match(r"[0-9]{4}-", text):  # an RFC 3339 date first
            raise ValueError(text)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{value!r}: not a time; give a duration back from now (90s, 15m, 1h, 2d), "
            "an RFC 3339 time (2026-12-05T05:40:00Z) or seconds since the epoch"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


# -- a line as a person reads it --------------------------------------------------------------


def line_text(record: dict[str, Any], kind: Kind) -> str:
    """A record without its time: `[sandbox] text` of an output line, `[sandbox] GET /path
    200 512B 3.1ms ...` of an access line (a gRPC call's with `grpc=UNAVAILABLE` next),
    `[wakeful] ...` of the log's own notes. Raw: what an app controls is not escaped here
    (`wakeful.domain.shown`, before a terminal)."""
    if "wakeful" in record:
        return f"[wakeful] {record['wakeful']}"
    sandbox = record.get("sandbox") or "-"
    if kind == "output":
        return f"[{sandbox}] {record.get('line', '')}"
    parts = [
        f"[{sandbox}]",
        str(record.get("method", "")),
        str(record.get("path", "")),
        str(record.get("status", "")),
        f"{record.get('bytes', 0)}B",
        f"{record.get('ms', 0)}ms",
    ]
    code = record.get("grpc_status")  # a gRPC call's
    if isinstance(code, int):
        parts.append(f"grpc={code_name(code)}")
    if record.get("version"):
        parts.append(f"version={record['version']}")
    if record.get("wake"):
        parts.append(f"woke={record['wake']}")
    if record.get("id"):
        parts.append(f"id={record['id']}")
    if record.get("sample", 1) != 1:
        parts.append(f"(1 in {record['sample']})")
    return " ".join(parts)


def short_time(record: dict[str, Any]) -> str:
    """`2026-12-05T05:40:01.123Z` of a record's `time` (milliseconds)."""
    text = str(record.get("time", ""))
    return text[:23] + "Z" if len(text) > 23 else text
