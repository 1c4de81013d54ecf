"""An app's secrets on this node: asked for at a sandbox's start, kept in memory only.

Theory of operation:
- The runner asks its `SecretSource` for a sandbox's secrets once, while it prepares that
  sandbox (`SandboxRunner`), after its artifact: the control plane answers only for a sandbox
  recorded on this node and starting (pending or booting), over this node's credential
  (in process under `wakeful up`, `GET /v1/sandboxes/{id}/secrets` elsewhere:
  `wakeful.remote.node.HttpSecrets`, through the control API as artifacts are, so a node
  behind NAT gets them the same way).
- The values live in the start's frame and in the environment `sandbox_env` makes of them,
  handed to the runtime and on to the sandbox in memory only (a memfd for the isolated chain,
  the warm slot's stdin pipe, the child's environment unisolated): never a file of the node,
  a record, a log line or a command line, and dropped once the process is started.
- A source that cannot answer now raises an `OSError`; one that refuses, `SecretsRefused`.
  Either fails the start as an artifact that cannot be fetched does (the sandbox is recorded
  dead and the pool controller places another): an app never starts without its secrets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
"""All a sandbox gets besides its `wakeful.toml` env, its secrets, PORT and HOST: nothing of
the agent's."""


class SecretsRefused(Exception):
    """The control plane will not give this sandbox's secrets to this node (the sandbox is not
    recorded here, or not starting): trying again will not help. Its message names the sandbox,
    never a value."""


class SecretSource(Protocol):
    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        """The secrets of the sandbox's app, by name (empty when it has none). `OSError` when
        they cannot be fetched now, `SecretsRefused` when the control plane refuses."""
        ...


def sandbox_env(
    manifest: Mapping[str, str], secrets: Mapping[str, str], port: int, host: str
) -> dict[str, str]:
    """A sandbox's whole environment: `BASE_ENV`, then its `wakeful.toml` env, then its
    secrets, then PORT and HOST. The control plane refuses a secret the manifest also names;
    should a later manifest name one anyway, the secret (set for the running app by its
    operator) wins. Nothing overrides PORT and HOST: the probe and the ingress reach the app
    there."""
    return {**BASE_ENV, **manifest, **secrets, "PORT": str(port), "HOST": host}
