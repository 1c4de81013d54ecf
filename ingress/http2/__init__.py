"""HTTP/2 for clients: each stream one request to the same handler HTTP/1.1 requests reach.

- `connection`: `H2Connection`, one client connection framed by `wire`, its streams and bounds.
- `frames`, `streams`, `wire`: the framing, stream states and windows (RFC 9113), sans-IO;
  `client`: the same for the h2c connections to sandboxes (`upstream.h2c`).
- `stream`: a stream's `StreamBody` and `StreamResponder` (the `http1` interfaces).
- `sender`: the way out: frames written once a turn, DATA as the windows allow, drains.
- `rules`: the preface, a stream's head as a request, the frame scan and budgets (pure).

`http1.ClientConnection` hands a connection over (ALPN `h2` on TLS, the preface on a plain
listener); nothing here is imported until one is.
"""
