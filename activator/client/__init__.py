"""The adapters of `wakeful.domain.leases.Leases` (what the ingress needs of the activator).
All raise the same errors (`activator/lease_errors.py` reads them off the wire), so the
ingress cannot tell them apart; `tests/activator/test_leases_contract.py` holds all three to
one contract.

- `inprocess.py`: `InProcessLeases`, the activator in the same process (`wakeful up`).
- `channel.py`: `ChannelLeases`, the lease channel: one WebSocket, many calls in flight
  (what `wakeful ingress` uses).
- `http.py`: `HttpLeases`, the HTTP API, a request per call.
"""

from wakeful.activator.client.channel import ChannelLeases
from wakeful.activator.client.http import HttpLeases
from wakeful.activator.client.inprocess import InProcessLeases

__all__ = ["ChannelLeases", "HttpLeases", "InProcessLeases"]
