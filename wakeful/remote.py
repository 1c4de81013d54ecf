"""Artifacts fetched from the control API, for node agents on other machines."""

from __future__ import annotations

import httpx

from deploy.artifacts import ArtifactError, digest_of


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
