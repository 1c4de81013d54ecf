"""An ingress's `CertSource` (`wakeful.ingress.acme`): `GET /v1/certs/served` with the ingress
token, from the leading activator. The answer (certificates and their private keys) is read
into memory and nowhere else: no error raised here carries a byte of it."""

from __future__ import annotations

import httpx

from wakeful.ingress.acme import ServedPair

from .node import _NodeClient
from .wire import reason

FIELDS = ("name", "chain", "key", "serial")


class CertsUnavailable(Exception):
    """The control plane did not answer with certificates now; the feed asks again."""


class HttpCerts(_NodeClient):
    async def served(self) -> list[ServedPair]:
        try:
            answer = await self._client.get(await self._url("/v1/certs/served"))
        except httpx.HTTPError as exc:
            raise CertsUnavailable(f"cannot reach the control API: {exc!r}") from None
        if answer.status_code != 200:
            raise CertsUnavailable(f"control API answered {answer.status_code}: {reason(answer)}")
        try:
            body = answer.json()
        except ValueError:
            body = None
        pairs = []
        for entry in body if isinstance(body, list) else [None]:
            if not isinstance(entry, dict) or not all(
                isinstance(entry.get(field), str) for field in FIELDS
            ):
                raise CertsUnavailable("control API answered certificates of another shape")
            pairs.append(ServedPair(*(entry[field] for field in FIELDS)))
        return pairs
