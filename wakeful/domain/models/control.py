"""The control plane's own records: a rollout it carries on, who leads a role that runs once
cluster-wide, and the key dashboard sessions are signed with.

| key                        | model         |
|----------------------------|---------------|
| `rollouts/{app}/{version}` | RolloutRecord |
| `leaders/{role}`           | Leader        |
| `ui/session-key`           | SessionKey    |
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from wakeful.domain.models.base import Model, Name


class RolloutRecord(Model):
    """A deploy or rollback in progress, or how it ended (`rollouts/{app}/{version}`): what a
    control plane that takes over needs to carry it on, and what `wakeful deploy` reads."""

    app: Name
    version: Name
    pool: str
    phase: Literal["rolling", "ramping", "live", "failed"]
    message: str = Field(default="", max_length=4000)
    target_ready: int = Field(default=0, ge=0)
    hosts: list[str] = Field(default_factory=list)
    default_host: bool = True
    started_at: float = 0.0
    """Wall-clock time it began: its deadline runs from here, whoever carries it on."""
    canary: int = Field(default=0, ge=0, le=99)
    """`deploy --canary N`: once ready, the version takes N% beside the active one instead
    of all traffic (0: a full rollout)."""
    keep_split: bool = False
    """`deploy --keep-split`: once ready, the version joins the route at 0% and the split
    (or the active version's 100%) stays as it is."""
    ramp: float = Field(default=0.0, ge=0, le=7 * 86400)
    """`deploy --ramp`: seconds over which the version goes from its first share to 100%
    (0: none). While it runs the phase is `ramping`."""
    ramp_started_at: float = 0.0
    """Wall-clock time the ramp's first share was written: its steps run from here, whoever
    leads."""
    stable: Name | None = None
    """The version the ramp moves traffic from, and returns it to on a rollback."""
    share: int = Field(default=0, ge=0, le=100)
    """The new version's share as the ramp last wrote it: another share in the app's split
    means someone changed it by hand, which ends the ramp."""


class SessionKey(Model):
    """The key dashboard sessions are signed with (`ui/session-key`): shared by every control
    plane, so a session outlives a restart and a change of leader."""

    key: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    created_at: float = 0.0


class Leader(Model):
    """Who holds a role that runs once cluster-wide (`leaders/{role}`, bound to the holder's
    TTL lease). Its revision fences the holder's writes (`wakeful.store.election`)."""

    holder: str = Field(min_length=1, max_length=200)
    url: str = Field(default="", max_length=2000)
    """Where the holder serves (the activator's control API), for those that follow it."""
    since: float = 0.0
