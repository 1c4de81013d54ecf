from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr

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
    artifact_dir: Path | None = None
    """WAKEFUL_ARTIFACT_DIR: where artifacts are kept; `<data dir>/artifacts` when unset.
    Activators that stand in for each other share it (one directory, or one network mount)."""
    state_max_bytes: int = Field(default=256 << 20, ge=1 << 20, le=64 << 30)
    """The largest state archive a node may store (`PUT /v1/states/{digest}`); nodes have the
    same setting. WAKEFUL_STATE_MAX_BYTES."""
    evacuate_concurrency: int = Field(default=4, ge=1, le=256)
    """Stateful sandboxes a drain moves at once, cluster-wide. WAKEFUL_EVACUATE_CONCURRENCY."""
    evacuate_grace: float = Field(default=30.0, ge=0, le=3600)
    """Seconds a stateful sandbox leaving service waits for its in-flight requests before it
    is stopped anyway (the next one cannot start before). WAKEFUL_EVACUATE_GRACE."""
    state_takeback_after: float = Field(default=300.0, ge=0, le=30 * 86_400)
    """Seconds a node holding a stateful app's state must be gone before the state is taken
    back with its last archive (what the app wrote since is lost with the node); a node back
    sooner hands it back itself. WAKEFUL_STATE_TAKEBACK_AFTER."""

    def advertised(self) -> str:
        return self.advertise_url or f"http://{self.listen}"
