"""asyncio and I/O helpers the components share, where no component owns them (kopf's
`aiokits`). Between the components and the store: it imports the domain, never a component.

- `backoff`: `retry`, the async loop around `wakeful.domain.backoff`'s policy.
"""
