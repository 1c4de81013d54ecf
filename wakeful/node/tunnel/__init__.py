"""Dial-out: a node the ingress cannot dial opens its streams to the ingress tier itself.

- `client.py`: `TunnelClient`, the streams sized per ingress replica, the exchanges they carry
  to this node's sandboxes, the coverage table published in the node record.
"""
