"""Per-step training metrics: a JSONL file and a Prometheus ``/metrics`` endpoint, on rank 0.

JSONL records are one JSON object per line. Step records carry ``step``, ``epoch``, ``loss``,
``samples_per_s``, ``world_size``, ``lr``, ``ckpt_stall_s`` and ``time`` (Unix seconds); event
records carry ``event``: ``start``, ``resume``, ``first_step_after_resume``, ``checkpoint`` (a save
was staged; ``stall_s`` blocking seconds), ``checkpoint_deferred`` (a periodic save waits for the
previous persist; once per persist), ``checkpoint_committed`` / ``checkpoint_failed`` (from the
persist thread), ``preempted``, ``finished``.

Where the JSONL goes (``metrics_path``): a local file (appended; what ``trainflow run`` tails), or a
storage URI (``s3://bucket/<checkpoint root>/<job key>/metrics``) when rank 0 runs in a pod and the
step that reads the records runs elsewhere. On storage, each writer (one per worker-group start)
writes segment objects ``<start time ns>-<pid>-<random>/<seq>.jsonl``: the current segment is
rewritten every ``flush_interval_s`` seconds (and at once after ``start``, ``resume``,
``preempted`` and ``finished``) and a new one begun past 1 MiB, so a killed writer loses at most the
records of its last interval. :func:`read_jsonl` reads either form, records in write order.

A sink that cannot write (``ENOSPC``, a vanished mount) logs one warning and drops records: metrics
never stop training (review finding 7).

Checkpoint health on the endpoint: ``trainflow_checkpoint_failures_total`` (persists given up, fenced
included), ``trainflow_checkpoint_skipped_total`` (periodic saves deferred because the previous one
still persisted, once per persist; the deferred save is made at the first step after it),
``trainflow_checkpoint_last_commit_timestamp_seconds`` and ``trainflow_checkpoint_last_commit_age_seconds``
(seconds since the last commit, or since the start before the first one: alert when it exceeds a few
checkpoint intervals).

Prometheus metrics (all prefixed ``trainflow_``, labelled with ``job_key``) — the GPU scheduler reads
``trainflow_samples_per_second`` to learn each job's throughput at its current world size, and
``trainflow_step`` / ``trainflow_total_steps`` / ``trainflow_global_batch_size`` for the work left.

Adaptive batch only (``--adaptive-batch``; absent otherwise): step records also carry
``global_batch_size`` (current B), ``gradient_noise_scale`` (phi, samples; null until measured),
``adascale_gain``, ``progress_samples`` and ``remaining_samples`` (B0-equivalent samples) and
``goodput_samples_per_second`` (``{"<world size>": B0-equivalent samples/s}``); the endpoint adds
``trainflow_goodput_samples_per_second{job_key, world_size}`` (predicted goodput at every width the
job has run at and at 2x and 3x the widest of them -- ``goodput.PREDICTED_WIDTH_MULTIPLES`` --, each
at its best batch under the current phi), ``trainflow_remaining_samples`` and
``trainflow_gradient_noise_scale``, and ``trainflow_global_batch_size`` follows the current batch.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("trainflow.metrics")

#: Records that are written out at once rather than at the next interval.
URGENT_EVENTS = frozenset({"start", "resume", "preempted", "finished"})


class MetricsSink(Protocol):
    def record(self, rec: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullSink:
    """Used on ranks other than 0 and when metrics are off."""

    def record(self, rec: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class IdleMetricsSink(NullSink):
    """Serves ``/metrics`` with no trainflow series on ``addr:port``: what local rank 0 of a worker
    pod that does not hold rank 0 runs. The trainer pods' PodMonitor scrapes every worker pod
    (elastic rendezvous decides which one holds rank 0, so no label tells it apart), and a pod that
    served nothing was a target down (``up`` 0) for every worker but one, firing kube-prometheus'
    ``TargetDown`` for each multi-worker job. Never fails the worker: a port already taken (two
    agents on one machine) is logged and nothing is served."""

    def __init__(self, *, port: int, addr: str) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        try:
            start_http_server(port, addr=addr, registry=CollectorRegistry())
        except OSError as e:
            logging.getLogger(__name__).warning("not serving /metrics on %s:%d: %s", addr, port, e)


class JsonlSink:
    """Appends one JSON line per record: to a local file (flushed per line, so a reader can tail it),
    or to segment objects under a storage URI (see the module docstring).

    Args:
        path: a file path, or a storage URI (``s3://...``, ``file://...``) of the segments' folder.
        flush_interval_s: storage only: seconds between writes of the current segment.
    """

    def __init__(self, path: str | Path, *, flush_interval_s: float = 5.0) -> None:
        self._lock = threading.Lock()
        self.dropped = 0
        """Records that could not be written to a local file (full disk, ...)."""
        self._segments: _Segments | None = None
        if "://" in str(path):
            self.path = None
            self._segments = _Segments(str(path), flush_interval_s=flush_interval_s)
            return
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", buffering=1)

    def record(self, rec: dict[str, Any]) -> None:
        line = json.dumps({"time": time.time(), **rec})
        if self._segments is not None:
            self._segments.add(line, urgent=rec.get("event") in URGENT_EVENTS)
            return
        with self._lock:
            try:
                self._f.write(line + "\n")
            except OSError as e:  # ENOSPC, EIO: drop the record, keep training
                self.dropped += 1
                if self.dropped == 1:
                    log.warning("metrics file %s not writable (%s): dropping records until it is", self.path, e)

    def close(self) -> None:
        if self._segments is not None:
            self._segments.close()
            return
        try:
            self._f.close()
        except OSError as e:  # flushing the buffer onto a full disk
            log.warning("closing metrics file %s: %s", self.path, e)


class _Segments:
    """JSONL lines to numbered segment objects under a storage root, written by a background thread
    (a slow or unreachable store never blocks training; a failed write is retried at the next flush)."""

    SEGMENT_BYTES = 1 << 20

    def __init__(self, uri: str, *, flush_interval_s: float) -> None:
        from trainflow.storage import storage_for

        self.storage = storage_for(uri)
        self.writer = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}"
        self.flush_interval_s = flush_interval_s
        self._seq = 0
        self._lines: list[str] = []
        self._size = 0
        self._dirty = False
        self._closed = False
        self._failures = 0
        self._cv = threading.Condition()
        self._io = threading.Lock()  # one write at a time (the thread's, or close's last one)
        self._thread = threading.Thread(target=self._loop, name="metrics-segments", daemon=True)
        self._thread.start()

    def add(self, line: str, *, urgent: bool) -> None:
        with self._cv:
            self._lines.append(line)
            self._size += len(line) + 1
            self._dirty = True
            if urgent:
                self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                if not self._closed:
                    self._cv.wait(self.flush_interval_s)
                if self._closed:
                    return
            self.flush()

    def flush(self) -> None:
        """Write the current segment if it changed; begin the next one once it is full."""
        with self._io:
            with self._cv:
                if not self._dirty:
                    return
                seq, lines = self._seq, list(self._lines)
                self._dirty = False
            key = f"{self.writer}/{seq:06d}.jsonl"
            try:
                with self.storage.open_write(key) as f:
                    f.write(("\n".join(lines) + "\n").encode())
            except Exception as e:  # storage errors of any backend: keep the lines, try again later
                with self._cv:
                    self._dirty = True
                self._failures += 1
                if self._failures in (1, 10, 100):
                    log.warning("writing metrics segment %s failed (%d times): %s", key, self._failures, e)
                return
            with self._cv:
                if self._size >= self.SEGMENT_BYTES and self._seq == seq:
                    del self._lines[: len(lines)]
                    self._size = sum(len(line) + 1 for line in self._lines)
                    self._seq += 1
                    self._dirty = bool(self._lines)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)
        self.flush()


class PrometheusSink:
    """Serves ``/metrics`` on ``addr:port`` from a private registry (prometheus_client)."""

    def __init__(self, *, port: int, addr: str, job_key: str,
                 last_commit_unix_s: Callable[[], float | None] = lambda: None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = CollectorRegistry()
        lbl = ["job_key"]
        g = lambda name, doc: Gauge(name, doc, lbl, registry=self.registry).labels(job_key)  # noqa: E731
        c = lambda name, doc: Counter(name, doc, lbl, registry=self.registry).labels(job_key)  # noqa: E731
        self.step = g("trainflow_step", "Completed optimizer steps.")
        self.epoch = g("trainflow_epoch", "Current epoch (0-based).")
        self.loss = g("trainflow_loss", "Training loss of the last step (global mean).")
        self.samples_per_s = g("trainflow_samples_per_second", "Training throughput of the last step, all ranks.")
        self.world_size = g("trainflow_world_size", "Ranks in the current worker group.")
        self.total_steps = g("trainflow_total_steps", "Optimizer steps the job trains for (fixed epochs).")
        self.global_batch = g("trainflow_global_batch_size", "Samples per optimizer step, all ranks.")
        self.stall_s = g("trainflow_checkpoint_stall_seconds", "Blocking time of the last checkpoint save.")
        self.persist_s = g("trainflow_checkpoint_persist_seconds", "Background persist time of the last checkpoint.")
        self.committed = c("trainflow_checkpoints_committed", "Checkpoints committed.")
        self.resumes = c("trainflow_resumes", "Starts that resumed from a checkpoint.")
        self.ckpt_failures = c("trainflow_checkpoint_failures", "Checkpoint persists given up (after retries, or fenced).")
        self.ckpt_skipped = c("trainflow_checkpoint_skipped",
                              "Periodic checkpoints deferred because the previous one was still persisting.")
        started = time.time()
        last_commit = g("trainflow_checkpoint_last_commit_timestamp_seconds",
                        "Unix time of the last committed checkpoint (0 before the first).")
        last_commit.set_function(lambda: last_commit_unix_s() or 0.0)
        age = g("trainflow_checkpoint_last_commit_age_seconds",
                "Seconds since the last committed checkpoint (since the start before the first one).")
        age.set_function(lambda: time.time() - (last_commit_unix_s() or started))
        self._job_key = job_key
        self._adaptive: dict[str, Any] | None = None  # created on the first adaptive-batch record
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)

    def record(self, rec: dict[str, Any]) -> None:
        if "step" in rec and "loss" in rec:
            self.step.set(rec["step"])
            self.epoch.set(rec["epoch"])
            self.loss.set(rec["loss"])
            self.samples_per_s.set(rec["samples_per_s"])
            self.world_size.set(rec["world_size"])
        if rec.get("event") == "start":
            self.total_steps.set(rec.get("total_steps", 0))
            self.global_batch.set(rec.get("global_batch_size", 0))
        if rec.get("event") == "checkpoint":
            self.stall_s.set(rec.get("stall_s", 0.0))
            if rec.get("outcome") == "skipped":
                self.ckpt_skipped.inc()
        if rec.get("event") == "checkpoint_deferred":  # a periodic save waiting for the previous persist
            self.ckpt_skipped.inc()
        if rec.get("event") == "checkpoint_failed":
            self.ckpt_failures.inc()
        if rec.get("event") == "checkpoint_committed":
            self.persist_s.set(rec["persist_s"])
            self.committed.inc()
        if rec.get("event") == "resume":
            self.resumes.inc()
        if "remaining_samples" in rec:
            self._record_adaptive(rec)

    def _record_adaptive(self, rec: dict[str, Any]) -> None:
        from prometheus_client import Gauge

        if self._adaptive is None:
            self._adaptive = {
                "goodput": Gauge("trainflow_goodput_samples_per_second",
                                 "Predicted goodput (samples/s at the base batch B0) at each world size the job has "
                                 "run at, at its best global batch under the current gradient noise scale.",
                                 ["job_key", "world_size"], registry=self.registry),
                "remaining": Gauge("trainflow_remaining_samples", "Work left, in samples at the base batch B0.",
                                   ["job_key"], registry=self.registry).labels(self._job_key),
                "phi": Gauge("trainflow_gradient_noise_scale", "Gradient noise scale phi = tr(Sigma)/|G|^2 (samples).",
                             ["job_key"], registry=self.registry).labels(self._job_key),
            }
        self._adaptive["remaining"].set(rec["remaining_samples"])
        if rec.get("gradient_noise_scale") is not None:
            self._adaptive["phi"].set(rec["gradient_noise_scale"])
        self.global_batch.set(rec["global_batch_size"])
        for world, value in rec.get("goodput_samples_per_second", {}).items():
            self._adaptive["goodput"].labels(self._job_key, str(world)).set(value)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class FanOut:
    def __init__(self, sinks: list[MetricsSink]) -> None:
        self.sinks = sinks

    def record(self, rec: dict[str, Any]) -> None:
        for s in self.sinks:
            try:
                s.record(rec)
            except Exception as e:  # one broken sink must not stop the others, nor training
                log.warning("metrics sink %s failed: %s", type(s).__name__, e)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics file or storage URI, in write order (a torn line, from a killed
    writer, is ignored; a missing file or empty prefix has none)."""
    if "://" in str(path):
        return [rec for _key, lines in read_segments(str(path)) for rec in _parse_lines(lines)]
    out = []
    try:
        with Path(path).open() as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        return []
    return out


def read_segments(uri: str) -> list[tuple[str, list[str]]]:
    """``(key, lines)`` of every segment under a metrics URI, in write order (writer start, then seq)."""
    from trainflow.storage import ObjectNotFoundError, read_bytes, storage_for

    storage = storage_for(uri)
    out = []
    for key in storage.list(""):
        if not key.endswith(".jsonl"):
            continue
        try:
            out.append((key, read_bytes(storage, key).decode(errors="replace").splitlines()))
        except ObjectNotFoundError:
            continue
    return out


def _parse_lines(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
