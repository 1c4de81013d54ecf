"""The ingress's async generators: bodies as they stream. mypyc compiles no async generator,
so they live here, uncompiled (`wakeful.native`), and do nothing but loop: the work of each
step is in the compiled classes they call."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable


async def chunks(next_chunk: Callable[[], Awaitable[bytes | None]]) -> AsyncIterator[bytes]:
    """What `next_chunk` returns, until it returns None (the end)."""
    while (chunk := await next_chunk()) is not None:
        yield chunk


async def nonempty(body: AsyncIterable[bytes]) -> AsyncGenerator[bytes, None]:
    """`body`'s non-empty chunks, as a generator `aclosing` can close."""
    async for chunk in body:
        if chunk:
            yield chunk
