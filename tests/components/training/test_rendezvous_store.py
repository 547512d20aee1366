"""The rendezvous store a launcher hosts: it listens on the one address it is given, and torchrun's
c10d rendezvous backend uses it as a client (``is_host=false``)."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from components.training.launch import RendezvousStore


def _connects(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


def test_the_store_listens_on_its_host_only() -> None:
    # 127.0.0.2 is a loopback address too, but another one than 127.0.0.1: a store told to serve
    # there must not be reachable at 127.0.0.1 (TCPStore alone would listen on every interface).
    with RendezvousStore(host="127.0.0.2") as store:
        assert store.host == "127.0.0.2" and store.port > 0
        assert store.endpoint == f"127.0.0.2:{store.port}"
        assert _connects("127.0.0.2", store.port)
        assert not _connects("127.0.0.1", store.port)
        client = dist.TCPStore("127.0.0.2", store.port, is_master=False, timeout=timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"


def test_an_ipv6_host_is_bracketed_in_the_endpoint() -> None:
    try:
        store = RendezvousStore(host="::1")
    except OSError as e:  # pragma: no cover - a machine without IPv6 loopback
        pytest.skip(f"no IPv6 loopback: {e}")
    with store:
        assert store.endpoint == f"[::1]:{store.port}"
        assert _connects("::1", store.port)


def test_a_fixed_port_is_used_and_an_address_not_on_this_machine_is_refused() -> None:
    # The port of a live store is taken: a second store on it fails at once (no silent reuse).
    with RendezvousStore() as first, pytest.raises(OSError):
        RendezvousStore(port=first.port)
    with pytest.raises(OSError):
        RendezvousStore(host="203.0.113.7")  # TEST-NET-3 (RFC 5737): no interface here has it


def test_torchrun_s_c10d_backend_joins_it_as_a_client() -> None:
    """What each worker pod's agent does with ``PET_RDZV_ENDPOINT`` and ``is_host=false``
    (``torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py`` ``create_backend``)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    with RendezvousStore(host="127.0.0.2") as store:
        params = RendezvousParameters(backend="c10d", endpoint=store.endpoint, run_id="tf-test", min_nodes=1,
                                      max_nodes=2, is_host="false")
        backend, client = create_backend(params)
        assert backend.name == "c10d"
        # The backend's state key is in the launcher's store, where an agent that dies cannot take it along.
        backend.set_state(b"round-0")
        server_view = dist.TCPStore("127.0.0.2", store.port, is_master=False, timeout=timedelta(seconds=10))
        assert server_view.check(["torch.rendezvous.tf-test"])
        del backend, client
