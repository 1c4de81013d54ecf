"""Shared state: one `Store` interface, three backends (etcd, embedded SQLite, memory)."""

from .base import (
    Delete,
    Event,
    Item,
    Listing,
    Op,
    Put,
    Require,
    Resync,
    Store,
    WatchItem,
)
from .errors import (
    AlreadyExists,
    Conflict,
    CorruptValue,
    InvalidKey,
    LeaseNotFound,
    StoreError,
    TLSConfigError,
    Unavailable,
    ValueTooLarge,
)
from .url import TLSFiles, absolute_store_url, open_store, parse_store_url, sqlite_url

__all__ = [
    "AlreadyExists",
    "Conflict",
    "CorruptValue",
    "Delete",
    "Event",
    "InvalidKey",
    "Item",
    "LeaseNotFound",
    "Listing",
    "Op",
    "Put",
    "Require",
    "Resync",
    "Store",
    "StoreError",
    "TLSConfigError",
    "TLSFiles",
    "Unavailable",
    "ValueTooLarge",
    "WatchItem",
    "absolute_store_url",
    "open_store",
    "parse_store_url",
    "sqlite_url",
]
