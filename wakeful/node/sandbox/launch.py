"""What a sandbox's start is made of: its `Launch` (spec, directory, port, image), and the
command, environment and image it runs with (`what_runs`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wakeful.domain.command import expand_command
from wakeful.domain.models import AppSpec, ImageRecord, exposed_port, image_env
from wakeful.node.secrets import sandbox_env

from .ports import PortPool
from .runtime import ImageRun
from .workdir import Packed


@dataclass(frozen=True)
class Launch:
    """A sandbox ready to start: its spec, directory and port (its environment is made at the
    start, with its secrets, and kept nowhere: `_boot`)."""

    spec: AppSpec
    app: str
    base: Path
    packed: Packed | None
    host: str
    port: int
    image: ImageRecord | None = None
    app_port: int | None = None
    """Where an image app listens in its own network namespace (`port` is forwarded there)."""
    version: str = ""
    """The version its pool runs: named on each line of its output in the log."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def what_runs(
    launch: Launch, secrets: dict[str, str]
) -> tuple[list[str], dict[str, str], ImageRun | None]:
    """The command, environment and image of a start. An image's `Entrypoint` + `Cmd` run as
    it says (unexpanded, as docker runs its exec form) unless wakeful.toml's `command` is
    given; its `Env` lies under wakeful.toml's env, the secrets, PORT and HOST."""
    spec, port, host = launch.spec, launch.port, launch.host
    if launch.image is None:
        env = sandbox_env(spec.env, secrets, port, host)
        return expand_command(spec.command, port, host), env, None
    config = launch.image.config
    if launch.app_port is not None:  # its own network: all its addresses are its own
        port, host = launch.app_port, "0.0.0.0"
    command = (
        expand_command(spec.command, port, host)
        if spec.command
        else [
            *config.entrypoint,
            *config.cmd,
        ]
    )
    env = sandbox_env({**image_env(config), **spec.env}, secrets, port, host)
    run = ImageRun(
        launch.image, config.working_dir or "/", launch.app_port, launch.host, launch.port
    )
    return command, env, run


def ports(
    pool: PortPool, spec: AppSpec, image: ImageRecord | None
) -> tuple[int, int | None, int | None]:
    """(the sandbox's port on this node, the port an image app listens on in its own network
    namespace, the port taken from `pool` to give back). A directory app listens on the
    node's port: its own `port` when it has one, else a free one passed in PORT. An image
    app's node port is always a free one, forwarded to its own (`port`, else the image's one
    EXPOSE, else the same number, passed in PORT): two sandboxes of an image that listens on
    80 share no port. `NoFreePort` when the pool has none."""
    if image is not None:
        taken = pool.take()
        inside = spec.port if spec.port is not None else exposed_port(image.config)
        return taken, inside if inside is not None else taken, taken
    if spec.port is not None:
        return pool.check_fixed(spec.port), None, None
    taken = pool.take()
    return taken, None, taken
