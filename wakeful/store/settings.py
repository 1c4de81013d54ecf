"""Settings shared by every component: where the store is. Each component subclasses this
with its own fields; all read `WAKEFUL_*` environment variables and are built once, at the
entry point, then passed down. Nothing else reads the environment."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.store import Store, TLSConfigError, TLSFiles, absolute_store_url, open_store
from wakeful.store.tls import load_tls
from wakeful.store.url import etcd_endpoints


class StoreSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WAKEFUL_", extra="ignore")

    store_url: str = "sqlite:///.wakeful/store.db"
    """`memory://`, `sqlite:///path`, or `etcd://host:port[,host:port]`."""
    store_namespace: str = "/wakeful/"
    etcd_ca: Path | None = None
    """PEM: the CA that signed etcd's server certificate. Alone: TLS without a client
    certificate; with `etcd_cert` and `etcd_key`: mutual TLS."""
    etcd_cert: Path | None = None
    """PEM: this piece's client certificate, signed by a CA etcd trusts (--trusted-ca-file)."""
    etcd_key: Path | None = None
    """PEM: the private key of `etcd_cert`."""
    etcd_server_name: str | None = None
    """The name checked in etcd's server certificate instead of the address; needed with TLS
    when `store_url` lists several endpoints."""

    @field_validator("store_url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        """Refuses an unknown scheme; a relative SQLite path is resolved here, once."""
        return absolute_store_url(url)

    @field_validator("store_namespace")
    @classmethod
    def _a_namespace(cls, value: str) -> str:
        """As etcd's store takes it (`/wakeful/`): checked with the settings, so a piece (or
        `wakeful restore`) refuses it in one line before it opens anything."""
        if not value.startswith("/") or not value.endswith("/"):
            raise ValueError("must start and end with '/', such as /wakeful/")
        return value

    @field_validator("etcd_ca", "etcd_cert", "etcd_key")
    @classmethod
    def _absolute_path(cls, value: Path | None) -> Path | None:
        """Resolved against the current directory once, at start, like the store's path."""
        return None if value is None else value.absolute()

    @model_validator(mode="after")
    def _usable_tls(self) -> StoreSettings:
        """For an etcd store, the TLS settings must work together and name readable PEM
        files; the error names the setting and the path. Checked again when the store opens;
        ignored by the other stores."""
        if self.store_url.startswith("etcd://"):
            try:
                load_tls(self.tls, etcd_endpoints(self.store_url))
            except TLSConfigError as exc:  # reported as is, without pydantic's "Value error, "
                raise PydanticCustomError("etcd_tls", "{problem}", {"problem": str(exc)}) from None
        return self

    @property
    def tls(self) -> TLSFiles:
        return TLSFiles(
            ca=self.etcd_ca,
            cert=self.etcd_cert,
            key=self.etcd_key,
            server_name=self.etcd_server_name,
        )

    def open_store(self) -> AbstractAsyncContextManager[Store]:
        """The store these settings name, open for the duration of an `async with`."""
        return open_store(self.store_url, namespace=self.store_namespace, tls=self.tls)
