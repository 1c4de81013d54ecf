"""The control API as seen by node agents on other machines: artifacts are fetched from
it, sandbox output is pushed to it. A node only ever calls the control plane, never the
other way round, so a node behind NAT works."""

from __future__ import annotations

import httpx

from wakeful.domain.artifacts import ArtifactError, digest_of
from wakeful.domain.logbatch import LogBatch
from wakeful.node.logship import ShipFailed


class HttpArtifacts:
    def __init__(self, api: str, token: str) -> None:
        self._client = httpx.AsyncClient(
            base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=120
        )

    async def fetch(self, digest: str) -> bytes:
        answer = await self._client.get(f"/v1/artifacts/{digest}")
        if answer.status_code != 200:
            raise ArtifactError(f"control API answered {answer.status_code} for {digest}")
        if digest_of(answer.content) != digest:
            raise ArtifactError(f"artifact {digest} arrived corrupt")
        return answer.content

    async def __aenter__(self) -> HttpArtifacts:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()


class HttpLogSink:
    """A node's `LogSink`: each batch is one `POST /v1/logs`. httpx's errors and refusals
    become `ShipFailed`, so the shipper keeps the output and tries again."""

    def __init__(self, api: str, token: str, timeout: float = 10.0) -> None:
        self._client = httpx.AsyncClient(
            base_url=api, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    async def ship(self, batch: LogBatch) -> None:
        try:
            answer = await self._client.post(
                "/v1/logs",
                content=batch.model_dump_json(),
                headers={"Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise ShipFailed(f"cannot reach the control API: {exc!r}") from exc
        if answer.status_code != 204:
            raise ShipFailed(f"the control API answered {answer.status_code}: {answer.text[:300]}")

    async def __aenter__(self) -> HttpLogSink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()
