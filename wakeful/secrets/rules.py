"""What a change of an app's secrets may be: read from a request's body, then checked against
the app's secrets and manifests. Pure: no I/O, no clock.

Rules:
- A change sets names to values and unsets names, at once; it restarts the app's sandboxes
  unless `restart` is false. It changes at least one name, and no name both ways.
- Names follow `env`'s rules (`secret_name_problem`); values are at most 32 KiB and hold no
  NUL (`secret_value_problem`); an app holds at most 100 names and 512 KiB of values.
- A name unset must be one of the app's secrets (a typo is refused, not ignored).
- A name the manifest's `env` of the active version (or of one rolling out) sets cannot be a
  secret: refused, naming both, so an app never has two values for one variable.
- Every refusal names the field and, for a value, its size: never the value. A name is shown
  only up to an `=` in it (`NAME=VALUE` pasted where a name goes) and 64 characters; a field
  the body should not have is counted, not named.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from wakeful.domain.models import (
    MAX_SECRETS,
    MAX_SECRETS_BYTES,
    manifest_overlap,
    secret_name_problem,
    secret_value_problem,
)

from .errors import ChangeRefused

SHOWN_NAME = 64


@dataclass(frozen=True)
class Change:
    set: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)
    restart: bool = True


@dataclass(frozen=True)
class KeyReport:
    """One key, for `GET /v1/secrets/keys`: never its bytes."""

    id: str
    current: bool
    present: bool
    """Its file is in the directory."""
    values: int
    """Values in the store sealed under it: apps' secrets and registries' passwords."""


def shown_name(name: str) -> str:
    """A name for a refusal: never past an `=` (a value may follow it) nor 64 characters."""
    head, equals, _ = name.partition("=")
    cut = head[:SHOWN_NAME]
    return repr(cut + ("=…" if equals else "…" if len(head) > SHOWN_NAME else ""))


def json_kind(value: object) -> str:
    """What JSON type `value` is, to say what was sent instead: never the value itself."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "a string"


def _object(body: object, fields: tuple[str, ...]) -> dict[str, object]:
    if not isinstance(body, dict):
        raise ChangeRefused(
            "invalid",
            f"the body must be a JSON object with {', '.join(fields)}, not {json_kind(body)}",
        )
    stray = sum(1 for key in body if key not in fields)
    if stray:  # not named: what was sent as a field may be a value
        raise ChangeRefused(
            "invalid",
            f"{stray} field(s) other than {' and '.join(fields)}, not named here (what was "
            "sent as a field may be a secret value)",
        )
    restart = body.get("restart", True)
    if not isinstance(restart, bool):
        raise ChangeRefused("invalid", f"restart: must be true or false, not {json_kind(restart)}")
    return body


def read_set(body: object) -> Change:
    """What `POST /v1/apps/{app}/secrets` asks for: `{"values": {NAME: VALUE}, "restart":
    true}` (`restart` optional). `ChangeRefused("invalid")` naming the field, never a value."""
    found = _object(body, ("values", "restart"))
    values = found.get("values")
    if not isinstance(values, dict):
        raise ChangeRefused(
            "invalid", f"values: must be an object of names to values, not {json_kind(values)}"
        )
    for name, value in values.items():
        if not isinstance(value, str):
            raise ChangeRefused(
                "invalid",
                f"values.{shown_name(name)}: the value must be a string, not {json_kind(value)}",
            )
    return Change(dict(values), [], found.get("restart", True) is True)


def read_unset(body: object) -> Change:
    """What `POST /v1/apps/{app}/secrets/unset` asks for: `{"names": [NAME], "restart":
    true}` (`restart` optional). `ChangeRefused("invalid")` naming the field."""
    found = _object(body, ("names", "restart"))
    names = found.get("names")
    if not isinstance(names, list):
        raise ChangeRefused("invalid", f"names: must be a list of names, not {json_kind(names)}")
    for at, name in enumerate(names):
        if not isinstance(name, str):
            raise ChangeRefused("invalid", f"names[{at}]: must be a name, not {json_kind(name)}")
    return Change({}, list(dict.fromkeys(names)), found.get("restart", True) is True)


def check_change(
    change: Change,
    app: str,
    present: Mapping[str, int],
    manifests: Mapping[str, Collection[str]],
) -> None:
    """Whether `change` may be made to `app`, whose secrets are `present` (name -> size of
    the value in bytes) and whose manifests set `manifests` (version -> names in `env`);
    `ChangeRefused` when not, with nothing to write."""
    if not change.set and not change.unset:
        raise ChangeRefused("invalid", "nothing to set or unset")
    for name, value in change.set.items():
        problem = secret_name_problem(name)
        if problem is not None:
            raise ChangeRefused("invalid", f"values: the name {shown_name(name)} {problem}")
        problem = secret_value_problem(value)
        if problem is not None:
            raise ChangeRefused("invalid", f"values.{name}: the value {problem}")
    for name in change.unset:
        if name in change.set:
            raise ChangeRefused("invalid", f"{name} is both set and unset")
        if name not in present:
            problem = secret_name_problem(name)
            if problem is not None:
                raise ChangeRefused("invalid", f"names: the name {shown_name(name)} {problem}")
            raise ChangeRefused("unknown", f"{app} has no secret named {name}")
    for version, env in sorted(manifests.items()):
        both = manifest_overlap(env, change.set)
        if both:
            listed = ", ".join(both)
            raise ChangeRefused(
                "conflict",
                f"secret {listed}: the manifest of {app} {version} sets {listed} in env too; "
                "take it out of wakeful.toml's env and deploy, then set the secret",
            )
    kept = {name: size for name, size in present.items() if name not in change.unset}
    sizes = kept | {name: len(value.encode()) for name, value in change.set.items()}
    if len(sizes) > MAX_SECRETS:
        raise ChangeRefused(
            "invalid", f"{app} would have {len(sizes)} secrets; an app has at most {MAX_SECRETS}"
        )
    total = sum(sizes.values())
    if total > MAX_SECRETS_BYTES:
        raise ChangeRefused(
            "invalid",
            f"{app}'s secrets would come to {total} bytes; an app's values hold at most "
            f"{MAX_SECRETS_BYTES} together",
        )


def replaces_missing_key(sealed: bool, leading: bool, led: bool) -> bool:
    """The store's current secrets key is not in this activator's directory: may a key made
    here take its place? Only when no value is sealed under any key (`sealed`: a store
    restored into a new data directory from a backup with no secrets), and no other activator
    leads with it: this one leads (`leading`), or none does (`led`). A second activator given
    the wrong key directory would otherwise leave the leader unable to seal; it is refused
    instead (`KeyRing.check`)."""
    return not sealed and (leading or not led)
