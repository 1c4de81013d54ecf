"""Every route of the control API, fed generated and malformed input from its own OpenAPI
schema (schemathesis): no input, however odd, gets a 5xx. A run like this found a 500 on
`POST /v1/apps/a%01/rollback` (a name that reached the store unchecked).

The control plane runs as the real `wakeful activator` process, on the memory store and with no
node agent, so generated deploys are recorded but nothing they name is ever run. The number of
examples is bounded so the run stays short; raise WAKEFUL_FUZZ_EXAMPLES to dig deeper.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from wakeful.store.testing import free_port

TOKEN = "fuzz-token"
EXAMPLES = int(os.environ.get("WAKEFUL_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def control_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    listen = f"127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "WAKEFUL_TOKEN": TOKEN,
        "WAKEFUL_STORE_URL": "memory://",
        "WAKEFUL_LISTEN": listen,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "wakeful.cli", "--data-dir", str(data_dir), "activator"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://{listen}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"wakeful activator did not start: {process.communicate()[0]}")
        time.sleep(0.05)
    yield url
    process.terminate()
    output = process.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


def test_no_input_gets_a_server_error(control_api: str) -> None:
    """Each operation in turn, with examples from its schema (valid and not): never a 5xx.

    (schemathesis's own pytest loader does not work with pytest 9, so the operations are
    driven through their hypothesis strategies here.)"""
    schema = schemathesis.openapi.from_url(
        f"{control_api}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    failures: list[str] = []
    calls: list[int] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:

        @given(
            case=st.one_of(
                operation.as_strategy(GenerationMode.POSITIVE),
                operation.as_strategy(GenerationMode.NEGATIVE),
            )
        )
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],  # report, do not shrink
        )
        def call(case: schemathesis.Case) -> None:
            response = case.call(
                base_url=control_api, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            )
            calls.append(1)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} -> {response.status_code}: "
                    f"{response.text[:300]}"
                )

        call()
    assert not failures, "\n".join(failures)
    assert len(calls) >= len(operations) * 2


def _token(control_api: str, role: str) -> str:
    made = httpx.post(
        f"{control_api}/v1/tokens",
        json={"name": f"fuzz-{role}", "role": role},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert made.status_code in (200, 201), made.text
    secret: str = made.json()["secret"]
    return secret


def test_a_missing_or_wrong_credential_gets_401_on_every_route(control_api: str) -> None:
    """Every operation but the public ones (/healthz, /readyz, /metrics), one example each,
    asked with no credential, a made-up token, another scheme, and each role's real token
    with one character changed: always 401, never what the route does."""
    real = {role: _token(control_api, role) for role in ("admin", "node", "ingress")}
    wrong: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer"},
    ]
    for secret in real.values():
        changed = secret[:-1] + ("a" if secret[-1] != "a" else "b")
        wrong.append({"Authorization": f"Bearer {changed}"})
    schema = schemathesis.openapi.from_url(
        f"{control_api}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    public = {"/healthz", "/readyz", "/metrics"}
    refused: list[str] = []
    operations = [r.ok() for r in schema.get_all_operations() if r.ok().path not in public]
    assert len(operations) >= 10
    for operation in operations:

        @given(case=operation.as_strategy(GenerationMode.POSITIVE))
        @settings(
            max_examples=1,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
        )
        def call(case: schemathesis.Case) -> None:
            for headers in wrong:
                response = case.call(base_url=control_api, headers=headers, timeout=30)
                if response.status_code != 401:
                    refused.append(
                        f"{case.method} {case.formatted_path} with {sorted(headers.values())}"
                        f" -> {response.status_code}"
                    )

        call()
    assert not refused, "\n".join(refused)
