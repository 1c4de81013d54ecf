"""Settings shared by every component: where the store is. Each component subclasses this
with its own fields; all read `WAKEFUL_*` environment variables and are built once, at the
entry point, then passed down. Nothing else reads the environment."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.store import Store, TLSFiles, absolute_store_url, open_store


class StoreSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WAKEFUL_", extra="ignore")

    store_url: str = "sqlite:///.wakeful/store.db"
    """`memory://`, `sqlite:///path`, or `etcd://host:port[,host:port]`."""
    store_namespace: str = "/wakeful/"
    etcd_ca: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None

    @field_validator("store_url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        """Refuses an unknown scheme; a relative SQLite path is resolved here, once."""
        return absolute_store_url(url)

    @property
    def tls(self) -> TLSFiles:
        return TLSFiles(ca=self.etcd_ca, cert=self.etcd_cert, key=self.etcd_key)

    def open_store(self) -> AbstractAsyncContextManager[Store]:
        """The store these settings name, open for the duration of an `async with`."""
        return open_store(self.store_url, namespace=self.store_namespace, tls=self.tls)
