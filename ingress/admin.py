"""The admin port's handler: /healthz, /readyz and /metrics, on the ingress's own HTTP/1.1
server (`http1`), beside the proxy port's `edge.ProxyEdge`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from wakeful.ingress.http1 import Handler, Request, Responder


class AdminEdge(Handler):
    """/healthz, /readyz and /metrics, on the admin port (same HTTP/1.1 server). `metrics`
    renders the exposition: one registry's, or every worker's (`ingress.workers`)."""

    def __init__(
        self,
        metrics: CollectorRegistry | Callable[[], Awaitable[bytes]],
        ready: Callable[[], bool],
    ) -> None:
        self._metrics = metrics
        self._ready = ready

    async def handle(self, request: Request, out: Responder) -> None:
        path = request.target.split(b"?", 1)[0]
        content_type = b"text/plain; charset=utf-8"
        if path == b"/healthz":
            status, body = 200, b"ok\n"
        elif path == b"/readyz":
            ready = self._ready()
            status, body = (200, b"ready\n") if ready else (503, b"not ready\n")
        elif path == b"/metrics":
            metrics = self._metrics
            if isinstance(metrics, CollectorRegistry):
                body = generate_latest(metrics)
            else:
                body = await metrics()
            status, content_type = 200, CONTENT_TYPE_LATEST.encode()
        else:
            status, body = 404, b"not found\n"
        out.send_whole(status, [(b"content-type", content_type)], body)
