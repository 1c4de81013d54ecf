"""What a node agent on another machine needs of the control plane: its artifacts
(`HttpArtifacts`), the states it holds stored and released (`HttpKeeper`), its sandboxes'
secrets at their start (`HttpSecrets`) and their output pushed (`HttpLogSink`), with a node
token (WAKEFUL_NODE_TOKEN: these calls are all the node role may make,
`wakeful.activator.roles`).

A node only ever calls the control plane, never the other way round, so a node behind NAT
works. Each client asks `locate` where the leading activator is before each call. httpx's
exceptions never leave this module: a node gets the errors its own interfaces define
(`ArtifactError`, `ArtifactUnavailable`, `SecretsUnavailable`, `SecretsRefused`,
`ShipFailed`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self

import anyio
import httpx

from wakeful.domain.artifacts import ArtifactError, ArtifactUnavailable, digest_of
from wakeful.domain.logbatch import LogBatch, ShipFailed
from wakeful.domain.models import AppState
from wakeful.domain.state import Stale, storable
from wakeful.node.secrets import SecretsRefused

from .wire import Endpoint, reason, segment


class _NodeClient:
    """One long-lived async client with the bearer token; closed on leaving the context.
    `locate`: where the leading activator is now, asked before each call (`api` when None)."""

    def __init__(
        self,
        api: str,
        token: str,
        timeout: float,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        self._api = api.rstrip("/")
        self._locate = locate
        self._client = httpx.AsyncClient(headers=Endpoint(api, token).headers(), timeout=timeout)

    async def _url(self, path: str) -> str:
        base = self._api if self._locate is None else (await self._locate()).rstrip("/")
        return base + path

    async def whoami(self) -> tuple[str, str] | str | None:
        """Who the control API takes this client's token for, asked once at a piece's start
        (`GET /v1/whoami`): its (name, role); the refusal, as a line, for a token it refuses
        (401); None when it cannot answer now (the piece starts anyway, and its calls are
        tried again as the store's outages are, invariant 19), or answers something else (a
        control plane older than the route)."""
        try:
            answer = await self._client.get(await self._url("/v1/whoami"))
        except (httpx.HTTPError, OSError):
            return None
        if answer.status_code in (401, 403):
            return f"the control API refused its token ({answer.status_code}): {reason(answer)}"
        try:
            body = answer.json() if answer.status_code == 200 else None
        except ValueError:
            body = None
        if not isinstance(body, dict) or not all(
            isinstance(body.get(field), str) for field in ("name", "role")
        ):
            return None
        return body["name"], body["role"]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()


class HttpArtifacts(_NodeClient):
    """A node's `Artifacts`: fetched whole, checked against their digest."""

    def __init__(
        self,
        api: str,
        token: str,
        timeout: float = 120.0,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        super().__init__(api, token, timeout, locate)

    async def fetch(self, digest: str) -> bytes:
        """`ArtifactUnavailable` when the control API cannot answer now; `ArtifactError` when
        it has no such artifact or the bytes are not it."""
        try:
            answer = await self._client.get(await self._url(f"/v1/artifacts/{segment(digest)}"))
        except httpx.HTTPError as exc:
            raise ArtifactUnavailable(
                f"cannot fetch {digest} from the control API: {exc!r}"
            ) from exc
        _raise_for(answer, 200, digest)
        if await anyio.to_thread.run_sync(digest_of, answer.content) != digest:
            raise ArtifactError(f"artifact {digest} arrived corrupt")
        return answer.content


class HttpBlobs(_NodeClient):
    """A node's `BlobSource` (`wakeful.node.images`): an image's blobs, streamed by digest from
    the control plane (which pulled them at deploy), so a node needs no route to a registry.
    The image cache checks each blob's sha256 as it writes it. `ArtifactUnavailable` when the
    control API cannot answer now, `ArtifactError` when it has no such blob."""

    def __init__(
        self,
        api: str,
        token: str,
        timeout: float = 60.0,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        super().__init__(api, token, timeout, locate)

    async def chunks(self, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes as they arrive (`timeout`: between two reads, not for the whole)."""
        try:
            url = await self._url(f"/v1/blobs/{segment(digest)}")
            async with self._client.stream("GET", url) as answer:
                if answer.status_code != 200:
                    await answer.aread()
                    _raise_for(answer, 200, digest)
                async for chunk in answer.aiter_bytes(1 << 20):
                    yield chunk
        except httpx.HTTPError as exc:
            raise ArtifactUnavailable(
                f"cannot fetch {digest} from the control API: {exc!r}"
            ) from exc


WRITE_TIMEOUT = 30.0
"""Seconds a release or a keep may take: a small write, unlike an upload (`timeout`)."""


class HttpKeeper(_NodeClient):
    """A node's `Keeper` (`wakeful.node.state.hold`): the states it holds, stored and released
    through the control API, which checks each against the record (`wakeful.deploy.states`).
    `ArtifactUnavailable` when the control API cannot answer now (the node keeps what it has
    and tries again), `ArtifactError` when a call is refused for good."""

    def __init__(
        self,
        api: str,
        token: str,
        node: str,
        timeout: float = 120.0,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        super().__init__(api, token, timeout, locate)
        self._node = node

    async def store(self, app: str, epoch: int, data: bytes, digest: str) -> None:
        path = f"/v1/states/{segment(app)}/archives/{segment(digest)}"
        answer = await self._call(
            "PUT", path, digest, content=data, params={"node": self._node, "epoch": epoch}
        )
        _raise_for(answer, 201, digest)

    async def release(
        self,
        app: str,
        epoch: int,
        *,
        archive: str | None = None,
        size: int = 0,
        error: str = "",
        sandbox_at: tuple[str, int] | None = None,
    ) -> AppState | Stale | None:
        body: dict[str, Any] = {
            "node": self._node,
            "epoch": epoch,
            "archive": archive,
            "size": size,
            "error": storable(error),
        }
        if sandbox_at is not None:
            body["sandbox"] = {"id": sandbox_at[0], "revision": sandbox_at[1]}
        return await self._write(app, "release", body)

    async def keep(
        self, app: str, epoch: int, error: str, *, for_good: bool = True
    ) -> AppState | Stale | None:
        body = {"node": self._node, "epoch": epoch, "error": storable(error), "for_good": for_good}
        return await self._write(app, "keep", body)

    async def _write(self, app: str, verb: str, body: dict[str, Any]) -> AppState | Stale | None:
        """200: what was written; 409: the refusal (`Stale`, nothing written); 404 or 412:
        None (the record is gone, or the sandbox moved on)."""
        what = f"the state of {app}"
        path = f"/v1/states/{segment(app)}/{verb}"
        answer = await self._call("POST", path, what, json=body, timeout=WRITE_TIMEOUT)
        if answer.status_code == 200:
            try:
                return AppState.model_validate_json(answer.content)
            except ValueError as exc:
                raise ArtifactUnavailable(f"{verb} of {what}: an answer that is no state") from exc
        if answer.status_code == 409:
            return Stale(reason(answer))
        if answer.status_code in (404, 412):
            return None
        _raise_for(answer, 200, what)
        return None

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._client.request(method, await self._url(path), **kwargs)
        except httpx.HTTPError as exc:
            raise ArtifactUnavailable(f"cannot reach the control API for {what}: {exc!r}") from exc


def _raise_for(answer: httpx.Response, expected: int, digest: str) -> None:
    """A refusal (4xx but 408 and 429) is for good; anything else unexpected may pass."""
    if answer.status_code == expected:
        return
    text = f"control API answered {answer.status_code} for {digest}: {reason(answer)}"
    if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
        raise ArtifactError(text)
    raise ArtifactUnavailable(text)


class SecretsUnavailable(OSError):
    """The control API cannot answer for a sandbox's secrets now: the start fails and the
    sandbox is placed again, as for an artifact that cannot be fetched."""


class HttpSecrets(_NodeClient):
    """A node's `SecretSource` (`wakeful.node.secrets`): `GET /v1/sandboxes/{id}/secrets`,
    answered only for a sandbox recorded on this node (`node`, the one its token is named
    after) and starting. The answer is read into memory and nowhere else: no error this
    raises, nor any it chains, carries a byte of it (pydantic's and httpx's would)."""

    def __init__(
        self,
        api: str,
        token: str,
        node: str,
        timeout: float = 30.0,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        super().__init__(api, token, timeout, locate)
        self._node = node

    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        what = f"the secrets of sandbox {sandbox_id}"
        try:
            url = await self._url(f"/v1/sandboxes/{segment(sandbox_id)}/secrets")
            answer = await self._client.get(url)
        except httpx.HTTPError as exc:
            raise SecretsUnavailable(f"cannot reach the control API for {what}: {exc!r}") from exc
        if answer.status_code in (403, 404):  # not this node's, not starting, or gone
            raise SecretsRefused(f"{what} on node {self._node}: {reason(answer)}")
        if answer.status_code != 200:  # an error's body holds no value
            text = f"control API answered {answer.status_code} for {what}: {reason(answer)}"
            raise SecretsUnavailable(text)
        env = _secret_env(answer)
        if env is None:
            raise SecretsUnavailable(f"control API answered {what} with no environment")
        return env


def _secret_env(answer: httpx.Response) -> dict[str, str] | None:
    """`env` of `{"generation": g, "env": {name: value}}`, every name and value a string;
    None for anything else (and no parser's error, which would quote what it read)."""
    try:
        body = answer.json()
    except ValueError:
        return None
    env = body.get("env") if isinstance(body, dict) else None
    if not isinstance(env, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return env


class HttpLogSink(_NodeClient):
    """A node's `LogSink`: each batch is one `POST /v1/logs`. httpx's errors and refusals
    become `ShipFailed`, so the shipper keeps the output and tries again."""

    def __init__(
        self,
        api: str,
        token: str,
        timeout: float = 10.0,
        locate: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        super().__init__(api, token, timeout, locate)

    async def ship(self, batch: LogBatch) -> None:
        try:
            answer = await self._client.post(
                await self._url("/v1/logs"),
                content=batch.model_dump_json(),
                headers={"Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise ShipFailed(f"cannot reach the control API: {exc!r}") from exc
        if answer.status_code != 204:
            raise ShipFailed(f"the control API answered {answer.status_code}: {reason(answer)}")
