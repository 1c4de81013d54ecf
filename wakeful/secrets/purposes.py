"""Values the control plane seals for itself, each bound to what it is for (`acme account`,
`acme certificate shop.example.com`): sealed under the current secrets key, opened with
whichever key sealed them (`wakeful.certs.Sealer`)."""

from __future__ import annotations

from .keys import KeyRing


class PurposeSealer:
    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring

    async def seal(self, purpose: str, value: str) -> str:
        key_id = (await self._ring.current()).value.key
        return self._ring.seal_for(key_id, purpose, value)

    def open(self, purpose: str, sealed: str) -> str:
        """`SealError` (`UnknownKey`) when it does not open."""
        return self._ring.open_for(purpose, sealed)
