"""The one place that speaks to the control API from outside the control plane.

Two kinds of caller:
- the CLI's commands (`wakeful status`, `deploy`, `logs`, ...) through a blocking
  `ControlClient`, whose `Endpoint` `locate` finds: --api, then WAKEFUL_API / WAKEFUL_TOKEN
  (`CliSettings`), then the control file `wakeful up` writes in its data directory;
- a node agent on another machine: `HttpArtifacts` fetches artifacts and `HttpLogSink` pushes
  sandbox output, with a node token (WAKEFUL_NODE_TOKEN: these two calls are all the node role
  may make, `wakeful.activator.roles`). A node only ever calls the control plane, never the
  other way round, so a node behind NAT works.

Every request carries the bearer token, in a header: never in a URL, never in a message.
httpx's exceptions never leave this module: the CLI gets one of

    ControlApiError        a one-line reason the CLI prints before exiting 1
     ├── NoControlPlane    nothing says where the control plane is, or the control file is bad
     ├── ApiUnreachable    no answer: refused, timed out, cut off, not a URL
     └── ApiRefused        an error answer: its status, and the body's error and detail

and a node gets the errors its own interfaces define (`ArtifactError`, `ShipFailed`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import anyio
import httpx
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.domain.artifacts import ArtifactError, ArtifactUnavailable, digest_of
from wakeful.domain.logbatch import BEHIND_HEADER, LogBatch
from wakeful.domain.models import AppState
from wakeful.domain.state import Stale, storable
from wakeful.node.logship import ShipFailed

"""Set on a logs answer when some of the app's output has not reached the control plane."""


class ControlApiError(Exception):
    """Talking to the control API failed; the message is one line a person can act on."""


class NoControlPlane(ControlApiError):
    pass


class ApiUnreachable(ControlApiError):
    pass


class ApiRefused(ControlApiError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"the control plane answered {status}: {reason}")
        self.status = status
        self.reason = reason


class CliSettings(BaseSettings):
    """How CLI commands find a control plane: flags, then WAKEFUL_API/WAKEFUL_TOKEN, then the
    control file `wakeful up` writes in its data directory."""

    model_config = SettingsConfigDict(env_prefix="WAKEFUL_", extra="ignore")
    api: str | None = None
    token: SecretStr | None = None


@dataclass(frozen=True)
class Endpoint:
    """Where the control API is, and the bearer token it wants."""

    api: str
    """One URL; for a node or an ingress, possibly several, comma-separated: every activator
    that may lead (`apis`)."""
    token: str = field(repr=False)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def apis(self) -> list[str]:
        return [url.strip() for url in self.api.split(",") if url.strip()]


def locate(settings: CliSettings, control_file: Path, api: str | None = None) -> Endpoint:
    """`api` (the --api flag) over WAKEFUL_API; WAKEFUL_TOKEN; whatever is still missing comes
    from `control_file`."""
    api = api or settings.api
    token = settings.token.get_secret_value() if settings.token else None
    if api is None or token is None:
        recorded = _read_control_file(control_file)
        # The recorded token goes only to the recorded control plane: never to an address
        # given elsewhere, which could be anyone's.
        if recorded is not None and api in (None, recorded.api):
            api = recorded.api
            token = token or recorded.token
    if api is None or token is None:
        if api is None and token is None:
            missing = "start `wakeful up`, or pass --api and set WAKEFUL_TOKEN"
        elif token is None:
            missing = f"set WAKEFUL_TOKEN for {api}"
        else:
            missing = "pass --api or set WAKEFUL_API"
        raise NoControlPlane(
            f"no running control plane found: {control_file} does not exist; {missing}"
        )
    return Endpoint(api, token)


