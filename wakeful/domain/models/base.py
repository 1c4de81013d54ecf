"""What every stored record shares: the base model, the name and host patterns, and how a
refused value is described (one line per problem, naming the field and the value)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""App, version, pool and node names: DNS labels, so `<app>.<domain>` is always a host."""

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
HOST_PATTERN = r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
Host = Annotated[str, StringConstraints(pattern=HOST_PATTERN, max_length=253)]
SANDBOX_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,127}$"

Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A sha256 digest, in hex."""


class Model(BaseModel):
    """Base for stored values: unknown fields are refused, values are immutable, and a float
    is a finite number (JSON has no infinity: `-1e999` written to etcd by a hostile node would
    otherwise reach every reader, the dashboard's browsers included, as one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem: `field.path: reason (got value)`."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "value"
        got = error.get("input")
        message = str(error["msg"]).removeprefix("Value error, ")  # pydantic's, not ours
        if error["type"] == "missing":
            message, got = "required", None
        shown = isinstance(got, dict | list) or got is None or "(got " in message
        lines.append(f"{where}: {message}{'' if shown else f' (got {got!r})'}")
    return "; ".join(lines)
