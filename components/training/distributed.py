"""The only reader of torchrun's environment, and process-group set-up/tear-down.

torchrun (``torch/distributed/run.py``) sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT`` and
``TORCHELASTIC_USE_AGENT_STORE``. RANK is not stable across restarts and the restart count is local to
one agent (pytorch#108158), so neither is ever used as an identity: the checkpoint's job key is.

Which store the process group uses is chosen the way torchrun tells its workers
(``torch/distributed/elastic/agent/server/local_elastic_agent.py`` sets ``TORCHELASTIC_USE_AGENT_STORE``
from the rendezvous handler's ``use_agent_store``; ``torch/distributed/rendezvous.py``
``_create_c10d_store`` reads it):

* **shared** (``TORCHELASTIC_USE_AGENT_STORE=True``, torchrun's default with the c10d rendezvous): the
  rank-0 agent already serves a ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``; every rank, rank 0
  included, connects to it as a client. That store outlives the workers, so keys written by an earlier
  worker group of the same agent are still there after a restart — the stale-store failures of
  pytorch#135712. Each worker group therefore first agrees on a fresh namespace
  (:func:`incarnation_store`) and builds its process group inside it.
* **not shared** (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): rank 0 hosts the store at ``MASTER_PORT``;
  when ``MASTER_ADDR`` is a loopback address it listens on 127.0.0.1 only
  (:func:`loopback_store_server`), otherwise torch's ``env://`` store is used.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
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


def store_server(host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 300.0) -> dist.TCPStore:
    """A ``TCPStore`` server listening on ``host`` only (``port`` 0 picks a free one).

    ``TCPStore(is_master=True)`` listens on every interface; handing it a socket bound to ``host``
    (``master_listen_fd``) keeps the store on the one address it is meant to be reached at (127.0.0.1
    for a single-machine job, the launcher pod's IP for a PyTorchJob's rendezvous). An IPv6 literal
    (``"fd00::5"``) gets an IPv6 socket. The store owns the socket from then on and closes it when
    released; ``store.port`` is the bound port.

    Raises:
        OSError: ``host`` is not an address of this machine, or ``port`` is taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    return dist.TCPStore(host, bound_port, is_master=True, master_listen_fd=sock.detach(),
                         wait_for_workers=False, multi_tenant=True, timeout=timedelta(seconds=timeout_s))


def loopback_store_server(port: int = 0, *, timeout_s: float = 300.0) -> dist.TCPStore:
    """:func:`store_server` on 127.0.0.1: a single-machine job's store, invisible from outside."""
    return store_server("127.0.0.1", port, timeout_s=timeout_s)


