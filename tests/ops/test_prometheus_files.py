"""ops/prometheus/, the files people copy: promtool accepts them, every metric their queries
name is one a live `wakeful up` exposes, and a real Prometheus scrapes a real `wakeful up` with
the shipped config (only its targets and intervals changed) and evaluates the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from tests.support.up import Up, make_app, start_up, stop_up
from wakeful.store.testing import free_port

OPS = Path(__file__).parents[2] / "ops" / "prometheus"
CONFIG = OPS / "prometheus.yml"
RULES = OPS / "wakeful-rules.yml"
RULE_TESTS = OPS / "wakeful-rules.test.yml"
DASHBOARD = OPS / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NO_PROMETHEUS = "Debian's prometheus package is not installed (scripts/test installs it)"
T = TypeVar("T")


# -- metric names in PromQL ---------------------------------------------------------------------

STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
MATCHERS = re.compile(r"\{[^}]*\}")
"""Label matchers: label names and values, never a metric name here (we write none inside)."""
RANGE = re.compile(r"\[[^\]]*\]")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
VARIABLE = re.compile(r"\$\{?\w+(?::\w+)?\}?")
IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
"""A word not followed by `(` (a function or aggregation: `rate(`, `sum by (..) (` loses its
`by (..)` first, leaving `sum (`)."""
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
KEYWORDS |= {"group_left", "group_right", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    for pattern in (STRING, MATCHERS, RANGE, GROUPING, VARIABLE):
        expr = pattern.sub(" ", expr)
    return {name for name in IDENTIFIER.findall(expr) if name.lower() not in KEYWORDS}


def test_metric_names_are_read_from_promql_without_functions_labels_or_keywords() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (app, le) (rate(a_bucket{app=~"$app", le!="x"}'
        "[$__rate_interval]))) * on (pool) group_left (app) max by (pool, app) (b) > bool 0.5 "
        "and c offset 5m or vector(0) unless time() - d_total[5m:1m]"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c", "d_total"}


def rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in panels(dashboard) for target in panel.get("targets", [])]


def variable_metrics() -> set[str]:
    """The metrics the dashboard's variables take their values from (`label_values(m, l)`)."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = set()
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            match = re.fullmatch(r"label_values\((\w+), *\w+\)", text)
            assert match, f"variable {variable['name']}: {text!r}"
            found.add(match[1])
    return found


# -- promtool -----------------------------------------------------------------------------------


