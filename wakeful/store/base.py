"""The store interface, its value types, and the codec every backend shares.

Rules every backend keeps (the contract suite in tests/store checks each):

- Every write happens at one new store revision; every read returns the value with the
  revision it was last written at (etcd's `mod_revision`). Revisions only grow.
- A write conditional on a revision that is no longer current raises `Conflict` carrying the
  current revision, and writes nothing. The checks and the writes of a `txn` are atomic.
- `watch(prefix, from_revision)` yields every change under the prefix at or after
  `from_revision`, in revision order. When the backend cannot promise that (history was
  compacted, a reconnect skipped revisions) it yields one `Resync` and ends: the consumer
  re-lists and watches again from the listing's revision + 1.
- Keys are relative (`pools/p1`); a backend may place them under a namespace of its own.
"""

from __future__ import annotations

import logging
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import AlreadyExists, Conflict, CorruptValue, InvalidKey, ValueTooLarge

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

MAX_KEY_LENGTH = 512
MAX_VALUE_BYTES = 1024 * 1024
"""etcd refuses requests over 1.5 MiB by default; a value stays well under that."""

_SEGMENT = r"[A-Za-z0-9_:@=+-][A-Za-z0-9._:@=+-]*"
_KEY = re.compile(rf"^{_SEGMENT}(/{_SEGMENT})*$")
_PREFIX = re.compile(rf"^({_SEGMENT}(/{_SEGMENT})*/?)?$")


@dataclass(frozen=True, slots=True)
class Item(Generic[T]):
    key: str
    value: T
    revision: int


@dataclass(frozen=True, slots=True)
class Listing(Generic[T]):
    items: list[Item[T]]
    revision: int
    """The store's revision when listed: watch from `revision + 1` to miss nothing."""
    invalid: list[str] = field(default_factory=list)
    """Keys under the prefix whose values did not validate as the model (left out)."""


@dataclass(frozen=True, slots=True)
class Event:
    """One change: `data` is the new value for a put, None for a delete."""

    kind: Literal["put", "delete"]
    key: str
    revision: int
    data: bytes | None

    def decode(self, model: type[M]) -> M:
        if self.data is None:
            raise CorruptValue(f"{self.key!r} was deleted at revision {self.revision}")
        return decode(self.key, self.data, model)


@dataclass(frozen=True, slots=True)
class Resync:
    """Continuity is lost: re-list, then watch again from the listing's revision + 1."""

    revision: int
    reason: str


WatchItem = Event | Resync


@dataclass(frozen=True, slots=True)
class Require:
    """A txn check: `key` is at `revision` (0 means absent)."""

    key: str
    revision: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: BaseModel
    lease: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


Op = Put | Delete


@dataclass(frozen=True, slots=True)
class RawPut:
    key: str
    data: bytes
    lease: int | None


RawOp = RawPut | Delete


class Store(Protocol):
    """What wakeful's components need of shared state."""

    async def get(self, key: str, model: type[M]) -> Item[M] | None: ...

    async def list(self, prefix: str, model: type[M]) -> Listing[M]: ...

    async def create(self, key: str, value: BaseModel, *, lease: int | None = None) -> int: ...

    async def put(self, key: str, value: BaseModel, *, lease: int | None = None) -> int: ...

    async def update(
        self, key: str, value: BaseModel, expect_revision: int, *, lease: int | None = None
    ) -> int: ...

    async def delete(self, key: str, expect_revision: int | None = None) -> bool: ...

    async def txn(self, require: Sequence[Require], ops: Sequence[Op]) -> int: ...

    def watch(self, prefix: str, from_revision: int | None = None) -> AsyncIterator[WatchItem]: ...

    async def grant(self, ttl: int) -> int: ...

    async def keep_alive(self, lease: int) -> None: ...

    async def revoke(self, lease: int) -> None: ...

    async def compact(self, revision: int) -> None: ...

    async def aclose(self) -> None: ...


def check_key(key: str) -> str:
    if len(key) > MAX_KEY_LENGTH or not _KEY.fullmatch(key):
        raise InvalidKey(
            f"invalid key {key[:80]!r}: use '/'-separated segments of letters, digits and "
            f"._:@=+- (not starting with '.'), at most {MAX_KEY_LENGTH} characters"
        )
    return key


def check_prefix(prefix: str) -> str:
    if len(prefix) > MAX_KEY_LENGTH or not _PREFIX.fullmatch(prefix):
        raise InvalidKey(f"invalid prefix {prefix[:80]!r}: a key, optionally ending in '/'")
    return prefix


