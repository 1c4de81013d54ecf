from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from wakeful.domain.addresses import split_address
from wakeful.domain.hosts import HostRules, ends_in_number
from wakeful.domain.logfiles import Limits, parse_age
from wakeful.domain.models import HOST_PATTERN, parse_size
from wakeful.store.settings import StoreSettings


class ActivatorSettings(StoreSettings):
    token: SecretStr | None = None
    """WAKEFUL_TOKEN: bootstraps the control API's admin token (`tokens/admin`) while the store
    holds none (see `wakeful.activator.credentials.install_admin`). Required."""
    listen: str = "127.0.0.1:8082"
    lease_ttl: float = Field(default=60.0, gt=0, le=3600)
    """A lease not renewed within this many seconds expires and its capacity returns."""
    max_waiters: int = Field(default=1000, ge=1, le=1_000_000)
    """Requests one pool may hold parked; past it, 503 + Retry-After."""
    max_channels_per_token: int = Field(default=1024, ge=1, le=65_536)
    """WAKEFUL_MAX_CHANNELS_PER_TOKEN: lease channels one token may hold open at once. Each
    ingress process keeps one (a worker is a process); a fleet of more sharing one token
    needs more, or tokens of their own."""
    scale_up_backoff: float = Field(default=2.0, ge=0)
    activity_write_interval: float = Field(default=30.0, ge=0)
    """A sandbox's last_activity is written to the store at most this often."""
    expiry_interval: float = Field(default=1.0, gt=0)
    artifact_grace: float = Field(default=600.0, ge=0, le=30 * 86_400)
    """An artifact no version references is deleted only this many seconds after it was
    uploaded (or claimed by a deploy): it may be an upload whose version is not written yet."""
    artifact_gc_interval: float = Field(default=60.0, gt=0, le=86_400)
    """Seconds between collections of unreferenced artifacts (also run after each app
    deletion)."""
    advertise_url: str | None = Field(default=None, max_length=2000)
    """WAKEFUL_ADVERTISE_URL: where ingresses and nodes reach this activator's control API
    when it leads (written in `leaders/activator`); `http://{listen}` when unset."""
    election_ttl: int = Field(default=5, ge=2, le=60)
    """Seconds after a leading activator's last renewal before a standby may take over (a
    crash's takeover time); a leader cut off from the store stops acting after half of it."""
    adopt_window: float = Field(default=3.0, ge=0, le=120)
    """Seconds after taking over during which an activator grants nothing and only adopts
    the leases ingresses report holding (they report on reconnecting)."""
    acme_email: str | None = Field(
        default=None, min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$"
    )
    """WAKEFUL_ACME_EMAIL: turns on certificates from ACME for every app's exact `hosts` (and
    `<app>.<acme_base_domain>`): the account's contact address."""
    acme_directory: str = Field(
        default="https://acme-v02.api.letsencrypt.org/directory",
        pattern=r"^https://",
        max_length=2000,
    )
    """WAKEFUL_ACME_DIRECTORY: the ACME server's directory URL (Let's Encrypt's production one by
    default; its staging one is https://acme-staging-v02.api.letsencrypt.org/directory)."""
    tls_dir: Path | None = None
    """WAKEFUL_TLS_DIR: the ingresses' certificate files (`ingress.tls`); with ACME on, the
    names they cover are not ordered (files win for their names). Read for their names alone:
    where the ingresses run apart, give the control plane the same directory or a copy."""
    acme_orders_per_3h: int = Field(default=250, ge=1, le=100_000)
    """WAKEFUL_ACME_ORDERS_PER_3H: new orders this control plane starts in any 3 hours (Let's
    Encrypt allows 300 per account); past it, the next waits."""
    acme_ca: Path | None = None
    """WAKEFUL_ACME_CA: a PEM file trusting a private ACME server's TLS (pebble, step-ca)."""
    acme_base_domain: str | None = Field(default=None, pattern=HOST_PATTERN, max_length=253)
    """WAKEFUL_ACME_BASE_DOMAIN: a public domain whose wildcard DNS record points at the
    ingresses: `<app>.<domain>` is ordered for every app with its default host. Give it the
    value of WAKEFUL_BASE_DOMAIN (the names the ingresses route)."""
    artifact_dir: Path | None = None
    """WAKEFUL_ARTIFACT_DIR: where artifacts are kept; `<data dir>/artifacts` when unset.
    Activators that stand in for each other share it (one directory, or one network mount)."""
    log_dir: Path | None = None
    """WAKEFUL_LOG_DIR: where apps' output and access logs are kept (`docs/design/logs.md`);
    `<data dir>/logs` when unset. Apart from the artifact directory, so that logs filling it
    never fail an artifact, a state archive or an image; activators that stand in for each
    other share it, as they share the artifact directory."""
    log_retention: float = Field(default=7 * 86400.0, ge=60, le=10 * 365 * 86400)
    """WAKEFUL_LOG_RETENTION: how long a line is kept ("7d", "12h", seconds): a deleted app's
    lines too."""
    log_max_bytes: int = Field(default=4 << 30, ge=1 << 20, le=1 << 50)
    """WAKEFUL_LOG_MAX_BYTES: what the log directory may hold ("4G"); the oldest segments go."""
    log_app_max_bytes: int = Field(default=512 << 20, ge=64 << 10, le=1 << 50)
    """WAKEFUL_LOG_APP_MAX_BYTES: what one app's logs may hold ("512M"), output and access."""

    @field_validator("listen")
    @classmethod
    def _an_address(cls, value: str) -> str:
        """A port to serve on (not 0: the address is announced and advertised as given)."""
        try:
            port = split_address(value)[1]
        except ValueError:
            port = 0
        if port == 0:
            raise ValueError("expected host:port")  # pydantic names the field and the value
        return value

    @field_validator("log_retention", mode="before")
    @classmethod
    def _log_age(cls, value: object) -> object:
        return parse_age(value)

    @field_validator("log_max_bytes", "log_app_max_bytes", mode="before")
    @classmethod
    def _log_sizes(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    secrets_keys: Path | None = None
    """WAKEFUL_SECRETS_KEYS: the directory of the keys apps' secrets are sealed under (0700,
    one `<id>.key` file per key); `<data dir>/secret-keys` when unset. Activators that stand
    in for each other share it, as they share the artifact directory; back it up apart from
    the store's backups (`docs/design/secrets.md`)."""
    image_max_bytes: int = Field(default=4 << 30, ge=1 << 20, le=1 << 40)
    """The largest image a deploy may import (the sum of its layers, compressed) or upload as
    an archive. WAKEFUL_IMAGE_MAX_BYTES."""
    image_max_unpacked: int = Field(default=4 << 30, ge=1 << 20, le=1 << 40)
    """What one image may unpack to (from its layers' headers, so a compression bomb is refused
    at deploy); nodes bound it again with their own WAKEFUL_IMAGE_MAX_BYTES.
    WAKEFUL_IMAGE_MAX_UNPACKED."""
    image_max_files: int = Field(default=500_000, ge=100, le=50_000_000)
    """The most entries one image may unpack to. WAKEFUL_IMAGE_MAX_FILES."""

    @field_validator("image_max_bytes", "image_max_unpacked", mode="before")
    @classmethod
    def _image_sizes(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    image_pull_timeout: float = Field(default=600.0, gt=0, le=86_400)
    """Seconds an image's import may take at deploy (a stalled registry fails the deploy,
    naming the image). WAKEFUL_IMAGE_PULL_TIMEOUT."""
    image_platform: str = Field(default_factory=lambda: machine_platform())
    """WAKEFUL_IMAGE_PLATFORM: the platform an image's index is resolved for (`linux/amd64`,
    `linux/arm64`): this machine's by default; every node runs the same."""
    registry_ca: Path | None = None
    """WAKEFUL_REGISTRY_CA: a PEM file of the CA that signs a private registry's TLS
    certificate, besides the system's CAs. A registry on loopback may be plain HTTP."""
    state_max_bytes: int = Field(default=256 << 20, ge=1 << 20, le=64 << 30)
    """The largest state archive a node may store (`PUT /v1/states/{app}/archives/{digest}`);
    nodes have the same setting. WAKEFUL_STATE_MAX_BYTES."""
    state_pending_node_bytes: int = Field(default=1 << 30, ge=1 << 20, le=1 << 40)
    """Bytes of state archives one node may have stored and not yet released (past it, 507
    and the node tries again later). WAKEFUL_STATE_PENDING_NODE_BYTES."""
    state_pending_bytes: int = Field(default=4 << 30, ge=1 << 20, le=1 << 42)
    """The same, for all nodes together. WAKEFUL_STATE_PENDING_BYTES."""
    evacuate_concurrency: int = Field(default=4, ge=1, le=256)
    """Stateful sandboxes a drain moves at once, cluster-wide. WAKEFUL_EVACUATE_CONCURRENCY."""
    evacuate_grace: float = Field(default=30.0, ge=0, le=3600)
    """Seconds a stateful sandbox leaving service waits for its in-flight requests before it
    is stopped anyway (the next one cannot start before). WAKEFUL_EVACUATE_GRACE."""
    state_takeback_after: float = Field(default=300.0, ge=0, le=30 * 86_400)
    """Seconds a node holding a stateful app's state must be gone before the state is taken
    back with its last archive (what the app wrote since is lost with the node); a node back
    sooner hands it back itself. WAKEFUL_STATE_TAKEBACK_AFTER."""

    base_domain: str = "localhost"
    """WAKEFUL_BASE_DOMAIN: `<app>.<base_domain>` is an app's default host, which no other
    app's `hosts` may take. The ingress routes by the same variable: where they run apart, give
    both the same value."""
    reserved_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list, max_length=256)
    """WAKEFUL_RESERVED_HOSTS: the names operators reach the control API and `/ui` at (behind
    a reverse proxy, the dashboard's own host name), comma-separated or a JSON list. No app may
    claim one, or a host overlapping one: a browser would send it the dashboard's cookie. The
    hosts of `listen` and `advertise_url`, when they are names, are reserved as well
    (`host_rules`)."""

    @field_validator("acme_ca")
    @classmethod
    def _acme_ca(cls, path: Path | None) -> Path | None:
        if path is not None and not path.is_file():
            raise ValueError(f"{path} is not a file: give the PEM file of the ACME server's CA")
        return path

    @field_validator("acme_base_domain")
    @classmethod
    def _acme_base_domain(cls, domain: str | None) -> str | None:
        if domain is not None and domain.startswith("*."):
            raise ValueError(f"{domain} is a wildcard: give the domain itself (apps.example.com)")
        return domain

    @field_validator("reserved_hosts", mode="before")
    @classmethod
    def _host_list(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)  # malformed: a ValueError, named by pydantic
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("reserved_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        found = []
        for host in hosts:
            name = host.strip().casefold().removesuffix(".")
            if len(name) > 253 or not re.fullmatch(HOST_PATTERN, name):
                raise ValueError(f"{host!r} is not a host name (e.g. wakeful.example.com)")
            found.append(name)
        return found

    def advertised(self) -> str:
        return self.advertise_url or f"http://{self.listen}"

    def logs_dir(self, data_dir: Path) -> Path:
        """The log directory: WAKEFUL_LOG_DIR, else `<data dir>/logs`."""
        return self.log_dir or data_dir / "logs"

    def log_limits(self) -> Limits:
        return Limits(self.log_retention, self.log_max_bytes, self.log_app_max_bytes)

    def secrets_dir(self, data_dir: Path) -> Path:
        """The secrets key directory: WAKEFUL_SECRETS_KEYS, else `<data dir>/secret-keys`."""
        return self.secrets_keys or data_dir / "secret-keys"

    def host_rules(self) -> HostRules:
        """What a deploy checks hosts against: the base domain, and the names this control
        plane answers on (`reserved_hosts`, then the hosts of `listen` and of the advertised
        URL when they are names; an IP address is reserved anyway)."""
        names = list(self.reserved_hosts)
        listening = self.listen.rpartition(":")[0].strip("[]").casefold()
        try:
            advertised = urlsplit(self.advertised()).hostname or ""
        except ValueError:  # not a URL: nothing reaches the control plane by it
            advertised = ""
        for name in (listening, advertised):
            if name and ":" not in name and not ends_in_number(name) and name not in names:
                names.append(name)
        return HostRules(self.base_domain, tuple(names))


_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def machine_platform() -> str:
    """This machine's platform as OCI names it (`linux/amd64`)."""
    machine = platform.machine().lower()
    return f"linux/{_ARCHES.get(machine, machine)}"
