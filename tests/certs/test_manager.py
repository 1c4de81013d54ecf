"""The certificate manager (`wakeful.certs.manager`) in the real control plane, in-process on the
memory store, against Debian's pebble with validation on; an ingress in-process answers the
challenges (or, where an order must last, a responder that answers them late from the store).
Apps are written straight into the store, as a deploy's route flip writes them.

Several were found by a hostile-test helper: an order in flight that spun the manager on the
store, a name too long for DNS that ended the control plane, an account the CA forgot that was
never made again, names a certificate file covers that were ordered anyway."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.ingress.test_acme import make_ca
from tests.support.certs import issue
from tests.support.control import Running, running_control_plane
from tests.support.pebble import NEW_ORDER, Pebble, pebble_installed, running_pebble
from wakeful.activator.client import InProcessLeases
from wakeful.domain import keys
from wakeful.domain.models import AcmeChallenge, App, CertRecord
from wakeful.ingress import IngressSettings
from wakeful.ingress.server import Ingress
from wakeful.store import Store, open_store
from wakeful.store.testing import free_port
from wakeful.together import PlaneCerts

pytestmark = [
    pytest.mark.skipif(not pebble_installed(), reason="needs Debian's pebble"),
    pytest.mark.anyio,
]


@dataclass
class Plane:
    store: Store
    control: Running
    pebble: Pebble

    def orders(self) -> int:
        return self.pebble.log().count(NEW_ORDER)

    async def alive(self) -> bool:
        async with httpx.AsyncClient(base_url=self.control.url, timeout=10) as client:
            return (await client.get("/healthz")).status_code == 200


@contextlib.asynccontextmanager
async def control_plane(
    tmp: Path, pebble: Pebble, store: Store, plain: int | None, **settings: object
) -> AsyncIterator[Plane]:
    """The control plane with ACME on; with an ingress on `plain` (pebble's HTTP-01 port)
    unless None (a test answers the challenges itself)."""
    acme = {
        "acme_email": "ops@shop.test",
        "acme_directory": pebble.directory,
        "acme_ca": pebble.ca_file,
    }
    async with (
        running_control_plane(tmp / "cp", store=store, **acme, **settings) as control,
        contextlib.AsyncExitStack() as stack,
    ):
        if plain is not None:
            assert control.plane.certs is not None
            ingress = Ingress(
                IngressSettings(
                    store_url="memory://",
                    listen=f"127.0.0.1:{plain}",
                    admin_listen="127.0.0.1:0",
                ),
                InProcessLeases(control.plane.activator),
                store,
                CollectorRegistry(),
                certs=PlaneCerts(control.plane.certs),
            )
            await stack.enter_async_context(ingress.running())
        yield Plane(store, control, pebble)


def app(name: str, *hosts: str, default_host: bool = False) -> App:
    return App(name=name, hosts=list(hosts), active_version="v1", default_host=default_host)


async def state(store: Store, name: str, wanted: str, within: float = 40) -> CertRecord:
    with anyio.fail_after(within):
        while True:
            found = await store.get(keys.cert(name), CertRecord)
            if found is not None and found.value.state == wanted:
                return found.value
            await anyio.sleep(0.1)


class LateResponder:
    """HTTP-01 answers from the store's challenges, each `delay` seconds late: an order lasts."""

    def __init__(self, store: Store, delay: float) -> None:
        self._store = store
        self._delay = delay
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            token = line.split(b" ")[1].rsplit(b"/", 1)[-1].decode()
            await asyncio.sleep(self._delay)
            found = await self._store.get(keys.challenge(token), AcmeChallenge)
            body = b"" if found is None else found.value.key_authorization.encode()
            status = b"200 OK" if found is not None else b"404 Not Found"
            writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
            await writer.drain()
        finally:
            writer.close()


async def test_an_order_in_flight_costs_no_cpu_while_apps_change(tmp_path: Path) -> None:
    """While an order waits for its validation (answered 4 s late), an app change makes a pass:
    the name being ordered is not waited for (its order's end starts a pass), so nothing spins.
    Before, the pass found it due and looped at once until the order ended (~100,000 listings
    of `certs/`, a core busy)."""
    plain = free_port()
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        async with open_store("memory://") as store:
            late = LateResponder(store, delay=4.0)
            late.server = await asyncio.start_server(late.handle, "127.0.0.1", plain)
            try:
                async with control_plane(tmp_path, pebble, store, None) as p:
                    await store.put(keys.app("shop"), app("shop", "shop.test"))
                    await state(store, "shop.test", "ordering")
                    cpu, wall = time.process_time(), time.monotonic()
                    await store.put(keys.app("other"), app("other"))  # any change to apps/
                    await state(store, "shop.test", "valid")
                    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                    assert await p.alive()
            finally:
                late.server.close()
    assert wall > 2  # the order lasted
    assert cpu < 0.3 * wall, f"{cpu:.1f} s of CPU in {wall:.1f} s: the manager spins"


async def test_a_name_too_long_for_dns_is_skipped_and_the_others_are_ordered(
    tmp_path: Path,
) -> None:
    """A base domain of 245 characters and an app name of 20 make a default host of 266: it is
    skipped, and the control plane goes on (before, its record's validation ended it)."""
    plain = free_port()
    base = ".".join(["b" * 59] * 4) + ".test"
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        async with (
            open_store("memory://") as store,
            control_plane(tmp_path, pebble, store, plain, acme_base_domain=base) as p,
        ):
            await store.put(keys.app("a" * 20), app("a" * 20, default_host=True))
            await store.put(keys.app("shop"), app("shop", "shop.test"))
            await state(store, "shop.test", "valid")
            assert await p.alive()
            names = [item.value.name for item in (await store.list(keys.CERTS, CertRecord)).items]
    assert names == ["shop.test"]


async def test_an_account_the_ca_forgot_is_made_again(tmp_path: Path) -> None:
    """pebble restarted at the same directory has lost every account: the next control plane
    finds the stored one unknown, makes a new one and orders with it (before, every order
    failed `accountDoesNotExist` for ever)."""
    plain = free_port()
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        async with open_store("memory://") as store:
            async with control_plane(tmp_path, pebble, store, plain):
                await store.put(keys.app("shop"), app("shop", "shop.test"))
                await state(store, "shop.test", "valid")
            await anyio.to_thread.run_sync(pebble.restart)
            async with control_plane(tmp_path, pebble, store, plain):
                await store.put(keys.app("two"), app("two", "two.test"))
                found = await state(store, "two.test", "valid")
    assert found.issued is not None


async def test_names_a_certificate_file_covers_are_not_ordered(tmp_path: Path) -> None:
    """WAKEFUL_TLS_DIR holds `shop.test.crt` and `*.files.test.crt`: those names are the
    files', and only `other.test` is ordered; `wakeful certs` lists the files too (the default
    pair's as `(default)`, and a file that is no certificate as unreadable)."""
    files = tmp_path / "files"
    files.mkdir()
    ca = make_ca(tmp_path / "file-ca", "file test CA")
    for name, file in (("shop.test", None), ("*.files.test", None), ("fallback.test", "default")):
        issue(ca, files, name, file)
    (files / "broken.test.crt").write_text("not a certificate")
    plain = free_port()
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        async with (
            open_store("memory://") as store,
            control_plane(tmp_path, pebble, store, plain, tls_dir=files) as p,
        ):
            for each in (
                app("shop", "shop.test"),
                app("wild", "a.files.test"),
                app("other", "other.test"),
            ):
                await store.put(keys.app(each.name), each)
            await state(store, "other.test", "valid")
            names = [item.value.name for item in (await store.list(keys.CERTS, CertRecord)).items]
            orders = p.orders()
            auth = {"Authorization": f"Bearer {p.control.token}"}
            async with httpx.AsyncClient(base_url=p.control.url, headers=auth) as client:
                listed = (await client.get("/v1/certs")).json()
    assert names == ["other.test"]
    assert orders == 1
    shown = {(e["name"], e["source"], e["state"], e["issuer"]) for e in listed}
    assert ("shop.test", "file", "valid", "CN=file test CA") in shown
    assert ("*.files.test", "file", "valid", "CN=file test CA") in shown
    assert (
        "other.test",
        "acme",
        "valid",
        next(e["issuer"] for e in listed if e["source"] == "acme"),
    ) in shown
    assert any(e["name"] == "broken.test" and e["state"] == "unreadable" for e in listed)
    assert ("(default)", "file", "valid", "CN=file test CA") in shown
    assert "default" not in {e["name"] for e in listed}


async def test_a_new_leader_keeps_the_certificates_it_finds(tmp_path: Path) -> None:
    """A control plane starting (a restart, a takeover) keeps the certificates it finds and
    orders only what is new. (Its first pass waits for the apps' listing: a pass before it
    would find no app and drop every certificate. On the memory store the listing always
    comes first, so this test cannot show that race; it shows the outcome.)"""
    plain = free_port()
    with running_pebble(tmp_path / "pebble", http_port=plain) as pebble:
        async with open_store("memory://") as store:
            async with control_plane(tmp_path, pebble, store, plain):
                await store.put(keys.app("shop"), app("shop", "shop.test"))
                first = await state(store, "shop.test", "valid")
            async with control_plane(tmp_path, pebble, store, plain) as p:
                await store.put(keys.app("two"), app("two", "two.test"))
                await state(store, "two.test", "valid")  # a pass or more since the start
                kept = await state(store, "shop.test", "valid")
                orders = p.orders()
    assert kept.issued == first.issued
    assert orders == 2
