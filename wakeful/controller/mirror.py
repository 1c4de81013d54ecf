"""What the pool controller plans from between listings: a `Mirror` of the store's pools,
sandboxes, nodes, cordons, states and apps' secrets generations, kept by one watch
(`wakeful.store.reflector`).

Each record is decoded once, when it changes: a tick that listed and decoded every record was
the node's busiest code during a burst of wakes. Only the reflector writes the tables; the
reconciler, the dashboard and the metrics collectors read them. `State` is what one
reconciliation plans from, whether taken from the mirror or listed from the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field

from wakeful.domain.models import AppState, Cordon, Node, Pool, Sandbox
from wakeful.store import Item

M = TypeVar("M", bound=BaseModel)


class SecretsRestart(BaseModel):
    """What the pool controller reads of an app's secrets (`secrets/{app}`, `AppSecrets`):
    the generation its sandboxes must have started at. The sealed values are neither decoded
    nor kept (the other fields are ignored): the controller holds no ciphertext it has no use
    for, and a change of values alone costs it one small decode."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    app: str
    restart_generation: int = Field(default=0, ge=0)


class Mirror:
    """Every pool, sandbox, node, cordon, state and app's `SecretsRestart` as the reflector
    last delivered them (each decoded once, when it changed), and `changed`, set by any
    listing or change.

    `revision`: every write up to it is in every table. A listing replaces the tables one by
    one, each as of its own revision, so after one it is the oldest of them (the watch then
    goes on from there, in order); `listed` is False while a listing is under way."""

    def __init__(self) -> None:
        self.changed = anyio.Event()
        self.revision = 0
        self.listed = False
        self.pools: _Table[Pool] = _Table(self)
        self.sandboxes: _Table[Sandbox] = _Table(self)
        self.nodes: _Table[Node] = _Table(self)
        self.cordons: _Table[Cordon] = _Table(self)
        self.states: _Table[AppState] = _Table(self)
        self.secrets: _Table[SecretsRestart] = _Table(self)

    def relisting(self) -> None:
        self.listed = False

    def done_listing(self) -> None:
        self.revision = min(
            table.listed_at
            for table in (
                self.pools,
                self.sandboxes,
                self.nodes,
                self.cordons,
                self.states,
                self.secrets,
            )
        )
        self.listed = True
        self.changed.set()

    def saw(self, revision: int) -> None:
        """A watched change: every revision before it was delivered already."""
        self.revision = max(self.revision, revision)
        self.changed.set()

    def state(self) -> State:
        return State(
            list(self.pools.items.values()),
            list(self.sandboxes.items.values()),
            list(self.nodes.items.values()),
            list(self.cordons.items.values()),
            list(self.states.items.values()),
            list(self.secrets.items.values()),
        )


class _Table(Generic[M]):
    """One prefix of the `Mirror` (a reflector view)."""

    def __init__(self, mirror: Mirror) -> None:
        self._mirror = mirror
        self.items: dict[str, Item[M]] = {}
        self.listed_at = 0

    def replace(self, items: list[Item[M]], revision: int) -> None:
        self.items = {item.key: item for item in items}
        self.listed_at = revision
        self._mirror.changed.set()

    def put(self, item: Item[M]) -> None:
        self.items[item.key] = item
        self._mirror.saw(item.revision)

    def delete(self, key: str, revision: int) -> None:
        self.items.pop(key, None)
        self._mirror.saw(revision)


@dataclass(frozen=True)
class State:
    """What one tick plans from."""

    pools: list[Item[Pool]]
    sandboxes: list[Item[Sandbox]]
    nodes: list[Item[Node]]
    cordons: list[Item[Cordon]]
    states: list[Item[AppState]]
    secrets: list[Item[SecretsRestart]]

    def restart_generations(self) -> dict[str, int]:
        """Each app's `restart_generation`; an app with no secrets record is absent (0)."""
        return {item.value.app: item.value.restart_generation for item in self.secrets}
