"""Dial-out: a node the ingress cannot dial opens its streams to the ingress tier itself.

- `client.py`: `TunnelClient`, the streams sized per ingress replica and opened, the coverage
  table published in the node record.
- `decisions.py`: when that table is written, and what a refused stream means for the next
  (pure).
- `exchange.py`: what a stream carries (`Carrier`): exchanges, each a byte pipe to one of this
  node's own sandboxes.
- `sockets.py`: a socket to a sandbox, and the sockets kept between exchanges.
- `url.py`: `WAKEFUL_TUNNEL`, parsed into the URL each stream opens.
"""
