"""The dashboard's scale events (`wakeful.dashboard.snapshot.scale_events`): each pool's
`last_scale` is shown once, in the order the changes were written."""

from __future__ import annotations

from typing import Any

import pytest

from wakeful.dashboard.snapshot import certs_by_app, scale_events
from wakeful.domain.models import AppSpec, CertRecord, CertState, Issued, Pool, ScaleChange


def pool(name: str, change: tuple[float, int, int] | None) -> Pool:
    last = None
    if change is not None:
        at, before, after = change
        last = ScaleChange(
            at=at,
            by="demand",
            from_instances=before,
            to_instances=after,
            reason=f"{name} at {at:g}",
        )
    return Pool(name=name, app="a", version="v1", spec=AppSpec(command=["x"]), last_scale=last)


def shown(events: list[dict[str, Any]]) -> list[tuple[str, str, float]]:
    return [(e["pool"], e["kind"], e["at"]) for e in events]


@pytest.mark.parametrize(
    ("pools", "recorded", "events", "after"),
    [
        pytest.param([pool("p", None)], {}, [], {}, id="a pool never scaled shows nothing"),
        pytest.param(
            [pool("p", (10.0, 1, 3))],
            {},
            [("p", "scale_up", 10.0)],
            {"p": 10.0},
            id="a new scale-up is shown and recorded",
        ),
        pytest.param(
            [pool("p", (10.0, 3, 1))],
            {"p": 10.0},
            [],
            {"p": 10.0},
            id="a change recorded already is not shown again",
        ),
        pytest.param(
            [pool("p", (20.0, 3, 0))],
            {"p": 10.0},
            [("p", "scale_down", 20.0)],
            {"p": 20.0},
            id="a later change of the same pool is shown",
        ),
        pytest.param(
            [pool("late", (30.0, 1, 2)), pool("early", (5.0, 2, 1))],
            {},
            [("early", "scale_down", 5.0), ("late", "scale_up", 30.0)],
            {"late": 30.0, "early": 5.0},
            id="fresh events come oldest first, whatever the pools' order",
        ),
        pytest.param(
            [pool("p", (10.0, 1, 2))],
            {"p": 10.0, "gone": 3.0},
            [],
            {"p": 10.0},
            id="a pool that is gone is forgotten",
        ),
    ],
)
def test_scale_events(
    pools: list[Pool],
    recorded: dict[str, float],
    events: list[tuple[str, str, float]],
    after: dict[str, float],
) -> None:
    fresh, now_recorded = scale_events(pools, recorded)
    assert (shown(fresh), now_recorded) == (events, after)


def test_each_app_shows_its_certificates_state_expiry_and_error_never_a_key() -> None:
    sealed = "v1:0123456789ab:" + "A" * 64
    issued = Issued(chain="-", not_before=0, not_after=500.0, issuer="CN=x", serial="1")
    records = [
        CertRecord(name="www.shop.test", app="shop", state=CertState.VALID, issued=issued),
        CertRecord(
            name="shop.test",
            app="shop",
            state=CertState.FAILING,
            issued=issued,
            failures=2,
            last_error="validation failed: connection refused",
        ),
        CertRecord(name="blog.test", app="blog", state=CertState.ORDERING),
        CertRecord(name="old.test", state=CertState.VALID, issued=issued),  # no app: not shown
    ]
    shown = certs_by_app(records)
    assert shown == {
        "shop": [
            {
                "name": "shop.test",
                "state": "failing",
                "not_after": 500.0,
                "error": "validation failed: connection refused",
            },
            {"name": "www.shop.test", "state": "valid", "not_after": 500.0, "error": ""},
        ],
        "blog": [{"name": "blog.test", "state": "ordering", "not_after": None, "error": ""}],
    }
    assert sealed not in repr(shown)
