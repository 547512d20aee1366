"""Launch the training runtime under a local ``torchrun`` elastic agent (the ``local`` backend).

One call starts one agent (one "node") with ``nproc_per_node`` workers. The agent joins a c10d
rendezvous on ``rdzv_endpoint`` with ``--nnodes=MIN:MAX``, so more agents can join the same job up
to ``max_nodes`` (elastic scale-up), and the job carries on with at least ``min_nodes`` when one leaves
(scale-down). The agents started here are on this machine (``--local-addr=127.0.0.1``, gloo on the
loopback interface); a PyTorchJob's workers run the same runtime across nodes
(:mod:`components.launcher.pytorchjob`).

The c10d rendezvous store lives in whichever agent binds its port first, which makes that agent a
single point of failure: if it dies, every other agent loses the rendezvous. :class:`RendezvousStore`
hosts the store in the long-lived launcher process instead (agents join with ``is_host=false``), so
any agent can leave or die and new ones can join.

Settings: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` — the workers cope with torchrun's shared store
(``components.training.distributed`` gives each worker group its own namespace in it), but with several
agents the shared store lives in the rank-0 agent, and when that agent leaves the others keep its stale
address (pytorch#167301); with the flag rank 0's worker hosts a fresh store per worker group.
``last_call_timeout=1``: no 30 s wait per start with ``--nnodes=1:N``.

Permanent failures: torchrun restarts the group on any worker failure and exits 1 at the end; the worker
records a permanent one (exit 2) in torchelastic's error file, which :func:`run_agent` names for the
agent and reads back (:func:`permanent_failure`), so its caller gets exit code 2 again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from trainflow.common.cpus import threads_per_rank


def rdzv_id_for(job_key: str) -> str:
    """A rendezvous id derived from the job key (stable, short, safe for any key)."""
    return "tf-" + hashlib.sha256(job_key.encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentSpec:
    """One torchrun elastic agent."""

    rdzv_id: str
    rdzv_endpoint: str
    """``host:port`` of the c10d rendezvous store: a :class:`RendezvousStore`'s with
    ``rdzv_is_host=False`` (the local backend's), else the first agent to arrive hosts it."""
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    max_restarts: int = 3
    """Worker-group restarts after failures (a node joining does not count; plain torchrun, the local
    backend, counts one leaving; :mod:`components.training.torchrun`, PyTorchJob pods, does not)."""
    monitor_interval_s: float = 0.2
    last_call_timeout_s: float = 1.0
    join_timeout_s: float = 120.0
    rdzv_is_host: bool | None = None
    """``False`` when a :class:`RendezvousStore` hosts the store; ``None`` lets torch decide."""
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got {self.min_nodes}:{self.max_nodes}")
        if self.nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")


def torchrun_argv(spec: AgentSpec, training_args: Sequence[str], *, python: str = sys.executable) -> list[str]:
    """The command line of one agent running ``-m components.training <training_args>``."""
    return [
        python, "-m", "torch.distributed.run",
        f"--nnodes={spec.min_nodes}:{spec.max_nodes}",
        f"--nproc-per-node={spec.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={spec.rdzv_endpoint}",
        f"--rdzv-id={spec.rdzv_id}",
        f"--rdzv-conf=last_call_timeout={spec.last_call_timeout_s:g},join_timeout={spec.join_timeout_s:g}"
        + ("" if spec.rdzv_is_host is None else f",is_host={str(spec.rdzv_is_host).lower()}"),
        f"--max-restarts={spec.max_restarts}",
        f"--monitor-interval={spec.monitor_interval_s:g}",
        "--local-addr=127.0.0.1",
        "-m", "components.training",
        *training_args,
    ]


def torchrun_env(spec: AgentSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update({
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),  # local runs stay on loopback
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", str(threads_per_rank(spec.nproc_per_node, env))),
    })
    env.update(spec.env)
    return env


class RendezvousStore:
    """The c10d rendezvous store (a ``TCPStore`` server) hosted by this process.

    Use as a context manager around the agents' lifetime; pass ``endpoint`` and
    ``rdzv_is_host=False`` to every :class:`AgentSpec` (a PyTorchJob's workers get the same through
    ``elasticPolicy.rdzvHost``/``rdzvPort`` and ``rdzvConf is_host=false``).

    Args:
        host: the address the agents reach this process at, and the only one the store listens on
            (default 127.0.0.1: agents on this machine); an IPv4 or IPv6 literal.
        port: the port (0 picks a free one).

    Raises:
        OSError: ``host`` is not an address of this machine, or ``port`` is taken.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        from components.training.distributed import store_server

        self.host = host
        self._store = store_server(host, port)
        self.port: int = self._store.port

    @property
    def endpoint(self) -> str:
        """``host:port`` as torchrun's ``--rdzv-endpoint`` takes it (an IPv6 host in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def close(self) -> None:
        self._store = None  # the server stops (and closes its socket) when the store is released

    def __enter__(self) -> RendezvousStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Agent:
    """A running torchrun agent in its own process group; its output goes to ``log_path``.

    ``on_line`` (optional) is called with each output line (from a reader thread).
    """

    def __init__(self, spec: AgentSpec, training_args: Sequence[str], *, log_path: Path,
                 on_line: Callable[[str], None] | None = None, python: str = sys.executable) -> None:
        self.spec = spec
        self.argv = torchrun_argv(spec, training_args, python=python)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[str] = self.log_path.open("a", buffering=1)
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            env=torchrun_env(spec), start_new_session=True,
        )
        self._reader = threading.Thread(target=self._pump, args=(on_line,), daemon=True)
        self._reader.start()

    def _pump(self, on_line: Callable[[str], None] | None) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            if on_line:
                on_line(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout_s: float | None = None) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        self._log.close()
        return rc

    def signal(self, sig: int, *, whole_group: bool = True) -> None:
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)

    def terminate(self, grace_s: float = 30.0) -> int:
        """SIGTERM the agent (it forwards to its workers, which save and exit), SIGKILL after ``grace_s``."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM, whole_group=False)
            try:
                return self.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
        return self.wait(10)

    def kill(self) -> int:
        """SIGKILL the agent and all its workers at once (a node lost). torchrun starts each worker in
        a session of its own, so the process tree is walked rather than the process group."""
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            for p in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        return self.wait(10)


EXIT_PERMANENT = 2
"""A worker's permanent failure (``components/training/__main__.py``), as the agent's caller sees it."""


#: How ``python -m components.training.torchrun`` starts the line (stderr, and a pod's termination
#: message) that reports a permanent failure; its reason follows. The launcher reads it back.
PERMANENT_PREFIX = "permanent failure, not retried: "


def permanent_failure(error_file: str | Path) -> str | None:
    """The one-line reason if torchelastic's error file (written by torchrun for its root-cause
    failure) holds a permanent trainflow failure, else ``None`` (also when the file is absent)."""
    try:
        data = json.loads(Path(error_file).read_text())
    except (OSError, ValueError):
        return None
    return permanent_reason(data)


def permanent_reason(error_data: object) -> str | None:
    """The one-line reason if ``error_data`` — the JSON of a torchelastic error file, as a worker's
    ``ProcessFailure.error_file_data`` holds it — records a permanent trainflow failure
    (``extraInfo.trainflow_exit_code`` = 2, written by ``python -m components.training``), else ``None``."""
    try:
        message = error_data["message"]  # type: ignore[index]
        code = message.get("extraInfo", {}).get("trainflow_exit_code")
    except (KeyError, TypeError, AttributeError):
        return None
    if code != str(EXIT_PERMANENT):
        return None
    return str(message.get("message", "")).strip() or "permanent failure"


def run_agent(spec: AgentSpec, training_args: Sequence[str], *, log_path: Path,
              on_line: Callable[[str], None] | None = None) -> int:
    """Run one agent to completion; SIGTERM/SIGINT to this process are forwarded to it (KFP terminate).

    Returns the agent's exit code, except :data:`EXIT_PERMANENT` (2) when the root cause was a
    worker's permanent failure (bad input, a checkpoint of another job, fenced).
    """
    error_file = Path(log_path).with_name(Path(log_path).name + ".error.json")
    error_file.unlink(missing_ok=True)
    spec = dataclasses.replace(spec, env={**spec.env, "TORCHELASTIC_ERROR_FILE": str(error_file)})
    agent = Agent(spec, training_args, log_path=log_path, on_line=on_line)
    forwarded = {}

    def forward(signum: int, frame: object) -> None:
        agent.signal(signal.SIGTERM, whole_group=False)

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not the main thread
            forwarded[sig] = signal.signal(sig, forward)
    try:
        rc = agent.wait()
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)
    return EXIT_PERMANENT if rc != 0 and permanent_failure(error_file) else rc
