"""An app's command as its sandbox runs it: `$PORT`, `${PORT}`, `$HOST` and `${HOST}`
replaced by the sandbox's port and address, since a command is run without a shell (uvicorn
given `--port $PORT` got the text `$PORT`). Nothing else in it is touched: a `sh -c` command
still expands its own variables, and `$PORTS` or `$HOSTNAME` stay as they are."""

from __future__ import annotations

import re
from collections.abc import Sequence

_PLACEHOLDER = re.compile(r"\$(?:\{(PORT|HOST)\}|(PORT|HOST)(?![A-Za-z0-9_]))")


def expand_command(command: Sequence[str], port: int, host: str) -> list[str]:
    """`command` with each `$PORT`/`${PORT}`/`$HOST`/`${HOST}` in any argument replaced."""
    values = {"PORT": str(port), "HOST": host}

    def value(found: re.Match[str]) -> str:
        return values[found.group(1) or found.group(2)]

    return [_PLACEHOLDER.sub(value, argument) for argument in command]