def _read_control_file(path: Path) -> Endpoint | None:
    try:
        recorded = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NoControlPlane(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise NoControlPlane(f"{path}: not JSON ({exc}); is it from `wakeful up`?") from None
    if not isinstance(recorded, dict) or not all(
        isinstance(recorded.get(key), str) for key in ("api", "token")
    ):
        raise NoControlPlane(f"{path}: expected the strings `api` and `token` in it")
    return Endpoint(recorded["api"], recorded["token"])


def _segment(name: str) -> str:
    """A name as one path segment: a `?` or `#` in it cannot cut the path short."""
    return quote(name, safe="")


@dataclass(frozen=True)
class AppLogs:
    lines: list[str]
    behind: str
    """Why lines may be missing (nodes not heard from lately), or "" when none are."""


class ControlClient:
    """The control API for the CLI: blocking, one connection pool per command. Every call goes
    through `_send`, where httpx's errors and error answers become `ControlApiError`s."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._apis = endpoint.apis or [endpoint.api]
        """Every activator the endpoint names; calls go to the one that answered last."""
        self._at = 0
        for api in self._apis:
            try:
                httpx.URL(api).copy_with(path="/")
            except (httpx.InvalidURL, TypeError) as exc:
                raise ApiUnreachable(f"{api!r} is not a control API URL: {exc}") from None
        self._http = httpx.Client(headers=endpoint.headers(), timeout=timeout, transport=transport)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the calls the commands make ------------------------------------------------------

    def put_artifact(self, digest: str, data: bytes) -> None:
        self._send("PUT", f"/v1/artifacts/{_segment(digest)}", content=data)

    def start_deploy(self, definition: dict[str, Any], digest: str) -> Any:
        return self._json(
            "POST", "/v1/deploys", json={"definition": definition, "artifact": digest}
        )

    def rollout(self, app: str, version: str) -> Any:
        return self._json("GET", f"/v1/deploys/{_segment(app)}/{_segment(version)}")

    def rollback(self, app: str) -> Any:
        return self._json("POST", f"/v1/apps/{_segment(app)}/rollback")

    def delete_app(self, app: str) -> Any:
        return self._json("DELETE", f"/v1/apps/{_segment(app)}")

    def pools(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/pools"))

    def apps(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/apps"))

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/nodes"))

    def release_state(self, app: str) -> Any:
        return self._json("POST", f"/v1/apps/{_segment(app)}/state/release")

    def node(self, node: str) -> Any:
        return self._json("GET", f"/v1/nodes/{_segment(node)}")

    def drain(self, node: str, *, evacuate: bool, force: bool) -> None:
        params = {"evacuate": evacuate, "force": force}
        self._send("POST", f"/v1/nodes/{_segment(node)}/drain", params=params)

    def undrain(self, node: str) -> None:
        self._send("DELETE", f"/v1/nodes/{_segment(node)}/drain")

    def tokens(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/tokens"))

    def create_token(self, name: str, role: str) -> Any:
        return self._json("POST", "/v1/tokens", json={"name": name, "role": role})

    def rotate_token(self, name: str) -> Any:
        return self._json("POST", f"/v1/tokens/{_segment(name)}/rotate")

    def revoke_token(self, name: str) -> bool:
        """True when the control plane refuses the secret already."""
        answer = self._send("DELETE", f"/v1/tokens/{_segment(name)}")
        return bool(answer.json().get("effective", True))

    def app_logs(self, app: str, tail: int) -> AppLogs:
        answer = self._send("GET", f"/v1/apps/{_segment(app)}/logs", params={"tail": tail})
        # One line per "\n" (str.splitlines would also split at \f, \x1c, \u2028...).
        lines = answer.text.split("\n")
        if lines[-1] == "":  # the newline that ends the last line
            lines.pop()
        return AppLogs(lines, answer.headers.get(BEHIND_HEADER, ""))

    # -- the boundary ---------------------------------------------------------------------

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = self._send(method, path, **kwargs)
        if not answer.content:
            return None
        try:
            return answer.json()
        except ValueError:
            raise ControlApiError(
                f"{self.endpoint.api} answered {method} {path} with no JSON: "
                f"{answer.text[:100]!r}; is it a wakeful control API?"
            ) from None

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call, on the activator that leads among those named: one that refuses the
        connection, or answers that it stands by, did nothing, so the call goes to the next.
        Only the URLs the endpoint names are tried (the token goes nowhere else)."""
        failed: ControlApiError | None = None
        for _ in self._apis:
            api = self._apis[self._at]
            try:
                answer = self._http.request(method, api.rstrip("/") + path, **kwargs)
            except httpx.ConnectError as exc:
                failed = ApiUnreachable(f"cannot reach the control plane at {api}: {exc}")
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise ApiUnreachable(f"cannot reach the control plane at {api}: {exc}") from None
            else:
                if answer.is_success:
                    return answer
                failed = ApiRefused(answer.status_code, _reason(answer))
                if not _standing_by(answer):
                    raise failed
            self._at = (self._at + 1) % len(self._apis)
        assert failed is not None
        raise failed


def _standing_by(answer: httpx.Response) -> bool:
    if answer.status_code != 503:
        return False
    try:
        return bool(answer.json().get("error") == "standby")
    except (ValueError, AttributeError):
        return False


def _reason(answer: httpx.Response) -> str:
    """An error answer in one line: the control API's `{"error", "detail"}` body, else text."""
    try:
        body = answer.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        return f"{body['error']}: {body.get('detail')}"
    if isinstance(body, dict) and "detail" in body:  # FastAPI's own answers (an unknown route)
        return str(body["detail"])
    return " ".join(answer.text.split())[:300]  # a proxy's HTML page, say: on one line


# -- what a node on another machine needs of the control plane -------------------------------


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
            answer = await self._client.get(await self._url(f"/v1/artifacts/{_segment(digest)}"))
        except httpx.HTTPError as exc:
            raise ArtifactUnavailable(
                f"cannot fetch {digest} from the control API: {exc!r}"
            ) from exc
        _raise_for(answer, 200, digest)
        if await anyio.to_thread.run_sync(digest_of, answer.content) != digest:
            raise ArtifactError(f"artifact {digest} arrived corrupt")
        return answer.content


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
        path = f"/v1/states/{_segment(app)}/archives/{_segment(digest)}"
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
        path = f"/v1/states/{_segment(app)}/{verb}"
        answer = await self._call("POST", path, what, json=body, timeout=WRITE_TIMEOUT)
        if answer.status_code == 200:
            try:
                return AppState.model_validate_json(answer.content)
            except ValueError as exc:
                raise ArtifactUnavailable(f"{verb} of {what}: an answer that is no state") from exc
        if answer.status_code == 409:
            return Stale(_reason(answer))
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
    text = f"control API answered {answer.status_code} for {digest}: {_reason(answer)}"
    if 400 <= answer.status_code < 500 and answer.status_code not in (408, 429):
        raise ArtifactError(text)
    raise ArtifactUnavailable(text)


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
            raise ShipFailed(f"the control API answered {answer.status_code}: {_reason(answer)}")
