"""How a failure deep in a long-lived piece (or a store operation) becomes the one line a CLI
error prints: the single cause out of nested task groups, an OSError as `FILE: reason`."""

from __future__ import annotations


def single_cause(raised: BaseException) -> BaseException:
    """The one exception inside nested task-group exception groups (or the group itself)."""
    while isinstance(raised, BaseExceptionGroup) and len(raised.exceptions) == 1:
        raised = raised.exceptions[0]
    return raised


def os_error_text(exc: OSError) -> str:
    """`FILE: reason` (or the reason alone): an OSError as one line of a CLI error."""
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}"
