"""Follow the worker pods' logs into the launcher's own output, each line prefixed by its pod.

On Kubeflow the train step's log is what the KFP UI shows; the training runs in other pods. The
runner calls :meth:`WorkerLogs.sync` with the worker pods on every poll; each container *instance*
(pod uid + restart count) that has started gets one follower thread, which streams
``GET pods/<name>/log?follow=true&timestamps=true`` and prints ``[<pod>] <line>``. So:

* a recreated pod (new uid, same name) and a restarted container (restart count + 1) are followed
  anew; an instance is never followed twice, so no line is printed twice;
* a stream the API server cuts while the container still runs is reopened with ``sinceSeconds``
  from the last line's timestamp, and lines at or before that timestamp are dropped;
* on re-attaching to a running job (a retried launcher) only the last ``tail_lines`` of each
  running container are printed, not the whole history;
* a follower that fails ``_RETRIES`` times in a row (an API-server outage, a node's kubelet gone,
  RBAC without ``pods/log``, no kubelet behind a fake node) stops, says so once per pod, and the
  next :meth:`sync` after a pause (``resume_after_s``, doubling up to ``max_resume_after_s``)
  follows the instance again from its last printed line: after an outage the step's log goes on
  with the lines written meanwhile, none twice; logs never fail a launch.

At most ``max_streams`` (32) instances are followed at once, the pods in name order (worker 0
first), and a line says so once: each stream holds one of the API client's connections (httpx's
pool: 100), which the launcher shares with its own reads, so a job of ~100 running workers left
its status reads waiting for a free connection until they timed out as an API outage.

The threads are daemons: the process does not wait for them, and :meth:`close` stops new output.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

_RETRIES = 3


def split_timestamp(line: str) -> tuple[str, str]:
    """``"2026-11-23T10:00:00.123456789Z text"`` → (timestamp, text); ("", line) without one."""
    head, sep, rest = line.partition(" ")
    if sep and len(head) >= 20 and head[4] == "-" and head[10] == "T" and head.endswith("Z"):
        return head, rest
    return "", line


def _parse(ts: str) -> dt.datetime | None:
    try:  # RFC3339Nano: trim to microseconds for fromisoformat
        main, _, frac = ts.rstrip("Z").partition(".")
        return dt.datetime.fromisoformat(main + (f".{frac[:6]}" if frac else "")).replace(tzinfo=dt.UTC)
    except ValueError:
        return None


class WorkerLogs:
    """Streams worker container logs to ``write`` (default: standard output, flushed per line).

    Args:
        client: a lightkube ``Client``.
        namespace: the pods' namespace.
        container: the container to follow (the PyTorchJob's ``pytorch``).
        write: called with each output line (thread-safe: calls are serialized).
        tail_lines: lines of history printed for containers already running when first seen after
            a re-attach (see :meth:`sync`).
        resume_after_s: seconds before a follower that gave up is started again by :meth:`sync`
            (doubled after each further give-up of the same instance, up to ``max_resume_after_s``).
        max_streams: instances followed at once (see the module docstring); the others are
            followed by a later :meth:`sync` once a stream ends.
    """

    def __init__(self, client: Any, namespace: str, *, container: str = "pytorch",
                 write: Callable[[str], None] | None = None, tail_lines: int = 50,
                 resume_after_s: float = 10.0, max_resume_after_s: float = 60.0, max_streams: int = 32) -> None:
        self.client = client
        self.max_streams = max_streams
        self._capped_said = False
        self.namespace = namespace
        self.container = container
        self._write = write or _stdout
        self.tail_lines = tail_lines
        self._lock = threading.Lock()
        self.resume_after_s = resume_after_s
        self.max_resume_after_s = max_resume_after_s
        self._state = threading.Lock()  # guards _started and _paused (sync's thread and the followers)
        self._started: set[tuple[str, int]] = set()
        #: Instances whose follower gave up: (monotonic time to resume at, last printed timestamp, give-ups).
        self._paused: dict[tuple[str, int], tuple[float, dt.datetime | None, int]] = {}
        self._unreadable: set[str] = set()
        self._closed = threading.Event()
        self.threads: list[threading.Thread] = []

    def emit(self, text: str) -> None:
        if self._closed.is_set():
            return
        with self._lock:
            self._write(text)

    def sync(self, pods: Iterable[Mapping[str, Any]], *, history: bool = True) -> None:
        """Start a follower for every container instance in ``pods`` (dicts) that has started and is
        not followed yet. ``history=False`` (a re-attach) prints only the last ``tail_lines`` of
        instances that are already running."""
        if self._closed.is_set():
            return
        streams = sum(t.is_alive() for t in self.threads)
        for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("name", "")):
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            name, uid = meta.get("name", ""), meta.get("uid", "")
            for cs in status.get("containerStatuses") or []:
                if cs.get("name") != self.container:
                    continue
                state = cs.get("state") or {}
                if state.get("running") is None and state.get("terminated") is None:
                    continue  # not started: nothing to read yet
                instance = (uid, int(cs.get("restartCount") or 0))
                with self._state:
                    if instance in self._started:
                        continue
                    if streams >= self.max_streams:
                        if not self._capped_said:
                            self._capped_said = True
                            self.emit(f"(following the logs of {self.max_streams} workers at a time; the others "
                                      f"when one ends: kubectl logs -n {self.namespace} <pod> for the rest)")
                        return
                    paused = self._paused.get(instance)
                    if paused is not None and time.monotonic() < paused[0]:
                        continue
                    self._paused.pop(instance, None)
                    self._started.add(instance)
                if paused is not None:  # resume after the last line printed, not from a tail
                    last, give_ups = paused[1], paused[2]
                    tail = None
                else:
                    last, give_ups = None, 0
                    tail = None if history or state.get("running") is None else self.tail_lines
                t = threading.Thread(target=self._follow, args=(name, instance, tail, last, give_ups), daemon=True,
                                     name=f"logs-{name}-{instance[1]}")
                self.threads.append(t)
                t.start()
                streams += 1

    def close(self) -> None:
        """Stop printing (followers end with their streams)."""
        self._closed.set()

    def _follow(self, pod: str, instance: tuple[str, int], tail_lines: int | None,
                last: dt.datetime | None = None, give_ups: int = 0) -> None:
        failures = 0
        resumed = last is not None or give_ups > 0
        while not self._closed.is_set():
            since = None
            if last is not None:
                since = max(1, int((dt.datetime.now(dt.UTC) - last).total_seconds()) + 1)
            try:
                for raw in self.client.log(pod, namespace=self.namespace, container=self.container, follow=True,
                                           timestamps=True, tail_lines=tail_lines if last is None else None,
                                           since=since, newlines=False):
                    ts, text = split_timestamp(raw)
                    when = _parse(ts) if ts else None
                    if when is not None and last is not None and when <= last:
                        continue  # already printed before the stream was reopened
                    last = when or last
                    if resumed:
                        resumed = False
                        if pod in self._unreadable:
                            self._unreadable.discard(pod)
                            self.emit(f"[{pod}] (logs resumed)")
                    self.emit(f"[{pod}] {text}")
                    failures = 0
            except Exception as err:  # the API's errors and httpx's: logs are best effort
                failures += 1
                if failures >= _RETRIES:
                    self._give_up(pod, instance, last, give_ups, " ".join(str(err).split()))
                    return
                time.sleep(min(8.0, 0.5 * 2**failures))
                continue
            running = self._still_running(pod, instance)
            if running is False:
                return  # this instance ended: its stream is complete (a restart has its own follower)
            if running is None:  # the API server did not say (an outage cut the stream): a failure
                failures += 1
                if failures >= _RETRIES:
                    self._give_up(pod, instance, last, give_ups, "its stream ended and the pod cannot be read")
                    return
                time.sleep(min(8.0, 0.5 * 2**failures))
                continue
            time.sleep(0.5)

    def _give_up(self, pod: str, instance: tuple[str, int], last: dt.datetime | None, give_ups: int,
                 why: str) -> None:
        """Stop following ``instance`` for now: say so once per pod, and let a :meth:`sync` after the
        pause follow it again from ``last``."""
        if pod not in self._unreadable:
            self._unreadable.add(pod)
            self.emit(f"[{pod}] (logs unavailable: {why[:200]}; trying again later)")
        pause = min(self.max_resume_after_s, self.resume_after_s * 2**give_ups)
        with self._state:
            self._started.discard(instance)
            self._paused[instance] = (time.monotonic() + pause, last, give_ups + 1)

    def _still_running(self, pod: str, instance: tuple[str, int]) -> bool | None:
        """Whether the container instance we follow (pod uid, restart count) is the one running;
        ``None`` when the pod cannot be read (the API server does not answer)."""
        from lightkube.resources.core_v1 import Pod

        try:
            p = self.client.get(Pod, pod, namespace=self.namespace)
        except Exception as err:
            if getattr(getattr(err, "status", None), "code", None) == 404:
                return False  # the pod is gone: so is the instance
            return None
        if p.metadata.uid != instance[0]:
            return False
        for cs in (p.status and p.status.containerStatuses) or []:
            if cs.name == self.container:
                return bool(cs.state and cs.state.running) and int(cs.restartCount or 0) == instance[1]
        return False


def _stdout(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
