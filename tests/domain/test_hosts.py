"""Which hosts an app may not claim (wakeful/domain/hosts.py)."""

from __future__ import annotations

import pytest

from wakeful.domain.hosts import (
    Claim,
    HostRules,
    conflicts,
    default_host_conflicts,
    ends_in_number,
    overlap,
    refusal,
    reserved,
)


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


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        pytest.param("127.0.0.1", True, id="a dotted quad"),
        pytest.param("127.1", True, id="a short form of 127.0.0.1"),
        pytest.param("0x7f.0.0.1", True, id="a hex label first, a decimal one last"),
        pytest.param("0x7f.1", True, id="hex and a short form"),
        pytest.param("2130706433", True, id="127.0.0.1 as one decimal number"),
        pytest.param("0x7f000001", True, id="127.0.0.1 as one hex number"),
        pytest.param("0X7F000001", True, id="an upper-case hex prefix"),
        pytest.param("a.0x", True, id="0x alone is the number 0"),
        pytest.param("*.1", True, id="a wildcard over a number"),
        pytest.param("example.com", False, id="a name"),
        pytest.param("1.example.com", False, id="a number first, a name last"),
        pytest.param("a.0xg", False, id="0x followed by a letter that is no hex digit"),
        pytest.param("a.1a", False, id="digits and a letter"),
        pytest.param("a.x1", False, id="a letter and digits"),
    ],
)
def test_a_browser_reads_a_host_ending_in_a_number_as_an_ip_address(
    host: str, expected: bool
) -> None:
    assert ends_in_number(host) is expected


RULES = HostRules("apps.example.com", ("wakeful.example.com", "*.ops.example.com"))
"""Apps at `<app>.apps.example.com`, the dashboard at wakeful.example.com and *.ops."""


@pytest.mark.parametrize(
    ("host", "rules", "why"),
    [
        pytest.param("127.0.0.1", None, "a browser reads it as an IP address", id="an IP"),
        pytest.param("0x7f.1", None, "a browser reads it as an IP address", id="a hex IP"),
        pytest.param("2130706433", HostRules(), "as an IP address", id="a one-number IP"),
        pytest.param("10.0.0.5", RULES, "as an IP address", id="any IP, not only loopback"),
        pytest.param("localhost", None, "reaches the control plane's dashboard", id="localhost"),
        pytest.param("LocalHost", RULES, "reaches the control plane", id="localhost, any case"),
        pytest.param("a.localhost", None, None, id="a name under localhost needs the rules"),
        pytest.param("*.localhost", None, None, id="the wildcard needs the base domain"),
        pytest.param(
            "*.localhost", HostRules(), "covers the apps' default hosts", id="*.base domain"
        ),
        pytest.param("shop.localhost", HostRules(), None, id="a name under the base domain"),
        pytest.param("*.hello.localhost", HostRules(), None, id="a wildcard under an app's"),
        pytest.param(
            "*.localhost", RULES, None, id="*.localhost when apps are under another domain"
        ),
        pytest.param("apps.example.com", RULES, "it is the base domain", id="the base domain"),
        pytest.param("*.apps.example.com", RULES, "covers the apps' default", id="*.base"),
        pytest.param("*.example.com", RULES, "covers the apps' default", id="*.above the base"),
        pytest.param("*.com", RULES, "covers the apps' default", id="*.the top of the base"),
        pytest.param(
            "wakeful.example.com", RULES, "the control plane answers on it", id="its name"
        ),
        pytest.param(
            "WAKEFUL.example.com", RULES, "the control plane answers on it", id="any case"
        ),
        pytest.param(
            "a.ops.example.com",
            RULES,
            "overlaps *.ops.example.com, where the control plane answers",
            id="a name under a reserved wildcard",
        ),
        pytest.param(
            "*.wakeful.example.com", RULES, None, id="a wildcard under its name leaves it"
        ),
        pytest.param("shop.example.com", RULES, None, id="a name beside it"),
        pytest.param("wakeful.example.com", HostRules(), None, id="no name set, none reserved"),
    ],
)
def test_reserved(host: str, rules: HostRules | None, why: str | None) -> None:
    reason = reserved(host, rules)
    if why is None:
        assert reason is None
    else:
        assert reason is not None
        assert reason.startswith(f"{host.casefold()} is reserved: ")
        assert why in reason


IP_REASON = (
    "127.0.0.1 is reserved: a browser reads it as an IP address, and an IP address reaches the "
    "control plane's dashboard, whose cookie the browser would send to this app"
)
HELLO = Claim("hello", [])
"""An app with its default host, hello.localhost, and no other host."""


