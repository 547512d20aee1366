"""Start and stop real servers for tests: loopback only, free ports, stopped by PID.

Every test tier that needs a real server (MinIO, Prometheus, Airflow, kube-apiserver, ...) starts
it through :class:`ManagedProcess` so that:

* it binds to 127.0.0.1 on a port chosen at run time (:func:`free_port`);
* it runs in its own process group, so stopping it also stops the children it forked;
* its output goes to a log file that is printed when readiness times out;
* it is stopped by PID (SIGTERM, then SIGKILL after ``stop_timeout_s``) even when the test fails;
* it gets SIGKILL when the thread that started it dies (:func:`~tests.support.lifetime.die_with_parent`),
  so a crashed or killed test process leaves no server behind: start it from a thread that lives as
  long as the server should (pytest's main thread).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support.lifetime import die_with_parent

# Ports handed out by free_port: below the kernel's ephemeral range (ip_local_port_range, 32768-60999
# by default), so an outgoing connection of any process can never take a port between our check and
# the server's bind; and reserved across processes with a lock file held for the life of the test
# process, so two test sessions on one machine (CI beside a developer's run) never pick the same one.
PORT_RANGE = (20000, 32767)
_PORT_LOCK_DIR = Path(os.environ.get("TRAINFLOW_PORT_LOCK_DIR", "/tmp/trainflow-ports"))
_reserved: dict[int, int] = {}  # port -> fd of its held lock file (released when the process exits)

#: ``(name, seconds, sigkilled)`` of every :meth:`ManagedProcess.stop` in this test process: the
#: session writes those that were SIGKILLed to ``build/test-artifacts/`` (tests/conftest.py), so a
#: server that ignores SIGTERM shows up as time its teardown waited for nothing.
STOPS: list[tuple[str, float, bool]] = []


def artifacts_root() -> Path:
    """Where tests keep files after they end: ``$TRAINFLOW_TEST_ARTIFACTS``, by default
    ``build/test-artifacts`` in the checkout (git-ignored; CI archives it)."""
    default = Path(__file__).resolve().parents[2] / "build" / "test-artifacts"
    return Path(os.environ.get("TRAINFLOW_TEST_ARTIFACTS") or default)


def write_stops(worker: str = "") -> Path | None:
    """Write the SIGKILLed :data:`STOPS` of this test process to
    ``<artifacts>/sigkilled-processes[-<worker>].tsv`` (name, seconds from SIGTERM to exit); return
    the path, or None (and remove an earlier run's file) when every process exited on SIGTERM."""
    path = artifacts_root() / f"sigkilled-processes{'-' + worker if worker else ''}.tsv"
    killed = [(name, s) for name, s, was_killed in STOPS if was_killed]
    if not killed:
        path.unlink(missing_ok=True)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name}\t{s:.1f}\n" for name, s in killed))
    return path


def _ephemeral_range() -> tuple[int, int]:
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free and reserved for this process.

    The port is outside the kernel's ephemeral range (so no client connection takes it before
    the server binds it), free at the time of the call (a bind succeeds), and reserved for this
    test process by an ``flock`` on ``/tmp/trainflow-ports/<port>``, which other trainflow test
    processes respect. Reservations last until this process exits; a port is never handed out
    twice within one process.

    Raises:
        RuntimeError: no free port was found in :data:`PORT_RANGE` after 1,000 tries.
    """
    _PORT_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    low, high = PORT_RANGE
    eph_low, eph_high = _ephemeral_range()
    for _ in range(1000):
        port = random.randint(low, high)
        if port in _reserved or eph_low <= port <= eph_high:
            continue
        fd = os.open(_PORT_LOCK_DIR / str(port), os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # another test process holds it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                os.close(fd)
                continue
        _reserved[port] = fd
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {low}-{high} after 1,000 tries")


def http_ok(
    url: str, *, timeout_s: float = 2.0, expect: Callable[[httpx.Response], bool] | None = None, verify: Any = True
) -> bool:
    """True when ``GET url`` answers 2xx (and ``expect(response)`` holds, if given); ``verify`` as httpx's."""
    try:
        response = httpx.get(url, timeout=timeout_s, verify=verify)
    except httpx.HTTPError:
        return False
    return response.is_success and (expect is None or expect(response))


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


class ManagedProcess:
    """A background server process owned by a test.

    Args:
        name: label used in log file names and error messages.
        argv: the command line.
        log_dir: folder for ``<name>.log`` (stdout and stderr together).
        env: extra environment variables (merged over ``os.environ``).
        cwd: working directory.
        ready: callable polled until it returns True; ``None`` means "started is ready".
        ready_timeout_s: seconds to wait for ``ready`` before raising ``TimeoutError``.
        stop_timeout_s: seconds between SIGTERM and SIGKILL when stopping.

    Raises:
        TimeoutError: from :meth:`start` if the process does not become ready in time.
        RuntimeError: from :meth:`start` if the process exits before it is ready.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ready: Callable[[], bool] | None = None,
        ready_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_dir) / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.ready = ready
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.proc.pid

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [*die_with_parent(), *self.argv],  # start servers from a thread as long-lived as they are
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # own process group: stop() reaches forked children too
        )
        log.close()
        deadline = time.monotonic() + self.ready_timeout_s
        while self.ready is not None and not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"{self.name} not ready after {self.ready_timeout_s:.0f} s:\n{self.tail()}"
                )
            time.sleep(0.2)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``stop_timeout_s``; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            began, killed = time.monotonic(), False
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                killed = True
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
            STOPS.append((self.name, time.monotonic() - began, killed))
        # Children that ignored SIGTERM after the leader exited still share the group id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def tail(self, n_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "(no log)"
        return data[-n_bytes:].decode(errors="replace")

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
