"""asyncio and I/O helpers the components share, where no component owns them (kopf's
`aiokits`), and the I/O the domain may not hold. Between the components and the store: it
imports only the domain (the store below it too, were it to need it), never a component.

- `backoff`: `retry`, the async loop around `wakeful.domain.backoff`'s policy.
- `flow`: `HIGH_WATER` and `LOW_WATER` (what one side of a connection may hold in memory for
  the other), and `WriteGate` (a writer waiting for a full send buffer).
- `pipe`: `Pipe`, bytes from a protocol's callbacks to its consumer, bounded by pausing the
  protocol.
- `deadline`: `Deadline`, a connection's deadline, moved for the price of a float.
- `tasks`: `Background`, tasks started from synchronous code, held until they end.
- `packing`: an app directory packed into an artifact, an artifact unpacked into a directory
  (the rules are `wakeful.domain.artifacts`).
- `loopback`: a loopback listener holds the other loopback address's port too.
- `trace`: the cold-start trace points (`WAKEFUL_TRACE=1`).
- `failpoints`: named places where a test makes a piece die on the spot (`WAKEFUL_FAILPOINTS`).
- `spawn`: every child a piece starts (sandboxes, pasta, umoci, cp, skopeo), started through
  `Popen`'s vfork and watched on the loop: never a fork of the piece (`run_tool` for a tool).
"""
