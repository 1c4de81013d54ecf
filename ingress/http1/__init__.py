"""The ingress's own HTTP/1.1 server: asyncio protocols and httptools, no ASGI in between.

- `server`: `HttpServer` (listen, stop in order), its `Limits`, the `Handler` it calls
  (`Handling`: a function as one).
- `connection`: one client connection: parse, queue, answer in order, the client's bounds.
- `rules`: how a request head frames its message or why it is refused (pure, no I/O).
- `request`: the `Request` a handler gets, its streaming `Body`, and `RequestBody` (what any
  body is, an HTTP/2 stream's too).
- `responder`: `Responder` (what a handler answers through, HTTP/1.1 or HTTP/2),
  `Http1Responder` (writing an HTTP/1.1 answer), a splice's client end, the canned answers.
"""

from wakeful.ingress.http1.connection import PIPELINE_MAX, ClientConnection
from wakeful.ingress.http1.request import Body, Request, RequestBody
from wakeful.ingress.http1.responder import ClientSide, Responder
from wakeful.ingress.http1.server import Handler, Handling, HttpServer, Limits

__all__ = [
    "PIPELINE_MAX",
    "Body",
    "ClientConnection",
    "ClientSide",
    "Handler",
    "Handling",
    "HttpServer",
    "Limits",
    "Request",
    "RequestBody",
    "Responder",
]
