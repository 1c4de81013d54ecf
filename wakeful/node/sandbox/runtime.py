"""What the runner needs to run a sandbox's process: the narrow `Runtime` and `SandboxProcess`
interfaces, and the `Identity` a process is started with.

`sandbox.local.ProcessRuntime` is the real runtime (a local process, isolated in a jail when it
has one); `wakeful.node.testing.FakeRuntime` is the fake the agent's tests run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from wakeful.domain.models import ImageRecord, Resources

from .workdir import Packed


class SandboxProcess(Protocol):
    @property
    def pid(self) -> int: ...

    async def pump(self, forward: Callable[[bytes], None]) -> None: ...

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> int: ...

    def tail(self) -> str: ...

    def reason(self) -> str | None:
        """Why it ended, when the runtime knows better than its exit code (out of memory)."""

    def owns_port(self, port: int) -> bool:
        """Whatever listens on `port` is this sandbox (not another app squatting it)."""

    @property
    def listening(self) -> Callable[[], bool] | None:
        """Whether the app listens, asked of its own network namespace (an image app's); None
        when it shares the node's network (its port is knocked on)."""

    def settled(self) -> None:
        """Its start is over (the first probe answered or gave up): work the runtime held
        back so as not to slow the start may run. Idempotent; `wait` implies it."""

    @property
    def app_dir(self) -> Path:
        """Where the app's tree is on this node. For a stateful sandbox (`Identity.stateful`)
        it stays there after the process ends, until `dispose`, so its state can be archived."""

    def dispose(self) -> None:
        """Let go of the app's tree (idempotent; only a stateful sandbox's is still held)."""

    async def freeze(self) -> int:
        """Stop every process of the sandbox where it is (the suspended tier); returns the
        bytes it holds. Does nothing once a stop began."""

    async def thaw(self) -> None:
        """Let a frozen sandbox run again (at once: this is a wake's fast path)."""


@dataclass(frozen=True)
class Identity:
    """Which sandbox of which app a process is, and what it may use."""

    sandbox_id: str = "sandbox"
    app: str = "app"
    limits: Resources = field(default_factory=Resources)
    stateful: bool = False
    """Its tree outlives its process (until `SandboxProcess.dispose`): it never takes a warm
    slot, whose tree a restarted agent could not find again."""


@dataclass(frozen=True)
class ImageRun:
    """An image app's start: the pinned image, whose cached tree becomes the sandbox's root
    (an overlay), and where in it the app runs."""

    record: ImageRecord
    workdir: str = "/"
    """Absolute, inside the image (its `WorkingDir`, `/` when it names none)."""
    app_port: int | None = None
    """The port the app listens on in a network namespace of its own, forwarded from
    `node_host`:`node_port`; None: it shares the node's network and listens on PORT."""
    node_host: str = "127.0.0.1"
    node_port: int = 0


class ImageTrees(Protocol):
    """The node's cache of unpacked images (`wakeful.node.images`)."""

    async def acquire(self, image: ImageRecord, owner: int | None) -> Path:
        """The image's unpacked tree, its files `owner`'s where the image's user owns them;
        kept in the cache until `release` (raises `ImageError`)."""

    def release(self, image: ImageRecord, owner: int | None) -> None: ...

    async def tree(self, image: ImageRecord, owner: int | None) -> Path:
        """The tree, made if need be, not held (a deploy's warming)."""


UNNAMED = Identity()
"""For a process started outside any sandbox record (tests, tools): default limits."""


class Runtime(Protocol):
    async def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: Path,
        log_path: Path,
        identity: Identity = ...,
        packed: Packed | None = None,
        image: ImageRun | None = None,
    ) -> SandboxProcess:
        """Start `command` with the app's files in `workdir`; with `packed`, the runtime
        unpacks them first (into `workdir`, or straight into the sandbox's own filesystem when
        it gives it one, where `workdir` is then never written). Raises `ArtifactError` for
        bytes that are not the artifact, `OSError` for a start that failed. With `image`, its
        tree is the sandbox's root and `workdir` is unused."""
