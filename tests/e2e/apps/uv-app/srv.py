"""A bare ASGI app: no framework, so no convention finds it; wakeful.toml's command runs it."""


async def api(scope, receive, send):  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"from uv.lock"})
