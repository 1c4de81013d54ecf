"""The control plane's host settings: WAKEFUL_BASE_DOMAIN, WAKEFUL_RESERVED_HOSTS, and the
names it answers on (activator/settings.py `host_rules`)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wakeful.activator.settings import ActivatorSettings
from wakeful.domain.hosts import HostRules


def settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> ActivatorSettings:
    for name in ("BASE_DOMAIN", "RESERVED_HOSTS", "LISTEN", "ADVERTISE_URL"):
        monkeypatch.delenv(f"WAKEFUL_{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"WAKEFUL_{name.upper()}", value)
    return ActivatorSettings(store_url="memory://")


@pytest.mark.parametrize(
    ("env", "rules"),
    [
        pytest.param({}, HostRules("localhost", ()), id="defaults: localhost, an IP to listen on"),
        pytest.param(
            {"base_domain": "apps.example.com"},
            HostRules("apps.example.com", ()),
            id="the base domain the ingress reads too",
        ),
        pytest.param(
            {"reserved_hosts": "Wakeful.Example.com, ops.example.com."},
            HostRules("localhost", ("wakeful.example.com", "ops.example.com")),
            id="comma-separated names, in any case, with a trailing dot",
        ),
        pytest.param(
            {"reserved_hosts": '["wakeful.example.com", "*.ops.example.com"]'},
            HostRules("localhost", ("wakeful.example.com", "*.ops.example.com")),
            id="a JSON list, with a wildcard",
        ),
        pytest.param(
            {"listen": "control.lan:8082", "advertise_url": "https://wakeful.example.com/"},
            HostRules("localhost", ("control.lan", "wakeful.example.com")),
            id="the hosts of the listen address and the advertised URL",
        ),
        pytest.param(
            {"listen": "[::1]:8082", "advertise_url": "http://10.0.0.1:8082"},
            HostRules("localhost", ()),
            id="addresses are reserved anyway, not named",
        ),
        pytest.param(
            {"reserved_hosts": "control.lan", "listen": "control.lan:8082"},
            HostRules("localhost", ("control.lan",)),
            id="a name given twice is named once",
        ),
    ],
)
def test_host_rules(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], rules: HostRules) -> None:
    assert settings(monkeypatch, **env).host_rules() == rules


@pytest.mark.parametrize(
    "value", ["not a host", '["a.example.com", "a_b.example.com"]', "https://x.example.com"]
)
def test_a_reserved_host_that_is_no_host_name_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    with pytest.raises(ValidationError, match="reserved_hosts") as refused:
        settings(monkeypatch, reserved_hosts=value)
    assert "is not a host name" in str(refused.value)


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        pytest.param({"acme_email": "not an address"}, "acme_email", id="an email without @"),
        pytest.param(
            {"acme_email": "a@b.c", "acme_directory": "http://acme.test/dir"},
            "acme_directory",
            id="a directory not over https",
        ),
        pytest.param(
            {"acme_email": "a@b.c", "acme_ca": "/no/such/ca.pem"},
            "/no/such/ca.pem is not a file",
            id="a CA file that is not there",
        ),
        pytest.param(
            {"acme_email": "a@b.c", "acme_base_domain": "*.apps.test"},
            "acme_base_domain",
            id="a base domain that is a wildcard",
        ),
        pytest.param({"acme_orders_per_3h": "0"}, "acme_orders_per_3h", id="no orders at all"),
    ],
)
def test_acme_settings_refuse_what_cannot_work_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], refused: str
) -> None:
    with pytest.raises(ValidationError, match=refused):
        settings(monkeypatch, **env)


def test_acme_is_off_unless_an_email_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EMAIL", "DIRECTORY", "CA", "BASE_DOMAIN"):
        monkeypatch.delenv(f"WAKEFUL_ACME_{name}", raising=False)
    assert settings(monkeypatch).acme_email is None
    on = settings(monkeypatch, acme_email="ops@example.com")
    assert on.acme_directory == "https://acme-v02.api.letsencrypt.org/directory"