def uses_agent_store(environ: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun shares its rendezvous ``TCPStore`` with the workers (the same test as
    ``torch/distributed/rendezvous.py`` ``_torchelastic_use_agent_store``)."""
    env = os.environ if environ is None else environ
    return env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


_INCARNATION_NS = "trainflow/incarnation"


def incarnation_store(store: dist.Store, rank: int, world_size: int, *, timeout_s: float = 120.0,
                      poll_s: float = 0.01) -> dist.PrefixStore:
    """``store`` under a namespace that this worker group alone uses (a fresh one per group).

    A shared store keeps every key of the worker groups an agent ran before, and a restarted group
    must not read them (gloo/NCCL addresses and barrier counters of dead peers). No number that every
    rank knows tells the groups apart (restart counts are per agent, pytorch#108158), so rank 0 draws
    a random token and hands it out by a request/grant/ack exchange in which every key a rank waits
    on is new: rank ``r`` writes a fresh nonce to ``req/r`` and waits for ``grant/<nonce>``; rank 0
    keeps granting whatever nonce ``req/r`` holds (a stale one from a dead group gets a grant nobody
    reads) until ``ack/<token>/r`` appears.

    Raises:
        TimeoutError: a rank did not take part within ``timeout_s``.
    """
    if rank == 0:
        token = uuid.uuid4().hex
        pending = set(range(1, world_size))
        granted: dict[int, str] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            for r in sorted(pending):
                if store.check([f"{_INCARNATION_NS}/ack/{token}/{r}"]):
                    pending.discard(r)
                    continue
                if store.check([f"{_INCARNATION_NS}/req/{r}"]):
                    nonce = store.get(f"{_INCARNATION_NS}/req/{r}").decode()
                    if granted.get(r) != nonce:
                        store.set(f"{_INCARNATION_NS}/grant/{nonce}", token)
                        granted[r] = nonce
            if pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ranks {sorted(pending)} did not join the worker group within {timeout_s:g} s")
                time.sleep(poll_s)
    else:
        nonce = uuid.uuid4().hex
        store.set(f"{_INCARNATION_NS}/req/{rank}", nonce)
        token = store.get(f"{_INCARNATION_NS}/grant/{nonce}").decode()  # waits up to the store's timeout
        store.set(f"{_INCARNATION_NS}/ack/{token}/{rank}", b"1")
    return dist.PrefixStore(f"trainflow/{token}", store)


def process_group_backend() -> str:
    """The process group's backend on this machine: ``cpu:gloo,cuda:nccl`` with a GPU (gloo for
    the CPU-side collectives such as the RNG gather, nccl for gradients), else ``gloo``."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


#: Timeout of the control group's collectives (:func:`broadcast_object`, :func:`gather_objects`,
#: :func:`barrier`), seconds. The other ranks wait in them while rank 0 alone talks to the
#: checkpoint store — downloading and verifying the checkpoint to resume from, the final save
#: with its retries, the model export — which takes as long as the store and the checkpoint's size
#: make it; and, before the model is wrapped in DDP, while any rank still reads its dataset. A dead peer is not found by this timeout but by torchrun (its agent stops the group
#: when a worker exits; the rendezvous' keep-alive when a node is lost).
CONTROL_TIMEOUT_S = 3600.0

_control: Any = None  # the control group (gloo), once init_process_group made it


def init_process_group(env: DistEnv, *, timeout_s: float = 120.0, control_timeout_s: float = CONTROL_TIMEOUT_S) -> bool:
    """Join the job's process group (nccl on GPU, gloo on CPU). Returns False for a lone process.

    The store is chosen as the module docstring says: torchrun's agent store when it is shared
    (in a namespace of this worker group's own), else one rank 0 hosts on 127.0.0.1 when every rank
    is on this machine, else torch's ``env://`` store.

    Two groups: the default one (``timeout_s``: the per-step gradient and agreement all-reduces,
    where a stuck collective is a fault) and a gloo *control* group of the same ranks
    (``control_timeout_s``) for the object collectives and barriers around rank 0's storage work
    (:data:`CONTROL_TIMEOUT_S`). Before it, ranks waiting for a checkpoint download longer than
    ``timeout_s`` failed, and torchrun restarted the group — on every try, for a large checkpoint.
    """
    if not env.under_torchrun:
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(env.device())
    backend = process_group_backend()
    timeout = timedelta(seconds=timeout_s)
    addr, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0"))
    store: dist.Store | None = None
    if uses_agent_store() and addr and port:
        agent_store = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
        store = incarnation_store(agent_store, env.rank, env.world_size, timeout_s=timeout_s)
    elif addr in LOOPBACK_HOSTS and port:
        if env.rank == 0:
            store = loopback_store_server(port, timeout_s=timeout_s)
        else:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    if store is not None:
        dist.init_process_group(backend=backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout)
    global _control
    _control = dist.new_group(backend="gloo", timeout=timedelta(seconds=control_timeout_s))  # every rank, in order
    return True


def destroy_process_group() -> None:
    global _control
    _control = None
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
    dist.broadcast_object_list(box, src=src, group=_control)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, indexed by rank (all ranks receive the list)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_control)
    return out


def barrier() -> None:
    """Wait for every rank (in the control group: as long as rank 0's storage work takes)."""
    if active():
        dist.barrier(group=_control)
