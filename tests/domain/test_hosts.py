"""Which hosts two apps may not both claim (wakeful/domain/hosts.py)."""

from __future__ import annotations

import pytest

from wakeful.domain.hosts import conflicts, overlap


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("shop.example.com", "shop.example.com", True),
        ("Shop.Example.com", "shop.example.com", True),
        ("shop.example.com", "shop.example.org", False),
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "badexample.com", False),
        ("*.example.com", "*.example.com", True),
        ("*.example.com", "*.eu.example.com", True),
        ("*.example.com", "*.example.org", False),
        ("*.eu.example.com", "a.example.com", False),
    ],
)
def test_overlap(a: str, b: str, expected: bool) -> None:
    assert overlap(a, b) is expected
    assert overlap(b, a) is expected


def test_conflicts_name_both_apps_and_skip_the_app_itself() -> None:
    others = [("shop", ["*.example.com"]), ("thief", ["x.example.com"]), ("blog", ["b.org"])]
    assert conflicts("thief", ["x.example.com", "b.org"], others) == [
        "host x.example.com of thief overlaps host *.example.com of app shop",
        "host b.org of thief overlaps host b.org of app blog",
    ]
