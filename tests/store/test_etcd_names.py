"""An etcd endpoint by name (`etcd://etcd:2379`, as docker-compose.yml names its service).

etcd3aio dials addresses only; before `resolve_endpoints` a name failed at start with grpc's
"the target uri is not valid: ipv4:etcd:2379".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from wakeful.store import Unavailable, open_store
from wakeful.store.etcd import EtcdStore
from wakeful.store.testing import EtcdServer
from wakeful.store.url import resolve_endpoints

pytestmark = pytest.mark.etcd


class Note(BaseModel):
    text: str


def loopback_name() -> str:
    """A name other than `localhost` that /etc/hosts gives 127.0.0.1 (etcd listens there)."""
    for line in Path("/etc/hosts").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields and fields[0] == "127.0.0.1":
            for name in fields[1:]:
                if name != "localhost":
                    return name
    pytest.skip("/etc/hosts names 127.0.0.1 only as localhost")


async def test_a_store_named_by_host_name_connects(etcd_server: EtcdServer) -> None:
    name = loopback_name()
    port = etcd_server.endpoint.rsplit(":", 1)[1]
    async with open_store(f"etcd://{name}:{port}", namespace="/names/") as store:
        assert isinstance(store, EtcdStore)
        # Dialed by name, so grpc resolves it again when it moves (a restarted container).
        assert store.client._manager.target == f"dns:///{name}:{port}"
        await store.put("k", Note(text="v"))
        found = await store.get("k", Note)
        assert found is not None
        assert found.value == Note(text="v")


def test_names_become_addresses_and_addresses_stay() -> None:
    name = loopback_name()
    dialed, names = resolve_endpoints([f"{name}:2379", "10.0.0.7:2379", "localhost:2380"])
    assert dialed == ["127.0.0.1:2379", "10.0.0.7:2379", "localhost:2380"]
    assert names == [name]


async def test_a_name_that_resolves_to_nothing_is_named() -> None:
    with pytest.raises(Unavailable, match=r"'no-such-etcd\.invalid' resolves to no IPv4"):
        async with open_store("etcd://no-such-etcd.invalid:2379"):
            pass


def test_an_ipv6_endpoint_is_refused_saying_why() -> None:
    with pytest.raises(Unavailable, match="IPv6 address; the etcd client dials IPv4 only"):
        resolve_endpoints(["[::1]:2379"])