@pytest.mark.parametrize(
    ("claim", "others", "expected"),
    [
        pytest.param(
            Claim("foo", ["hello.localhost"]),
            [HELLO],
            ["host hello.localhost of foo overlaps hello.localhost, the default host of app hello"],
            id="a host that is another app's default host",
        ),
        pytest.param(
            Claim("foo", ["hello.localhost"]),
            [Claim("hello", [], default_host=False)],
            [],
            id="the default host of an app that gave it up",
        ),
        pytest.param(
            Claim("foo", ["a.hello.localhost", "*.hello.localhost"]),
            [HELLO],
            [
                "host a.hello.localhost of foo overlaps hello.localhost, the default host of "
                "app hello",
                "host *.hello.localhost of foo overlaps hello.localhost, the default host of "
                "app hello",
            ],
            id="names under another app's default host get its cookies: refused",
        ),
        pytest.param(
            Claim("hello", []),
            [Claim("foo", ["api.hello.localhost"])],
            [
                "the default host hello.localhost of hello overlaps host api.hello.localhost "
                "of app foo"
            ],
            id="a default host with a name under it another app's hosts take",
        ),
        pytest.param(
            Claim("foo", ["hello.localhost.example.com", "ahello.localhost"]),
            [HELLO],
            [],
            id="names that only end like another app's default host are not under it",
        ),
        pytest.param(
            Claim("foo", []),
            [Claim("bar", ["foo.localhost"])],
            ["the default host foo.localhost of foo overlaps host foo.localhost of app bar"],
            id="a default host another app's hosts take",
        ),
        pytest.param(
            Claim("foo", []),
            [Claim("bar", ["*.localhost"])],
            ["the default host foo.localhost of foo overlaps host *.localhost of app bar"],
            id="a default host another app's wildcard covers",
        ),
        pytest.param(
            Claim("foo", [], default_host=False),
            [Claim("bar", ["foo.localhost"])],
            [],
            id="no default host, no clash",
        ),
        pytest.param(
            Claim("hello", ["hello.localhost"]),
            [Claim("hello", ["hello.localhost"])],
            [],
            id="an app's own default host among its hosts",
        ),
    ],
)
def test_default_host_conflicts(claim: Claim, others: list[Claim], expected: list[str]) -> None:
    assert default_host_conflicts(claim, others, "localhost") == expected


@pytest.mark.parametrize(
    ("claim", "others", "rules", "expected"),
    [
        pytest.param(
            Claim("foo", ["ok.example.com", "127.0.0.1", "localhost"]),
            [],
            HostRules(),
            f"hosts: {IP_REASON}; hosts: localhost is reserved: it reaches the control "
            "plane's dashboard, whose cookie a browser would send to this app",
            id="every reserved host, named with its field",
        ),
        pytest.param(
            Claim("wakeful", []),
            [],
            HostRules("example.com", ("wakeful.example.com",)),
            "default_host: wakeful.example.com is reserved: the control plane answers on it, "
            "and a browser would send the dashboard's cookie to an app there "
            "(set default_host = false)",
            id="a default host the control plane answers on",
        ),
        pytest.param(
            Claim("shop", ["127.0.0.1"]),
            [Claim("hello", ["127.0.0.1"])],
            HostRules(),
            f"hosts: {IP_REASON}",
            id="a reserved host is named, not its clash",
        ),
        pytest.param(
            Claim("foo", ["a.example.com", "hello.localhost"]),
            [Claim("shop", ["*.example.com"]), HELLO],
            HostRules(),
            "host a.example.com of foo overlaps host *.example.com of app shop; host "
            "hello.localhost of foo overlaps hello.localhost, the default host of app hello: a "
            "host routes to one app only (an app's default host is <app>.localhost unless it "
            "sets default_host = false)",
            id="every clash, with hosts and default hosts",
        ),
        pytest.param(
            Claim("foo", ["a.example.com"]),
            [Claim("shop", ["*.example.com"])],
            HostRules(),
            "host a.example.com of foo overlaps host *.example.com of app shop: a host routes "
            "to one app only",
            id="a clash of hosts alone says nothing of default hosts",
        ),
        pytest.param(
            Claim("foo", ["foo.example.com"]),
            [Claim("shop", ["shop.example.com"]), HELLO],
            HostRules(),
            None,
            id="nothing reserved, nothing taken",
        ),
    ],
)
def test_refusal(claim: Claim, others: list[Claim], rules: HostRules, expected: str | None) -> None:
    assert refusal(claim, others, rules) == expected
