"""The ingress replica's end of the tunnels that dial-out nodes open (seed 003).

A node behind NAT cannot be dialed, so it dials out: `wakeful node` with `WAKEFUL_TUNNEL`
opens streams (one WebSocket each) through the load balancer to the ingress tier, and the
balancer places each stream on a replica of its choosing. This package is what a replica does
with the streams that land on it (`wakeful.domain.tunnelwire` is the protocol):

- **Accept** (`Tunnels.serve`, a WebSocket listener on `tunnel_listen`): a stream must carry a
  node token (`authorization: Bearer ...`, checked against the store's digests by a
  `TokenBook`), then says which node it serves. It joins that node's streams on this replica
  (`StreamHub`), at most `tunnel_streams_per_node` of them.
- **Carry** (`Tunnels.dial`, the upstream transport's `Dialer` for `tunnel://NODE/SANDBOX`
  addresses): a request for the node's sandbox takes the node's newest idle stream *here*, and
  the stream becomes the request's connection (`Exchange`, an `asyncio.Transport`), so the
  upstream transport writes and parses HTTP over it exactly as over TCP: retries, bounds,
  timeouts and WebSockets all stay as they are. One stream carries one exchange at a time.
- **Relay**: a replica where the node holds no stream (the public balancer sent the request
  to a replica the node's streams did not land on), or holds only busy ones while another
  replica has idle ones, relays the exchange to a replica that does, found through the node's
  coverage table (`nodes/{node}`) and the replicas' own records (`ingresses/{replica}`,
  which each replica writes for itself, bound to a TTL lease). A relay is authenticated with
  an ingress token. The request keeps its lease here: the lease is taken and handed back
  exactly once, by the replica the client reached.

Nothing reaches a node's sandbox through a replica without the node's credential, and no
address a node writes is ever dialed: a replica dials only its peers' recorded addresses.

| module | its one job |
|---|---|
| `service` | `Tunnels`: the parts wired for one replica; `dial`, the dialer |
| `decisions` | relay or wait: where a request looks for a stream next (pure) |
| `listener` | the WebSocket server: who may open a stream or relay, and for how long |
| `stream` | `NodeStream`: one stream a node opened, and its reader loop |
| `hub` | `StreamHub`: every node's streams here, idle and busy, and their waiters |
| `exchange` | `Exchange`: one request's connection over a stream, as an `asyncio.Transport` |
| `relay` | relays between replicas: out to a peer (`relay_to`), in from one (`serve_relay`) |
| `peers` | the other replicas' records and the nodes' tables; this replica's own record |
| `metrics` | `TunnelCounts` and the collector that shows them |
| `connections` | the WebSocket connections underneath: options, one message read, a close |
"""

from wakeful.ingress.nodestreams.connections import WS_OPTIONS
from wakeful.ingress.nodestreams.exchange import Exchange, TunnelClosed
from wakeful.ingress.nodestreams.hub import StreamHub
from wakeful.ingress.nodestreams.service import Tunnels, default_replica_name
from wakeful.ingress.nodestreams.stream import NodeStream

__all__ = [
    "WS_OPTIONS",
    "Exchange",
    "NodeStream",
    "StreamHub",
    "TunnelClosed",
    "Tunnels",
    "default_replica_name",
]
