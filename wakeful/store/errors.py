"""Errors every store backend raises, whatever the backend's own exceptions are.

    StoreError
    ├── Conflict             a conditional write found another revision; nothing written
    │   └── AlreadyExists    create() of a key that is present
    ├── InvalidKey           a key or prefix outside the allowed alphabet or length
    ├── ValueTooLarge        a serialised value over the backend's size bound
    ├── CorruptValue         stored bytes that do not validate as the model asked for
    ├── LeaseNotFound        keep-alive or attach to a TTL lease that expired or never was
    ├── TLSConfigError       WAKEFUL_ETCD_* settings that cannot work (a half pair, a missing
    │                        file); raised before any connection
    ├── Deposed              a write fenced by an election term that has ended; nothing
    │                        written
    └── Unavailable          the backend cannot be reached (etcd down or silent, database
                             closed, a TLS handshake refused)

Backends translate their client library's exceptions into these at their boundary.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises."""


class Conflict(StoreError):
    """A write conditional on a revision found another one. Nothing was written."""

    def __init__(self, key: str, current_revision: int, expected_revision: int | None = None):
        self.key = key
        self.current_revision = current_revision
        self.expected_revision = expected_revision
        state = "absent" if current_revision == 0 else f"at revision {current_revision}"
        wanted = "" if expected_revision is None else f", expected revision {expected_revision}"
        super().__init__(f"{key!r} is {state}{wanted}")


class AlreadyExists(Conflict):
    """create() found the key present."""


class InvalidKey(StoreError, ValueError):
    pass


class ValueTooLarge(StoreError, ValueError):
    pass


class CorruptValue(StoreError):
    pass


class LeaseNotFound(StoreError):
    pass


class TLSConfigError(StoreError, ValueError):
    """etcd TLS settings that cannot work; the message names the settings and the file.
    A ValueError too, so a settings validator that raises it reports it as a bad value."""


class Deposed(StoreError):
    """A write made under an election term (`wakeful.store.election.FencedStore`) found the
    term over: another holder was elected, or the lease expired. Nothing was written."""


class Unavailable(StoreError):
    pass


class Forbidden(StoreError):
    """The store refuses this piece the keys it asked for: under `wakeful etcd-auth`, its
    certificate's role does not grant them (`wakeful.store.etcd_auth.PIECES`)."""
