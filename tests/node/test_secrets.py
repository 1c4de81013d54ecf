"""A sandbox's environment (`wakeful.node.secrets.sandbox_env`): what it is made of, in which
order, and what nothing overrides."""

from __future__ import annotations

import pytest

from wakeful.node.secrets import BASE_ENV, sandbox_env


@pytest.mark.parametrize(
    ("manifest", "secrets", "expected"),
    [
        pytest.param(
            {},
            {},
            {**BASE_ENV, "PORT": "8000", "HOST": "10.0.0.2"},
            id="no env, no secrets: the base, PORT and HOST",
        ),
        pytest.param(
            {"MODE": "prod"},
            {"DB_PASSWORD": "pw"},
            {**BASE_ENV, "MODE": "prod", "DB_PASSWORD": "pw", "PORT": "8000", "HOST": "10.0.0.2"},
            id="the manifest's env and the secrets, side by side",
        ),
        pytest.param(
            {},
            {"PORT": "1", "HOST": "0.0.0.0"},
            {**BASE_ENV, "PORT": "8000", "HOST": "10.0.0.2"},
            id="a secret never overrides PORT or HOST",
        ),
        pytest.param(
            {"TOKEN": "from the manifest"},
            {"TOKEN": "from the secrets"},
            {**BASE_ENV, "TOKEN": "from the secrets", "PORT": "8000", "HOST": "10.0.0.2"},
            id="a name both set (a later manifest's): the secret wins",
        ),
        pytest.param(
            {"PATH": "/opt/app/bin"},
            {},
            {"PATH": "/opt/app/bin", "LANG": "C.UTF-8", "PORT": "8000", "HOST": "10.0.0.2"},
            id="the manifest may set PATH over the base",
        ),
    ],
)
def test_sandbox_env(
    manifest: dict[str, str], secrets: dict[str, str], expected: dict[str, str]
) -> None:
    assert sandbox_env(manifest, secrets, 8000, "10.0.0.2") == expected
