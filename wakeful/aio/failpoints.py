"""Failpoints: named places where a test makes a piece (a node agent, an activator) die on the
spot, to prove what a crash exactly there leaves behind (etcd's gofail, FoundationDB's
buggify: same idea, smaller).

Off unless `WAKEFUL_FAILPOINTS` names them (comma-separated), read once at import; a piece that
reaches an armed one logs it and sends itself SIGKILL, as the kernel's OOM killer or a power
cut would end it: no cleanup, no shutdown path. Nobody sets it in production.

| name                   | piece     | where                                                   |
|------------------------|-----------|---------------------------------------------------------|
| `state-before-restore` | node      | a stateful sandbox's state adopted, before it is fetched |
| `state-before-archive` | node      | a stateful sandbox ended, before its state is packed     |
| `state-after-archive`  | node      | its archive saved, before it is stored and released      |
| `state-after-release`  | node      | its state released, before the local copy goes           |
| `acme-after-publish`   | activator | an ACME order's challenge in the store, not answered yet |
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)
ARMED = frozenset(filter(None, os.environ.get("WAKEFUL_FAILPOINTS", "").split(",")))


def reach(name: str) -> None:
    if name in ARMED:
        log.critical("failpoint %s reached: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)
