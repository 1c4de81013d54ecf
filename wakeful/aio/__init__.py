"""asyncio and I/O helpers the components share, where no component owns them (kopf's
`aiokits`). Between the components and the store: it imports the domain, never a component.

- `backoff`: `retry`, the async loop around `wakeful.domain.backoff`'s policy.
- `flow`: `HIGH_WATER` and `LOW_WATER` (what one side of a connection may hold in memory for
  the other), and `WriteGate` (a writer waiting for a full send buffer).
- `pipe`: `Pipe`, bytes from a protocol's callbacks to its consumer, bounded by pausing the
  protocol.
- `deadline`: `Deadline`, a connection's deadline, moved for the price of a float.
- `tasks`: `Background`, tasks started from synchronous code, held until they end.
"""