@pytest.mark.skipif(PROMTOOL is None, reason=f"promtool is not on the PATH: {NO_PROMETHEUS}")
@pytest.mark.parametrize(
    "command",
    [
        ["check", "config", CONFIG.name],
        ["check", "rules", RULES.name],
        ["test", "rules", RULE_TESTS.name],
    ],
    ids=["check-config", "check-rules", "test-rules"],
)
def test_promtool_accepts_the_files(command: list[str]) -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *command], cwd=OPS, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_duration_a_severity_and_text_naming_what_it_is_about() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in alerts} >= {
        "WakefulAppCrashLooping",
        "WakefulWaitersRising",
        "WakefulLeaseExpiries",
        "WakefulNodeGone",
        "WakefulStoreUnreachable",
    }
    tested = yaml.safe_load(RULE_TESTS.read_text())
    fired = {
        case["alertname"]
        for group in tested["tests"]
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    for rule in alerts:
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert (
            "{{ $labels." in rule["annotations"]["summary"] + rule["annotations"]["description"]
        ), rule["alert"]
        assert rule["alert"] in fired, f"{rule['alert']}: no promtool test shows it firing"


def test_the_dashboard_reads_every_panel_from_the_chosen_data_source() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    source = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
    assert variables["app"]["datasource"] == source


def poll(check: Callable[[], T | None], within: float, what: str) -> T:
    """`check()`'s first answer that is not None, polled until `within` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(0.2)


# -- a live wakeful -----------------------------------------------------------------------------


@dataclass
class Live:
    up: Up
    control: str
    """The control plane's /metrics, as scraped."""
    ingress: str
    """The ingress's /metrics, as scraped."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """`wakeful up` with the sample app, after one request through the ingress (so per-app
    series exist), and its two /metrics."""
    root = tmp_path_factory.mktemp("up")
    up = start_up(root, make_app(root))
    try:
        answer = httpx.get(f"{up.proxy}/", headers=up.host(), timeout=120)
        assert answer.status_code == 200, answer.text

        def probed() -> str | None:  # the store probe, every 5 s, has seen the node
            control = httpx.get(f"{up.api}/metrics", timeout=30)
            assert control.status_code == 200
            return control.text if 'wakeful_node_registered{node="local"}' in control.text else None

        control = poll(probed, 60, "the node in the control plane's metrics")
        ingress = httpx.get(f"{up.admin}/metrics", timeout=30)
        assert ingress.status_code == 200
        yield Live(up, control, ingress.text)
    finally:
        stop_up(up)


def exposed(metrics: str) -> set[str]:
    """The names a PromQL query can select from this exposition: each family's series by its
    type (a counter's `_total` and `_created`, a histogram's `_bucket`, `_sum`, `_count` and
    `_created`), declared even while it has no sample, and every sample's own name."""
    suffixes = {
        "counter": ["_total", "_created"],
        "histogram": ["_bucket", "_sum", "_count", "_created"],
        "summary": ["", "_sum", "_count", "_created"],
        "gauge": [""],
    }
    names = set()
    for line in metrics.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            if kind == "counter":  # prometheus_client declares it by its series, `_total`
                family = family.removesuffix("_total")
            names |= {family + suffix for suffix in suffixes.get(kind, [""])}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_every_metric_the_rules_and_the_dashboard_name_is_exposed(live: Live) -> None:
    available = exposed(live.control) | exposed(live.ingress) | {"up"}  # `up`: Prometheus's
    used = {
        **{name: "wakeful-rules.yml" for expr in rule_exprs() for name in metric_names(expr)},
        **{
            name: "grafana-dashboard.json"
            for expr in dashboard_exprs()
            for name in metric_names(expr)
        },
        **{name: "grafana-dashboard.json (variables)" for name in variable_metrics()},
    }
    assert len(used) > 20  # the parse found them
    missing = {name: where for name, where in sorted(used.items()) if name not in available}
    assert not missing, f"named but not exposed by wakeful up: {missing}"
    # the per-app series a dashboard user sees first exist after one request
    assert 'wakeful_pool_ready_sandboxes{app="hello",pool="hello-v1"} 1.0' in live.control
    assert 'wakeful_node_registered{node="local"} 1.0' in live.control
    assert "wakeful_store_up 1.0" in live.control
    assert 'wakeful_ingress_request_duration_seconds_bucket{app="hello"' in live.ingress


# -- a real Prometheus --------------------------------------------------------------------------


def shipped_config_for(live: Live, directory: Path) -> Path:
    """prometheus.yml as shipped, its targets this test's wakeful and its intervals 1 s, in
    `directory` beside the rules (the config names them relative to itself)."""
    config = yaml.safe_load(CONFIG.read_text())
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    targets = {
        "wakeful-control-plane": live.up.api.removeprefix("http://"),
        "wakeful-ingress": live.up.admin.removeprefix("http://"),
    }
    assert {job["job_name"] for job in config["scrape_configs"]} == set(targets)
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = [targets[job["job_name"]]]
    assert config["rule_files"] == [RULES.name]
    shutil.copy(RULES, directory / RULES.name)
    written = directory / "prometheus.yml"
    written.write_text(yaml.safe_dump(config, sort_keys=False))
    return written


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def get(self, path: str, **params: str) -> Any:
        answer = httpx.get(f"{self.url}{path}", params=params, timeout=30)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", answer.text
        return body["data"]


@pytest.fixture
def prometheus(live: Live, tmp_path: Path) -> Iterator[Prometheus]:
    if PROMETHEUS is None:
        pytest.skip(f"prometheus is not on the PATH: {NO_PROMETHEUS}")
    config = shipped_config_for(live, tmp_path)
    for attempt in range(3):  # a port found free can be taken before prometheus binds it
        port = free_port()
        log = tmp_path / f"prometheus-{attempt}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / f'tsdb-{attempt}'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        server = Prometheus(process, f"http://127.0.0.1:{port}", log)
        try:
            poll(partial(_ready, server), 60, "prometheus ready")
        except AssertionError:
            _stop(process)
            if "address already in use" in log.read_text():
                continue
            raise AssertionError(f"prometheus did not start: {log.read_text()[-3000:]}") from None
        try:
            yield server
        finally:
            _stop(process)
        return
    raise AssertionError("prometheus found no free port in 3 attempts")


def _ready(server: Prometheus) -> bool | None:
    if server.process.poll() is not None:
        raise AssertionError(f"prometheus exited: {server.log.read_text()[-3000:]}")
    try:
        return httpx.get(f"{server.url}/-/ready", timeout=5).status_code == 200 or None
    except httpx.TransportError:
        return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_real_prometheus_scrapes_wakeful_up_and_evaluates_the_rules(
    live: Live, prometheus: Prometheus
) -> None:
    def both_up() -> dict[str, str] | None:
        active = prometheus.get("/api/v1/targets")["activeTargets"]
        health = {target["labels"]["job"]: target["health"] for target in active}
        return (
            health if health == {"wakeful-control-plane": "up", "wakeful-ingress": "up"} else None
        )

    poll(both_up, 120, "both targets up")

    def value(query: str) -> float | None:
        result = prometheus.get("/api/v1/query", query=query)["result"]
        return float(result[0]["value"][1]) if result else None

    assert poll(lambda: value("wakeful_store_up"), 60, "wakeful_store_up scraped") == 1
    assert poll(lambda: value('wakeful_node_registered{node="local"}'), 60, "nodes") == 1
    assert poll(lambda: value('sum(wakeful_ingress_requests_total{app="hello"})'), 60, "") >= 1
    # the job names the rules select `up` by are the config's
    for job in ("wakeful-control-plane", "wakeful-ingress"):
        assert poll(lambda job=job: value(f'up{{job="{job}"}}'), 60, f"up of {job}") == 1

    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return rules if rules and all(rule["health"] == "ok" for rule in rules) else None

    rules = poll(evaluated, 60, "every rule evaluated without error")
    assert {rule["name"] for rule in rules} == {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }

    # every dashboard query is PromQL this Prometheus runs, its variables as Grafana fills them
    for expr in dashboard_exprs():
        query = expr.replace("$__rate_interval", "1m").replace("$app", ".*")
        prometheus.get("/api/v1/query", query=query)  # asserts "success"
