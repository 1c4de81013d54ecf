"""What `wakeful up` is, apart from its wiring (`wakeful.bootstrap.run_up`): the settings of
every piece on one data directory, where a rotated admin token goes, where it says each
app answers, and how its node agent gets a sandbox's secrets (`BookSecrets`).

Everything runs in one process on the embedded store (`store.db` in the data directory): the
control plane with its API on `api`, one node agent named `local`, and the ingress on
`listen` with its admin (metrics) address on `admin`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from wakeful.activator.settings import ActivatorSettings
from wakeful.datadir import write_control_file, write_token
from wakeful.node.secrets import SecretsRefused
from wakeful.node.settings import NodeSettings
from wakeful.secrets.book import SecretBook
from wakeful.secrets.errors import NotYours, SecretsError, UnknownSandbox
from wakeful.store import sqlite_url

if TYPE_CHECKING:  # the ingress (httptools, uvloop) is imported only by what runs one
    from wakeful.ingress.settings import IngressSettings

LOOPBACK_NAMES = ("127.0.0.1", "0.0.0.0", "localhost")
"""Listen hosts an app's address is announced under `localhost` for."""


@dataclass(frozen=True)
class UpSettings:
    activator: ActivatorSettings
    node: NodeSettings
    ingress: IngressSettings


def up_settings(
    data_dir: Path,
    token: str,
    *,
    api: str,
    listen: str,
    admin: str,
    isolation: Literal["bwrap", "none"] | None,
) -> UpSettings:
    """Every piece on the store in `data_dir`, WAKEFUL_* variables for the rest."""
    from wakeful.ingress.settings import IngressSettings

    store_url = sqlite_url(data_dir / "store.db")
    activator = ActivatorSettings(store_url=store_url, token=token, listen=api)
    # The in-process ingress has stopped before the node agent does: nothing left to drain.
    node = NodeSettings(
        store_url=store_url,
        node_name="local",
        data_dir=data_dir,
        shutdown_drain=0,
    )
    if isolation is not None:  # the flag beats WAKEFUL_ISOLATION
        node = node.model_copy(update={"isolation": isolation})
    # Shown in 503 answers only while the ingress listens on loopback (boot_log_shown).
    ingress = IngressSettings(
        store_url=store_url,
        listen=listen,
        admin_listen=admin,
        show_boot_log=True,
        server_timing=True,
        access_log=True,
    )
    return UpSettings(activator, node, ingress)


def admin_writer(data_dir: Path, api: str, listen: str) -> Callable[[str], str]:
    """Where a rotated admin token goes (`tokens_router`'s `write_admin`)."""

    def write_admin(secret: str) -> str:
        """A rotated admin token goes where this process's user finds it: the token file,
        and the control file the other commands read."""
        write_control_file(data_dir, f"http://{api}", secret, f"http://{listen}")
        return str(write_token(data_dir, secret))

    return write_admin


def app_address(name: str, listen: str, tls_port: int) -> str:
    """Where app `name` answers, as announced: its default host under the ingress's listen
    host (`localhost` for a loopback or wildcard one), and over HTTPS too when the ingress
    serves TLS (`tls_port`, 0 when it does not)."""
    host, _, port = listen.rpartition(":")
    shown = "localhost" if host in LOOPBACK_NAMES else host
    https = f" and https://{name}.{shown}:{tls_port}/" if tls_port else ""
    return f"http://{name}.{shown}:{port}/{https}"


class SecretsUnavailable(OSError):
    """The book could not open an app's values now (a key missing, a record unreadable): the
    start fails and is tried again, as for an artifact that cannot be fetched."""


class BookSecrets:
    """The node agent's `SecretSource` in the control plane's process (`wakeful up`): the
    book itself, for one node. The book's refusals become the node's (`SecretsRefused`);
    `wakeful.secrets` and `wakeful.node` do not import each other."""

    def __init__(self, book: SecretBook, node: str) -> None:
        self._node = book.for_node(node)

    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        try:
            return await self._node.env_for(sandbox_id)
        except (NotYours, UnknownSandbox) as exc:
            raise SecretsRefused(str(exc)) from None
        except SecretsError as exc:  # its message names app, name and key id: never a value
            raise SecretsUnavailable(str(exc)) from None
