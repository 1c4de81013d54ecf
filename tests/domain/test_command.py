"""`expand_command`: the placeholders a command may hold, and what it leaves alone."""

from __future__ import annotations

import pytest

from wakeful.domain.command import expand_command


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param(
            ["uvicorn", "main:app", "--port", "$PORT", "--host", "$HOST"],
            ["uvicorn", "main:app", "--port", "8123", "--host", "10.0.0.5"],
            id="uvicorn's flags, the case a new user met",
        ),
        pytest.param(["serve", "--bind=${HOST}:${PORT}"], ["serve", "--bind=10.0.0.5:8123"],
                     id="braced, inside an argument"),
        pytest.param(["gunicorn", "-b", "$HOST:$PORT"], ["gunicorn", "-b", "10.0.0.5:8123"],
                     id="two in one argument"),
        pytest.param(["echo", "$PORTS", "$HOSTNAME", "${PORT_X}"],
                     ["echo", "$PORTS", "$HOSTNAME", "${PORT_X}"],
                     id="longer names left alone"),
        pytest.param(["echo", "$port", "$HOME", "PORT"], ["echo", "$port", "$HOME", "PORT"],
                     id="other variables and plain words left alone"),
        pytest.param(["sh", "-c", "exec app --port $PORT"], ["sh", "-c", "exec app --port 8123"],
                     id="sh -c: the value the shell would have given"),
        pytest.param(["app", "$PORT-$PORT"], ["app", "8123-8123"], id="followed by a dash"),
    ],
)  # fmt: skip
def test_expand_command(command: list[str], expected: list[str]) -> None:
    assert expand_command(command, 8123, "10.0.0.5") == expected
