"""The control plane's own use of the deployer, without the HTTP API: `deploy_dir` deploys an
app directory from this process (`wakeful up`'s), and `resume_rollouts` carries on what a
previous leader left under way when this control plane starts leading."""

from __future__ import annotations

import logging

import anyio
import anyio.abc
import anyio.to_thread

from wakeful.aio.backoff import retry
from wakeful.aio.packing import pack
from wakeful.deploy.appdir import AppDir
from wakeful.deploy.artifacts import LocalArtifacts
from wakeful.deploy.images import Images
from wakeful.deploy.rollout import Phase
from wakeful.deploy.service import Deployer
from wakeful.domain.backoff import Backoff
from wakeful.oci import ImageRefused
from wakeful.store import StoreError

log = logging.getLogger(__name__)

RESUME_BACKOFF = Backoff(0.5, cap=5.0)
"""Between tries to list the rollouts under way while the store is away."""


async def deploy_dir(
    deployer: Deployer,
    artifacts: LocalArtifacts,
    tasks: anyio.abc.TaskGroup,
    app_dir: AppDir,
    images: Images | None = None,
) -> str:
    """Pack `app_dir`, store its artifact and deploy it (no HTTP round trip); its rollout runs
    in `tasks`. An image app's image is imported instead (its archive read where it lies, or
    the image `wakeful up` built, from its layout in the build cache).
    Returns the rollout's message."""
    image, digest = app_dir.definition.spec.image, None
    record = None
    prebuilt = app_dir.prebuilt
    if image is None:
        data = await anyio.to_thread.run_sync(pack, app_dir.path)
        digest = await artifacts.put(data)
    elif images is None:
        raise ImageRefused(f"image {image}: this control plane has no image store")
    elif prebuilt is not None:
        record = await images.import_local(image, prebuilt.layout, prebuilt.manifest)
    else:
        record = await images.pull(image, app_dir.archive)
    rollout = await deployer.prepare(app_dir.definition, digest, record, app_dir.made)
    if rollout.phase is Phase.ROLLING:
        tasks.start_soon(deployer.roll_out, rollout)
    return rollout.message


async def resume_rollouts(deployer: Deployer, tasks: anyio.abc.TaskGroup) -> None:
    """Carry on the rollouts a previous leader left under way, each in `tasks`; a store away
    is waited out."""

    def failed(exc: Exception, pause: float) -> None:
        log.warning("could not list the rollouts under way (retrying): %s", exc)

    resumed = await retry(deployer.resume, RESUME_BACKOFF, errors=(StoreError,), failed=failed)
    for rollout in resumed:
        tasks.start_soon(deployer.roll_out, rollout)
