"""Where `wakeful up` says each app answers (`wakeful.up.app_address`), and what its ingress
workers run with (`worker_environment`) and when they route what was deployed
(`routes_caught_up`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wakeful.ingress.settings import IngressSettings
from wakeful.up import app_address, routes_caught_up, up_settings, worker_environment


@pytest.mark.parametrize(
    ("listen", "tls_port", "expected"),
    [
        pytest.param("127.0.0.1:8080", 0, "http://web.localhost:8080/", id="loopback: localhost"),
        pytest.param("0.0.0.0:80", 0, "http://web.localhost:80/", id="every address: localhost"),
        pytest.param(
            "localhost:8080", 0, "http://web.localhost:8080/", id="localhost stays localhost"
        ),
        pytest.param("example.test:8080", 0, "http://web.example.test:8080/", id="a name is kept"),
        pytest.param(
            "127.0.0.1:8080",
            8443,
            "http://web.localhost:8080/ and https://web.localhost:8443/",
            id="served over TLS too: both addresses",
        ),
        pytest.param("[::1]:8080", 0, "http://web.[::1]:8080/", id="an IPv6 host is kept as is"),
    ],
)
def test_app_address(listen: str, tls_port: int, expected: str) -> None:
    assert app_address("web", listen, tls_port) == expected


def test_workers_run_on_the_store_file_with_their_token_and_without_the_admin_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = up_settings(
        tmp_path,
        "admin-secret",
        api="127.0.0.1:8082",
        listen="127.0.0.1:8080",
        admin="127.0.0.1:8081",
        isolation=None,
    )
    environ = {"PATH": "/usr/bin", "WAKEFUL_TOKEN": "admin-secret", "WAKEFUL_LEASE_IDLE_TTL": "7"}
    env = worker_environment(up, "127.0.0.1:8082", "ingress-secret", environ)
    assert "WAKEFUL_TOKEN" not in env and "admin-secret" not in env.values()
    assert env["PATH"] == "/usr/bin" and env["WAKEFUL_LEASE_IDLE_TTL"] == "7"
    assert env["WAKEFUL_API"] == "http://127.0.0.1:8082"
    assert env["WAKEFUL_INGRESS_TOKEN"] == "ingress-secret"
    # A worker reads them into the settings `wakeful up` gives its in-process ingress.
    for name in [n for n in os.environ if n.startswith("WAKEFUL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = IngressSettings()
    fields = ("store_url", "show_boot_log", "server_timing", "access_log")
    assert {f: getattr(worker, f) for f in fields} == {f: getattr(up.ingress, f) for f in fields}
    assert worker.lease_idle_ttl == 7


def test_workers_reach_an_api_on_every_address_over_loopback(tmp_path: Path) -> None:
    up = up_settings(
        tmp_path,
        "a",
        api="0.0.0.0:8082",
        listen="127.0.0.1:8080",
        admin="127.0.0.1:8081",
        isolation=None,
    )
    env = worker_environment(up, "0.0.0.0:8082", "t", {})
    assert env["WAKEFUL_API"] == "http://127.0.0.1:8082"  # no "plain HTTP to another machine"
    assert worker_environment(up, "[::]:8082", "t", {})["WAKEFUL_API"] == "http://[::1]:8082"


METRICS = """# HELP wakeful_ingress_routes_revision Revision.
# TYPE wakeful_ingress_routes_revision gauge
wakeful_ingress_routes_revision{worker="0"} 12.0
wakeful_ingress_routes_revision{worker="1"} 9.0
# HELP wakeful_ingress_workers_ready Ready.
# TYPE wakeful_ingress_workers_ready gauge
wakeful_ingress_workers_ready 2.0
"""


@pytest.mark.parametrize(
    ("workers", "revision", "caught_up"),
    [
        pytest.param(2, 9, True, id="each at or past it"),
        pytest.param(2, 10, False, id="one behind"),
        pytest.param(3, 9, False, id="a worker not reporting"),
    ],
)
def test_routes_caught_up_asks_it_of_every_worker(
    workers: int, revision: int, caught_up: bool
) -> None:
    assert routes_caught_up(METRICS, workers, revision) is caught_up
