"""A sandbox's lifecycle, as data. The one rule: a status changes only along this table.

    pending ──start──▶ booting ──ready──▶ running ──drain──▶ draining ──stop──▶ stopping
       │                 │                ▲    │                  │                   │
       │                 │           thaw │    │ suspend          │                   │
       │                 │                │    ▼                  │                   │
       │                 │               suspended ─drain─────────┘                   │
       └──────────────── exit / fail (any live status) ──────────────────▶ dead   stopped

`stop` is also allowed from pending, booting, running and suspended (a scale-down of a
sandbox that never served, or one that holds no leases). `suspend` and `thaw` are the
activator's (a frozen sandbox holds no lease; `wakeful.activator.suspend`); the node freezes
a sandbox while its record says `suspended` and thaws it on any other status. An illegal
event raises and changes nothing.
"""

from __future__ import annotations

from enum import StrEnum

from wakeful.domain.models import SandboxStatus as S


class Transition(StrEnum):
    START = "start"
    READY = "ready"
    DRAIN = "drain"
    STOP = "stop"
    SUSPEND = "suspend"
    THAW = "thaw"
    STOPPED = "stopped"
    FAIL = "fail"


class IllegalTransition(ValueError):
    pass


TABLE: dict[tuple[S, Transition], S] = {
    (S.PENDING, Transition.START): S.BOOTING,
    (S.BOOTING, Transition.READY): S.RUNNING,
    (S.RUNNING, Transition.DRAIN): S.DRAINING,
    (S.RUNNING, Transition.SUSPEND): S.SUSPENDED,
    (S.SUSPENDED, Transition.THAW): S.RUNNING,
    (S.SUSPENDED, Transition.DRAIN): S.DRAINING,
    (S.SUSPENDED, Transition.STOP): S.STOPPING,
    (S.SUSPENDED, Transition.FAIL): S.DEAD,
    (S.PENDING, Transition.STOP): S.STOPPING,
    (S.BOOTING, Transition.STOP): S.STOPPING,
    (S.RUNNING, Transition.STOP): S.STOPPING,
    (S.DRAINING, Transition.STOP): S.STOPPING,
    (S.STOPPING, Transition.STOPPED): S.STOPPED,
    (S.PENDING, Transition.FAIL): S.DEAD,
    (S.BOOTING, Transition.FAIL): S.DEAD,
    (S.RUNNING, Transition.FAIL): S.DEAD,
    (S.DRAINING, Transition.FAIL): S.DEAD,
    (S.STOPPING, Transition.FAIL): S.DEAD,
}


def transition(status: S, event: Transition) -> S:
    try:
        return TABLE[(status, event)]
    except KeyError:
        raise IllegalTransition(f"a {status.value} sandbox cannot {event.value}") from None


def can(status: S, event: Transition) -> bool:
    return (status, event) in TABLE