def prefix_end(prefix: str) -> str | None:
    """The first key after every key that starts with `prefix` (None: no bound)."""
    if not prefix:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def encode(key: str, value: BaseModel) -> bytes:
    data = value.model_dump_json().encode()
    if len(data) > MAX_VALUE_BYTES:
        raise ValueTooLarge(
            f"value for {key!r} is {len(data)} bytes; the bound is {MAX_VALUE_BYTES} bytes"
        )
    return data


def decode(key: str, data: bytes, model: type[M]) -> M:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptValue(f"{key!r} does not hold a valid {model.__name__}: {exc}") from exc


class StoreBase(ABC):
    """Validation and serialisation over four raw primitives a backend implements.

    Every single-key write is a txn: create requires absence, update requires a revision.
    """

    @abstractmethod
    async def _get(self, key: str) -> tuple[bytes, int] | None: ...

    @abstractmethod
    async def _list(self, prefix: str) -> tuple[list[tuple[str, bytes, int]], int]: ...

    @abstractmethod
    async def _commit(self, require: Sequence[Require], ops: Sequence[RawOp]) -> tuple[int, int]:
        """Apply `ops` atomically if every `require` holds; return (revision, keys deleted).

        Raises Conflict naming the first requirement that failed, and writes nothing.
        """

    @abstractmethod
    def _watch(self, prefix: str, from_revision: int | None) -> AsyncIterator[WatchItem]: ...

    @abstractmethod
    async def grant(self, ttl: int) -> int: ...

    @abstractmethod
    async def keep_alive(self, lease: int) -> None: ...

    @abstractmethod
    async def revoke(self, lease: int) -> None: ...

    @abstractmethod
    async def compact(self, revision: int) -> None: ...

    @abstractmethod
    async def aclose(self) -> None: ...

    async def get(self, key: str, model: type[M]) -> Item[M] | None:
        found = await self._get(check_key(key))
        if found is None:
            return None
        return Item(key, decode(key, found[0], model), found[1])

    async def list(self, prefix: str, model: type[M]) -> Listing[M]:
        """Every valid item under `prefix`. A value that does not validate is left out and
        named in `Listing.invalid` (and logged): one bad record must not hide all the others
        from the components that list them (the activator, the controller)."""
        rows, revision = await self._list(check_prefix(prefix))
        items: list[Item[M]] = []
        invalid: list[str] = []
        for key, data, rev in rows:
            try:
                items.append(Item(key, decode(key, data, model), rev))
            except CorruptValue as exc:
                log.error("skipping an invalid record: %s", exc, extra={"key": key})
                invalid.append(key)
        return Listing(items, revision, invalid)

    async def create(self, key: str, value: BaseModel, *, lease: int | None = None) -> int:
        op = RawPut(check_key(key), encode(key, value), lease)
        try:
            return (await self._commit([Require(key, 0)], [op]))[0]
        except Conflict as exc:
            raise AlreadyExists(key, exc.current_revision, 0) from None

    async def put(self, key: str, value: BaseModel, *, lease: int | None = None) -> int:
        op = RawPut(check_key(key), encode(key, value), lease)
        return (await self._commit([], [op]))[0]

    async def update(
        self, key: str, value: BaseModel, expect_revision: int, *, lease: int | None = None
    ) -> int:
        op = RawPut(check_key(key), encode(key, value), lease)
        return (await self._commit([_expect(key, expect_revision)], [op]))[0]

    async def delete(self, key: str, expect_revision: int | None = None) -> bool:
        require = [] if expect_revision is None else [_expect(check_key(key), expect_revision)]
        return (await self._commit(require, [Delete(check_key(key))]))[1] > 0

    async def txn(self, require: Sequence[Require], ops: Sequence[Op]) -> int:
        for check in require:
            check_key(check.key)
            if check.revision < 0:
                raise ValueError(f"revision for {check.key!r} must be >= 0")
        raw: list[RawOp] = []
        for op in ops:
            key = check_key(op.key)
            raw.append(RawPut(key, encode(key, op.value), op.lease) if isinstance(op, Put) else op)
        keys = [op.key for op in raw]
        if len(set(keys)) != len(keys):
            raise ValueError("a txn may write each key at most once")
        if not raw:
            raise ValueError("a txn needs at least one write")
        return (await self._commit(require, raw))[0]

    def watch(self, prefix: str, from_revision: int | None = None) -> AsyncIterator[WatchItem]:
        if from_revision is not None and from_revision < 1:
            raise ValueError(f"from_revision must be >= 1, got {from_revision}")
        return self._watch(check_prefix(prefix), from_revision)


def _expect(key: str, revision: int) -> Require:
    if revision < 1:
        raise ValueError(f"expect_revision for {key!r} must be >= 1, got {revision}")
    return Require(key, revision)
