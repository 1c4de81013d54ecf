"""Who holds a stateful app's state (`states/{app}`, `AppState`): release and adopt, as pure
decisions (incident 002, design/stateful-apps-and-evacuation.md).

The one rule: ownership moves only from a record read at (node, epoch) to one written by
compare-and-set on that record's revision, and every move raises the epoch.

- **adopt** (the pool controller, placing the app's sandbox on `node`): only a state that
  belongs to no node, at the epoch the planner read, becomes `node`'s at epoch + 1, for that
  sandbox. Of two adopters that read the same record, the second's compare-and-set fails, and
  deciding again from the fresh record refuses it (stale epoch): exactly one wins.
- **release** (the holding node, its sandbox stopped and its state archived): only the holder
  at the epoch it adopted can hand the state back to no node, at epoch + 1, with the digest of
  the archive it just stored. A node that lost the state (released for it when it was presumed
  dead, or a stale run) is refused and writes nothing.
- **keep** (the holder, when its archive could not be stored): the state stays where it is, at
  the same epoch, with the reason, so nothing is released without its latest archive.
- **take back** (the pool controller, when the holding node is gone): released at epoch + 1
  with the archive it last stored; whatever it wrote after that archive died with the node.

No I/O here: `wakeful.node.state.hold` and the pool controller read, decide and write.
"""

from __future__ import annotations

from dataclasses import dataclass

from wakeful.domain.models import AppState


@dataclass(frozen=True)
class Stale:
    """The record is not where the caller read it: nothing is written."""

    reason: str


MAX_ERROR = 4000
"""Characters of a reason kept in the record."""


def storable(reason: str) -> str:
    """`reason` as a record can hold it: a reason can quote a path the app chose, and a file
    name's undecodable bytes (surrogates) would fail the record's encoding, after the decision
    that wrote it (a keep that failed so once let the state go back without its data)."""
    return reason.encode("utf-8", "backslashreplace").decode("utf-8")[:MAX_ERROR]


def holder(record: AppState) -> str:
    return "no node" if record.node is None else f"node {record.node}"


def adopt(
    record: AppState | None, app: str, node: str, sandbox: str, expected_epoch: int, now: float
) -> AppState | Stale:
    """`record` (None: the app never ran) adopted by `node` for `sandbox`, if it still belongs
    to no node at `expected_epoch`."""
    if record is None:
        if expected_epoch != 0:
            return Stale(f"the state of app {app!r} is gone (expected epoch {expected_epoch})")
        # Not 1: a sandbox of a deleted app of the same name must never hold a matching epoch.
        return AppState(app=app, node=node, epoch=max(1, int(now * 1000)), sandbox=sandbox)
    if record.node is not None or record.epoch != expected_epoch:
        return Stale(
            f"the state of app {app!r} is held by {holder(record)} at epoch {record.epoch}, "
            f"not free at epoch {expected_epoch}"
        )
    update: dict[str, object] = {
        "node": node,
        "epoch": record.epoch + 1,
        "sandbox": sandbox,
        "error": "",
        "kept": False,
    }
    if record.released_by is not None and record.released_by != node:
        update.update(moved_from=record.released_by, moved_at=now)
    return record.model_copy(update=update)


def release(
    record: AppState,
    node: str,
    epoch: int,
    now: float,
    *,
    archive: str | None = None,
    size: int = 0,
    error: str = "",
) -> AppState | Stale:
    """`record` handed back by `node`, which holds it at `epoch`; `archive`: the digest of what
    it just stored (None: nothing newer than the record's own archive)."""
    if record.node != node or record.epoch != epoch:
        return Stale(
            f"the state of app {record.app!r} is held by {holder(record)} at epoch "
            f"{record.epoch}, not by node {node} at epoch {epoch}"
        )
    update: dict[str, object] = {
        "node": None,
        "epoch": epoch + 1,
        "sandbox": None,
        "released_by": node,
        "released_at": now,
        "error": storable(error),
        "kept": False,
    }
    if archive is not None:
        update.update(archive=archive, size=size, archived_at=now, archived_epoch=epoch)
    return record.model_copy(update=update)


def keep(
    record: AppState, node: str, epoch: int, error: str, *, kept: bool = True
) -> AppState | Stale:
    """`record` kept by `node` (which holds it at `epoch`), with why it was not handed back:
    `kept`, until an operator acts; otherwise the node is still handing it back."""
    if record.node != node or record.epoch != epoch:
        return Stale(
            f"the state of app {record.app!r} is held by {holder(record)} at epoch "
            f"{record.epoch}, not by node {node} at epoch {epoch}"
        )
    return record.model_copy(update={"error": storable(error), "kept": kept})


def take_back(record: AppState, gone: str, now: float, why: str = "") -> AppState | Stale:
    """`record`, held by the node `gone` that left the cluster (or that an operator gave up
    on, `why`), released with its last archive."""
    if record.node != gone:
        return Stale(f"the state of app {record.app!r} is held by {holder(record)} now")
    when = "never archived" if record.archive is None else "restored from its last archive"
    why = why or f"node {gone} was lost while it held the state"
    return record.model_copy(
        update={
            "node": None,
            "epoch": record.epoch + 1,
            "sandbox": None,
            "released_by": gone,
            "released_at": now,
            "kept": False,
            "error": storable(
                f"{why} ({when}; anything newer is only on node {gone}: in its "
                "kept-states directory if it kept it, lost if the node is)"
            ),
        }
    )
