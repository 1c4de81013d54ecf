"""The `hello` fixture of the ingress tests: hello sandboxes as processes (the stack they are
served through is `tests.support.ingress`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.ingress import HELLO, sandbox_processes


@pytest.fixture
def hello() -> Iterator[Callable[[], int]]:
    """Start hello sandboxes; returns each one's port."""
    yield from sandbox_processes(HELLO)
