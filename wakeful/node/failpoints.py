"""Failpoints: named places where a test makes the node agent die on the spot, to prove what a
crash exactly there leaves behind (etcd's gofail, FoundationDB's buggify: same idea, smaller).

Off unless `WAKEFUL_FAILPOINTS` names them (comma-separated), read once at import; a node that
reaches an armed one logs it and sends itself SIGKILL, as the kernel's OOM killer or a power
cut would end it: no cleanup, no shutdown path. Nobody sets it in production.

| name                   | where                                                           |
|------------------------|-----------------------------------------------------------------|
| `state-before-restore` | a stateful sandbox's state adopted here, before it is fetched     |
| `state-before-archive` | a stateful sandbox ended and reported, before its state is packed |
| `state-after-archive`  | its archive saved on this node, before it is stored and released |
| `state-after-release`  | its state released with the stored archive, before the local copy goes |
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
