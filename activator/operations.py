"""The lease channel's operations as the activator takes them (`activator/channel.py` says
what each means): one pydantic model each, told apart by `op`; bounded so that whatever an
ingress token sends, an operation stays small."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictInt, TypeAdapter, field_validator

from wakeful.domain.leases import MAX_ASK_REQUESTS, LeaseGrant
from wakeful.domain.logbatch import MAX_ACCESS_LINES, AccessLine
from wakeful.domain.models import NAME_PATTERN
from wakeful.domain.traffic import MAX_APPS_PER_REPORT, TrafficReport

REPLICA_PATTERN = r"^[A-Za-z0-9._:@+-]{1,128}$"
"""An ingress replica's name as the channel takes it (the characters of a store key)."""
INSTANCE_PATTERN = r"^[0-9a-f]{0,32}$"
"""An ingress process's random id (`ChannelLeases.instance`), hex; empty: none said."""


class Acquire(BaseModel):
    id: int
    op: Literal["acquire"]
    app: str = Field(pattern=NAME_PATTERN)
    version: str | None = Field(default=None, pattern=NAME_PATTERN)
    requests: int = Field(default=1, ge=1, le=MAX_ASK_REQUESTS)


class Renew(BaseModel):
    id: int
    op: Literal["renew"]
    lease: str = Field(max_length=200)
    used: bool = False


class Release(BaseModel):
    id: int
    op: Literal["release"]
    lease: str = Field(max_length=200)


class Adopt(BaseModel):
    id: int
    op: Literal["adopt"]
    app: str = Field(pattern=NAME_PATTERN)
    grant: LeaseGrant

    @field_validator("grant")
    @classmethod
    def _bounded(cls, grant: LeaseGrant) -> LeaseGrant:
        if not 0 < len(grant.lease_id) <= 200 or not 1 <= grant.size <= 10_000:
            raise ValueError("a lease id of 1 to 200 characters and a size of 1 to 10000")
        return grant


class Cancel(BaseModel):
    op: Literal["cancel"]
    of: int


class Ride(BaseModel):
    """Requests joined (`by` > 0) or left an acquire in flight (`Riders`); no answer."""

    op: Literal["ride"]
    of: int
    by: int = Field(ge=-MAX_ASK_REQUESTS, le=MAX_ASK_REQUESTS)


class Access(BaseModel):
    id: int
    op: Literal["access"]
    ingress: str = Field(max_length=128)
    lines: list[AccessLine] = Field(max_length=MAX_ACCESS_LINES)


class Traffic(BaseModel):
    id: int
    op: Literal["traffic"]
    apps: TrafficReport = Field(max_length=MAX_APPS_PER_REPORT)


class Routes(BaseModel):
    id: int
    op: Literal["routes"]
    ingress: str = Field(pattern=REPLICA_PATTERN)
    revision: StrictInt | None = Field(ge=0, le=2**63 - 1)
    """None: the ingress stops (it drains), and a deploy waits for it no more."""
    instance: str = Field(default="", pattern=INSTANCE_PATTERN)
    """The ingress process's random id: two of one name are two ingresses (`Marks`). An
    older ingress sends none."""


Operation = Annotated[
    Acquire | Renew | Release | Adopt | Cancel | Ride | Traffic | Access | Routes,
    Field(discriminator="op"),
]
OPERATION: TypeAdapter[Operation] = TypeAdapter(Operation)
