"""The CLI's client of the control API: how a command finds the control plane, and the calls
it makes.

The commands (`wakeful status`, `deploy`, `logs`, ...) talk through a blocking
`ControlClient`, whose `Endpoint` `locate` finds: --api, then WAKEFUL_API / WAKEFUL_TOKEN
(`CliSettings`), then the control file `wakeful up` writes in its data directory. Every call
goes to the activator that leads among those the endpoint names, and nowhere else.

httpx's exceptions never leave this module: the CLI gets one of

    ControlApiError        a one-line reason the CLI prints before exiting 1
     ├── NoControlPlane    nothing says where the control plane is, or the control file is bad
     ├── ApiUnreachable    no answer: refused, timed out, cut off, not a URL
     └── ApiRefused        an error answer: its status, and the body's error and detail
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from wakeful.domain.logbatch import BEHIND_HEADER

from .wire import Endpoint, reason, segment


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
    if api is not None and token is None:  # a control plane named, and no token for it
        raise NoControlPlane(
            f"no token for {api}: set WAKEFUL_TOKEN (`wakeful up`'s admin token is in its "
            f"data directory's `token` file; {control_file} gives it only for its own API)"
        )
    if api is None or token is None:
        missing = (
            "start `wakeful up`, or pass --api and set WAKEFUL_TOKEN"
            if token is None
            else "pass --api or set WAKEFUL_API"
        )
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


@dataclass(frozen=True)
class AppLogs:
    records: Iterator[dict[str, Any]]
    """The lines as the log directory holds them (`docs/design/logs.md`), oldest first, as
    they arrive: the answer is streamed, never held whole."""
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
        self._send("PUT", f"/v1/artifacts/{segment(digest)}", content=data)

    def start_deploy(
        self,
        definition: dict[str, Any],
        digest: str | None,
        image_archive: str | None = None,
        *,
        image_manifest: str | None = None,
        made: str | None = None,
        canary: int = 0,
        ramp: float = 0.0,
        keep_split: bool = False,
    ) -> Any:
        """An image app's deploy pulls its image first: the call may take as long as the
        control plane's pull timeout."""
        body = {
            "definition": definition,
            "artifact": digest,
            "image_archive": image_archive,
            "image_manifest": image_manifest,
            "made": made,
            "canary": canary,
            "ramp": ramp,
            "keep_split": keep_split,
        }
        return self._json("POST", "/v1/deploys", json=body, timeout=IMAGE_DEPLOY_TIMEOUT)

    def missing_blobs(self, digests: Sequence[str]) -> list[str]:
        """Those of `digests` the control plane's image store lacks."""
        answer = self._json("POST", "/v1/images/blobs/missing", json={"blobs": list(digests)})
        return [str(digest) for digest in answer["missing"]]

    def put_blob(self, digest: str, path: Path) -> None:
        """Stream one blob of a built image to the control plane's image store."""
        route = f"/v1/images/blobs/{segment(digest)}"
        self._send("PUT", route, body=lambda: _chunks(path), timeout=IMAGE_DEPLOY_TIMEOUT)

    def put_image_archive(self, path: Path) -> str:
        """Stream an image archive (`podman save`, `docker save`) to the control plane; the
        name it keeps it under for the deploy that follows."""
        answer = self._json(
            "PUT", "/v1/images/archives", body=lambda: _chunks(path), timeout=IMAGE_DEPLOY_TIMEOUT
        )
        return str(answer["archive"])

    def rollout(self, app: str, version: str) -> Any:
        return self._json("GET", f"/v1/deploys/{segment(app)}/{segment(version)}")

    def routed(self, app: str, within: float) -> Any:
        """Waits up to `within` seconds (the request's timeout covers it)."""
        return self._json(
            "GET", f"/v1/apps/{segment(app)}/routed", params={"within": within}, timeout=within + 10
        )

    def rollback(self, app: str) -> Any:
        return self._json("POST", f"/v1/apps/{segment(app)}/rollback")

    def traffic(self, app: str) -> Any:
        return self._json("GET", f"/v1/apps/{segment(app)}/traffic")

    def set_traffic(self, app: str, split: Sequence[str]) -> Any:
        return self._json("PUT", f"/v1/apps/{segment(app)}/traffic", json={"split": list(split)})

    def promote(self, app: str) -> Any:
        return self._json("POST", f"/v1/apps/{segment(app)}/promote")

    def tag(self, app: str, tag: str, version: str) -> Any:
        route = f"/v1/apps/{segment(app)}/tags/{segment(tag)}"
        return self._json("PUT", route, json={"version": version})

    def untag(self, app: str, tag: str) -> Any:
        return self._json("DELETE", f"/v1/apps/{segment(app)}/tags/{segment(tag)}")

    def delete_app(self, app: str) -> Any:
        return self._json("DELETE", f"/v1/apps/{segment(app)}")

    def pools(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/pools"))

    def apps(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/apps"))

    def nodes(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/nodes"))

    def release_state(self, app: str) -> Any:
        return self._json("POST", f"/v1/apps/{segment(app)}/state/release")

    def node(self, node: str) -> Any:
        return self._json("GET", f"/v1/nodes/{segment(node)}")

    def drain(self, node: str, *, evacuate: bool, force: bool) -> None:
        params = {"evacuate": evacuate, "force": force}
        self._send("POST", f"/v1/nodes/{segment(node)}/drain", params=params)

    def undrain(self, node: str) -> None:
        self._send("DELETE", f"/v1/nodes/{segment(node)}/drain")

    def certs(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/certs"))

    def tokens(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/tokens"))

    def create_token(self, name: str, role: str) -> Any:
        return self._json("POST", "/v1/tokens", json={"name": name, "role": role})

    def rotate_token(self, name: str) -> Any:
        return self._json("POST", f"/v1/tokens/{segment(name)}/rotate")

    def revoke_token(self, name: str) -> bool:
        """True when the control plane refuses the secret already."""
        answer = self._send("DELETE", f"/v1/tokens/{segment(name)}")
        return bool(answer.json().get("effective", True))

    def set_secrets(self, app: str, values: Mapping[str, str], *, restart: bool) -> Any:
        """The values go in the body only (never a URL, never a log line)."""
        body = {"values": dict(values), "restart": restart}
        return self._json("POST", f"/v1/apps/{segment(app)}/secrets", json=body)

    def unset_secrets(self, app: str, names: Sequence[str], *, restart: bool) -> Any:
        body = {"names": list(names), "restart": restart}
        return self._json("POST", f"/v1/apps/{segment(app)}/secrets/unset", json=body)

    def secrets(self, app: str) -> Any:
        return self._json("GET", f"/v1/apps/{segment(app)}/secrets")

    def rotate_secrets_key(self) -> Any:
        return self._json("POST", "/v1/secrets/keys")

    def retire_secrets_key(self, key_id: str) -> Any:
        return self._json("DELETE", f"/v1/secrets/keys/{segment(key_id)}")

    def registry_login(self, host: str, username: str, password: str) -> Any:
        """The password goes in the body only (never a URL, never a log line)."""
        body = {"username": username, "password": password}
        return self._json("PUT", f"/v1/registries/{segment(host)}", json=body)

    def registry_logout(self, host: str) -> Any:
        return self._json("DELETE", f"/v1/registries/{segment(host)}")

    def registries(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/v1/registries"))

    @contextlib.contextmanager
    def app_logs(self, app: str, **query: object) -> Iterator[AppLogs]:
        """The app's lines, streamed while the `with` lasts. `query`: the API's (`tail`,
        `since`, `until`, `grep`, `sandbox`, `version`, `kind`); None values are left out."""
        params = {k: v for k, v in query.items() if v is not None} | {"format": "json"}
        answer = self._send("GET", f"/v1/apps/{segment(app)}/logs", params=params, stream=True)
        try:
            yield AppLogs(_records(answer), answer.headers.get(BEHIND_HEADER, ""))
        finally:
            answer.close()

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

    def _send(
        self,
        method: str,
        path: str,
        body: Callable[[], Iterator[bytes]] | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """One call, on the activator that leads among those named: one that refuses the
        connection, or answers that it stands by, did nothing, so the call goes to the next
        (a streamed `body` from its start again). Only the URLs the endpoint names are tried
        (the token goes nowhere else). `stream`: a success is returned unread (its caller
        closes it)."""
        failed: ControlApiError | None = None
        for _ in self._apis:
            api = self._apis[self._at]
            if body is not None:
                kwargs["content"] = body()
            try:
                request = self._http.build_request(method, api.rstrip("/") + path, **kwargs)
                answer = self._http.send(request, stream=stream)
                if stream and not answer.is_success:
                    answer.read()  # the reason is in the body
                    answer.close()
            except httpx.ConnectError as exc:
                failed = ApiUnreachable(f"cannot reach the control plane at {api}: {exc}")
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise ApiUnreachable(f"cannot reach the control plane at {api}: {exc}") from None
            else:
                if answer.is_success:
                    return answer
                failed = ApiRefused(answer.status_code, reason(answer))
                if not _standing_by(answer):
                    raise failed
            self._at = (self._at + 1) % len(self._apis)
        assert failed is not None
        raise failed


IMAGE_DEPLOY_TIMEOUT = 900.0
"""Seconds an image deploy's calls may take: the control plane's pull (600 s by default) and
an archive's upload."""


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            yield chunk


def _standing_by(answer: httpx.Response) -> bool:
    if answer.status_code != 503:
        return False
    try:
        return bool(answer.json().get("error") == "standby")
    except (ValueError, AttributeError):
        return False


def _records(answer: httpx.Response) -> Iterator[dict[str, Any]]:
    """The records of a streamed logs answer, one per line (JSON escapes every control
    character, so a line ends only at a newline)."""
    rest = b""
    try:
        for data in answer.iter_bytes():
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                if line:
                    yield _record(line)
    except httpx.HTTPError as exc:
        raise ApiUnreachable(f"the logs answer was cut short: {exc}") from None
    if rest:
        yield _record(rest)


def _record(line: bytes) -> dict[str, Any]:
    try:
        found = json.loads(line)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise ControlApiError(f"the logs answer held a line that is not a record: {line[:80]!r}")
    return found
