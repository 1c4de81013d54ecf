"""An image app's start (`ProcessRuntime.start` with an `ImageRun`): cold, always.

The image's cached tree (`wakeful.node.images.ImageCache`, held until the sandbox's tree goes)
under an overlay in the sandbox's own bounded tmpfs (`tmpfs.mount_image_root`), its cgroup,
its own network namespace when it listens on a port of its own (`jail.netns`: pasta forwards
the sandbox's node port there), then the image chain (`Jail.image_command`): bwrap as root,
the slot program chroots into the overlay, drops to the app's uid and execs the command with
the environment from a memfd. A warm slot's mounts were made before its image was known, so
an image never takes one (docs/design/images.md, "Wakes").
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from wakeful.aio.spawn import Child, spawn
from wakeful.domain.models import ImageRecord
from wakeful.node.jail import IsolationUnavailable
from wakeful.node.jail.bwrap import (
    CHAIN_ENV,
    HOSTS,
    Jail,
    image_env_data,
    resolv_conf,
    slot_main,
)
from wakeful.node.jail.jailed import Jailed, memfile
from wakeful.node.jail.netns import SandboxNet, open_sandbox_net
from wakeful.node.jail.tmpfs import fill_app_dir, mount_image_root, mount_sandbox_fs
from wakeful.node.jail.uids import UidTable

from .runtime import Identity, ImageRun, ImageTrees


@dataclass(frozen=True)
class Started:
    """An image sandbox's process, what it holds on the node, and its root there."""

    process: Child
    jailed: Jailed
    root: Path


class ImageStarts:
    """What a runtime needs to start image apps: its jail, its uids and the image cache."""

    def __init__(self, jail: Jail | None, uids: UidTable | None, images: ImageTrees | None):
        self._jail = jail
        self._uids = uids
        self._images = images

    def refusal(self) -> str | None:
        """Why this node cannot run an image app (None: it can)."""
        jail = self._jail
        if jail is None:
            return "this node runs apps unisolated (--isolation=none), and images need isolation"
        if not jail.as_root or self._uids is None:
            return "image apps need a node agent running as root (an overlay root, own uid)"
        if jail.slot_python is None:
            return "no Python 3 is visible to sandboxes here (the image step runs on it)"
        if self._images is None:
            return "this node has no image cache"
        return None

    async def warm(self, image: ImageRecord, app: str) -> None:
        """Unpack `app`'s image into the cache ahead of its first start (`Warming`)."""
        if self.refusal() is None:
            assert self._images is not None and self._uids is not None
            await self._images.tree(image, self._uids.uid(app))

    async def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: Path,
        identity: Identity,
        image: ImageRun,
    ) -> Started:
        """`OSError` with the reason when this node cannot, `ImageError` when the image
        cannot be unpacked; nothing held is left behind either way."""
        refused = self.refusal()
        if refused is not None:
            raise OSError(refused)
        jail, images, uids = self._jail, self._images, self._uids
        assert jail is not None and images is not None and uids is not None
        uid = uids.uid(identity.app)
        lower = await images.acquire(image.record, uid)
        jailed = Jailed(identity.limits, uid)
        jailed.after_tree.append(lambda: images.release(image.record, uid))
        fds: list[int] = []
        try:
            netns = None
            if image.app_port is not None:
                net = await _own_network(image, uids.uid(f"{identity.app}/net"))
                jailed.after_tree.append(net.kill)
                jailed.listening = net.listening
                netns = net.enter_prefix()
            # Shielded: cancelled mid-way, the thread would go on mounting after the release.
            with anyio.CancelScope(shield=True):
                await asyncio.to_thread(self._enter, jail, jailed, workdir, identity, lower)
            assert jailed.mounted is not None
            fds.append(memfile("env", image_env_data(dict(env))))
            seccomp_fd = None
            if jail.seccomp is not None:
                seccomp_fd = memfile("seccomp", jail.seccomp)
                fds.append(seccomp_fd)
            slot_fd = memfile("slot_main", slot_main())
            fds.append(slot_fd)
            etc: dict[str, int] = {}
            for name, data in (("hosts", HOSTS), ("resolv.conf", _resolv())):
                etc[name] = memfile(name, data)
                fds.append(etc[name])  # each closed below, whatever fails after it
            argv = jail.image_command(
                list(command),
                jailed.mounted,
                image.workdir,
                identity.limits,
                uid,
                jailed.cgroup,
                fds[0],
                seccomp_fd,
                slot_fd,
                netns,
                etc,
            )
            process = await spawn(argv, cwd=Path("/"), env=dict(CHAIN_ENV), pass_fds=fds)
        except BaseException:
            jailed.release()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        return Started(process, jailed, jailed.mounted / "root")

    @staticmethod
    def _enter(jail: Jail, jailed: Jailed, workdir: Path, identity: Identity, lower: Path) -> None:
        """The sandbox's bounded tmpfs, the image's overlay on it, its cgroup."""
        assert jailed.uid is not None
        tree = workdir.with_name("fs")
        limits = identity.limits
        mount_sandbox_fs(tree, limits.disk if jail.cgroups else min(limits.disk, limits.memory))
        jailed.mounted = tree
        fill_app_dir(tree, jailed.uid, _nothing)
        mount_image_root(tree, lower)
        if jail.cgroups is not None:
            jail.cgroups.sweep()
            jailed.cgroup = jail.cgroups.sandbox(identity.sandbox_id)
            jailed.cgroup.create(limits)


async def _own_network(image: ImageRun, net_uid: int) -> SandboxNet:
    """The sandbox's network namespace, its node port forwarded to the app's own; the reason
    as an OSError (the sandbox's recorded one) when this machine cannot make it."""
    assert image.app_port is not None
    try:
        return await open_sandbox_net(
            host=image.node_host,
            host_port=image.node_port,
            app_port=image.app_port,
            net_uid=net_uid,
        )
    except IsolationUnavailable as exc:
        raise OSError(f"no network namespace for it: {exc}") from exc


def _resolv() -> bytes:
    """The node's /etc/resolv.conf as an image sandbox gets it (`resolv_conf`); read at each
    start (a resolver change reaches the next sandbox), ~10 µs."""
    try:
        text = Path("/etc/resolv.conf").read_text(errors="replace")
    except OSError:
        text = ""
    return resolv_conf(text)


def _nothing(app: Path, uid: int) -> None:
    """An image app has no files of its own in `app/` (its image is its tree)."""
