"""The upstream transport: the one place the proxy path touches an HTTP client library.

`Transport.send` is the whole interface. `AiohttpTransport` holds one long-lived aiohttp
session with explicit limits and timeouts; every aiohttp exception becomes one of ours here
(see `ingress.errors`), so nothing above this module knows which client library runs.
The response body streams: nothing here reads a whole body into memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from yarl import URL

from wakeful.ingress.errors import ConnectFailed, UpstreamError, UpstreamFailed, UpstreamTimeout


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    method: str
    url: str
    """The sandbox's base URL (from a lease) plus the request target, already encoded."""
    headers: Sequence[tuple[str, str]]
    body: AsyncIterable[bytes] | None
    timeout: float
    """Seconds the sandbox may stay silent: before its answer starts, and between reads."""


class UpstreamResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]: ...

    def body(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises UpstreamFailed / UpstreamTimeout."""
        ...

    def close(self) -> None:
        """Give the connection back (kept alive if the body was read to the end)."""
        ...


class Transport(Protocol):
    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send the request and return once the response head has arrived.

        Raises ConnectFailed when nothing reached the sandbox (safe to retry elsewhere),
        UpstreamFailed when the exchange broke after that, UpstreamTimeout when it went quiet.
        """
        ...


def translate(exc: BaseException) -> UpstreamError:
    """aiohttp's exception tree, mapped onto ours."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        # Raised while connecting: the request was never written.
        return ConnectFailed(f"could not connect: {exc.os_error or exc}")
    if isinstance(exc, TimeoutError):  # ServerTimeoutError is one too
        return UpstreamTimeout(f"the sandbox stayed silent: {exc or 'timeout'}")
    return UpstreamFailed(f"{type(exc).__name__}: {exc}")


class _AiohttpResponse:
    """The response, and its body as an async iterator of whatever has arrived.

    Each step returns what aiohttp has buffered (at most its read buffer, since reading from
    the sandbox pauses past that), so memory stays bounded. A plain iterator class, not an
    async generator: no generator frame, no loop async-generator hooks, per response.
    """

    __slots__ = ("_complete", "_content", "_response", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._content = response.content
        self._complete = False
        self.status = response.status
        self.headers = response.raw_headers

    def body(self) -> AsyncIterator[bytes]:
        return self

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._content.readany()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise translate(exc) from exc
        if not chunk:
            self._complete = True
            raise StopAsyncIteration
        return chunk

    def close(self) -> None:
        if self._complete:
            self._response.release()
        else:
            self._response.close()  # unread bytes make the connection unusable: drop it


class AiohttpTransport:
    def __init__(self, *, connect_timeout: float, max_connections: int, keepalive: float) -> None:
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._keepalive = keepalive
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        """One ClientTimeout per request timeout in use (a handful: the default and the
        per-app overrides), not one per request."""

    async def __aenter__(self) -> AiohttpTransport:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections,
            limit_per_host=0,
            keepalive_timeout=self._keepalive,
            use_dns_cache=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),  # cookies belong to the client, not to us
            auto_decompress=False,  # bytes pass through as the sandbox sent them
            trust_env=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
        )
        # aiohttp re-sends idempotent requests once when the connection drops, even after
        # the sandbox read them. Bytes that reached a sandbox are never sent twice (the
        # proxy retries only ConnectFailed), so that retry is off; the keep-alive timeout
        # stays under common servers' idle timeouts so a pooled connection is rarely stale.
        self._session._retry_connection = False
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        if self._session is None:
            raise UpstreamFailed("the upstream transport is closed")
        timeout = self._timeouts.get(request.timeout)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._connect_timeout, sock_read=request.timeout
            )
            self._timeouts[request.timeout] = timeout
        try:
            response = await self._session.request(
                request.method,
                URL(request.url, encoded=True),
                headers=request.headers,
                data=request.body,
                allow_redirects=False,
                timeout=timeout,
            )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise translate(exc) from exc
        return _AiohttpResponse(response)
