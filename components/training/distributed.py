"""The only reader of torchrun's environment, and process-group set-up/tear-down.

torchrun (``torch/distributed/run.py``) sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and ``TORCHELASTIC_RESTART_COUNT``. RANK is not
stable across restarts and the restart count is local to one agent (pytorch#108158), so neither is
ever used as an identity: the checkpoint's job key is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart_count: int
    """Worker-group restarts within this torchrun agent's life (logs only)."""
    under_torchrun: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        env = os.environ if environ is None else environ
        under = "RANK" in env and "WORLD_SIZE" in env
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
            under_torchrun=under,
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def loopback_store_server(port: int = 0, *, timeout_s: float = 300.0) -> dist.TCPStore:
    """A ``TCPStore`` server listening on 127.0.0.1 only (``port`` 0 picks a free one).

    ``TCPStore(is_master=True)`` listens on every interface; handing it a socket we bound to the
    loopback address (``master_listen_fd``) keeps a single-machine job invisible from outside. The
    store owns the socket from then on and closes it when released.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    bound_port = sock.getsockname()[1]
    return dist.TCPStore("127.0.0.1", bound_port, is_master=True, master_listen_fd=sock.detach(),
                         wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=timeout_s))


def init_process_group(env: DistEnv, *, timeout_s: float = 120.0) -> bool:
    """Join the job's process group (nccl on GPU, gloo on CPU). Returns False for a lone process.

    When every rank is on this machine (``MASTER_ADDR`` is a loopback address) rank 0 serves the
    group's store on 127.0.0.1 only; otherwise torch's ``env://`` store is used.
    """
    if not env.under_torchrun:
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(env.device())
        backend = "cpu:gloo,cuda:nccl"  # gloo for CPU-side collectives (RNG gather), nccl for gradients
    else:
        backend = "gloo"
    timeout = timedelta(seconds=timeout_s)
    addr, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0"))
    if addr in LOOPBACK_HOSTS and port:
        if env.rank == 0:
            store = loopback_store_server(port, timeout_s=timeout_s)
        else:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        dist.init_process_group(backend=backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout)
    return True



def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In-place SUM over ranks (a no-op for a lone process)."""
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank (all ranks receive the list)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if active():
        dist.barrier()
