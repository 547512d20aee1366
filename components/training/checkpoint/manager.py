"""Two-phase, verified, retained checkpoints over a :class:`CheckpointStorage`.

Saving has two phases (CheckFreq, Mohan et al., FAST'21; ``torch.distributed.checkpoint.async_save``):

1. **stage** (blocking, short): every tensor of the state tree is copied into CPU buffers that are
   reused from save to save; non-tensor leaves are deep-copied. On CUDA the copies run on a side
   stream into pinned memory and :meth:`CheckpointManager.wait_for_staging` — called by the trainer
   right before ``optimizer.step()`` — keeps the weights from changing until the copies are done.
   What the forward changes in place (BatchNorm's buffers) the trainer copies on the main stream
   when it saves (``trainer.model_state_for_checkpoint``). Each source tensor is marked as used
   by the side stream (``record_stream``), so a temporary one is not reused before its copy ran.
   On CPU the copy is synchronous, so the weights cannot change while it runs.
2. **persist** (background thread): ``torch.save`` of the staged tree into ``state.pt`` while hashing
   it, then ``MANIFEST.json`` (sizes + SHA-256 of every file) written **last**; then, in the same
   thread, retention. A failing persist is retried with exponential backoff (tenacity); training never
   waits for it.

At most one save is in flight: a periodic save that comes due while the previous persist still runs
waits (:meth:`CheckpointManager.ready_for_periodic`, logged and counted once per persist) and is made
at the first step after it, so a slow or unreachable store never stalls training. Blocking saves
(the final one, and the one made on SIGTERM) wait for the in-flight persist to commit first — a
retention still running after it stops early: between deletions, and within the verification of an
older checkpoint, which reads on a thread of its own and is abandoned (nothing deleted that round) so
the save never waits for the read of a big checkpoint. A blocking save with a deadline (SIGTERM) returns once
its own manifest is committed: retention runs after it, never inside the deadline; one without a
deadline (the final save) also waits for its retention.

Loading walks committed checkpoints newest first; a checkpoint whose manifest is missing or invalid, or
whose files are missing, truncated, fail their SHA-256 or cannot be unpickled, is skipped with a warning
and the previous one is used. A read that fails for another reason (an ``OSError`` such as EIO or
ESTALE, an S3 transport error, a denied read, memory running out) says nothing about the checkpoint:
it is a :class:`CheckpointStorageError` with the original error as its cause, which fails the load (the
worker exits 1 and is retried for an outage, 2 for a refusal such as AccessDenied or EACCES:
``components.training.__main__.transient_storage_failure`` decides) and makes retention skip its round
instead of deleting. Retention keeps the newest ``keep_last_k`` checkpoints that are known
good — committed by this manager, or verified (sizes + SHA-256) once — never deletes a good one newer
than its own newest commit, and deletes checkpoints found corrupt; deleting removes the manifest
first, so a half-deleted checkpoint is never seen as committed. Leftovers of interrupted writes (local temp
files, unfinished S3 multipart uploads) are removed when the writer claims the key and, once old,
at every retention. Listed keys that are no valid storage key (``step-0000000001//notes.txt``, legal
on S3) are not ours: they are ignored (logged once), never read or deleted. Any other failure in
retention is logged as an error and the next retention tries again.

**Writer fencing.** Rank 0 of one worker group is the only writer *within* a job, but a job key can
gain a second writer (a run resubmitted while the old one still saves on SIGTERM, an orphaned
PyTorchJob still training beside its retry). Every writer therefore first claims a *generation*
with a create-only write of ``writers/g<N>.json`` (N = newest + 1; ``link(2)`` locally,
``If-None-Match: *`` on S3) — the newest claim owns the key. Before each manifest write and before
retention the writer lists ``writers/``; finding a newer claim it stops writing and deleting for good
(:class:`WriterFencedError`; the trainer exits 2). Each generation writes its own state file, and the
manifest itself is create-only, so interleaved writes of one step can never produce a manifest whose
checksum describes the other writer's bytes.

Call order, per rank (the trainer does this; see ``components.training.trainer``):

* every rank: ``load_step(step)`` for the step rank 0 chose with ``latest_committed_step()`` /
  ``load_latest()``;
* rank 0 only (the single writer): ``claim()`` before loading, ``save(...)``, ``wait_for_staging()``
  before each ``optimizer.step()``, ``close()`` at exit. Per-rank state (RNG) is gathered to rank 0 by the
  trainer before ``save``.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import io
import json
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO

import torch
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from components.training.checkpoint import layout
from trainflow.storage import (
    CheckpointStorage,
    CheckpointStorageError,
    ObjectExistsError,
    ObjectNotFoundError,
    ReadAbandoned,
    read_bytes,
    validate_key,
    write_bytes,
)

log = logging.getLogger("trainflow.checkpoint")


class CheckpointCorruptError(RuntimeError):
    """A checkpoint's manifest or files are missing, unreadable or fail their checksum."""


class WriterFencedError(RuntimeError):
    """A newer writer generation claimed this job key: this writer must stop writing (permanently)."""


class CheckpointRefusedError(ValueError):
    """A state ``torch.load(weights_only=True)`` refuses to unpickle (a type outside its allow-list,
    e.g. ``collections.deque`` in a task's state): refused at the save that first holds such a value,
    and at load for a checkpoint whose bytes are fine (its checksum passed). Permanent: retrying cannot
    help, and the checkpoint is not skipped as corrupt (that would roll training back)."""


STALE_WRITE_AGE_S = 600.0
"""Retention removes leftovers of interrupted writes once they are this old (a claim removes all)."""

HURRY_POLL_S = 0.05
"""How often (seconds) retention, while a verification reads an older checkpoint, looks whether a
blocking save is waiting: the most such a save waits for a verification under way."""


class _VerificationAbandoned(Exception):
    """Retention gave up the verification that raises this (a blocking save was waiting): the
    checkpoint is neither good nor corrupt as far as anyone knows."""


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    step: int
    state: dict[str, Any]
    """The tree given to :meth:`CheckpointManager.save`, with CPU tensors."""
    manifest: dict[str, Any]
    load_seconds: float


@dataclass(slots=True)
class CheckpointStats:
    """Counters the trainer exports as metrics (units in names)."""

    committed: int = 0
    skipped_in_flight: int = 0
    failed: int = 0
    last_commit_unix_s: float | None = None
    """Wall-clock time of the last commit (for the age-of-last-commit metric)."""
    stall_seconds_total: float = 0.0
    last_stall_seconds: float = 0.0
    last_persist_seconds: float = 0.0
    persist_seconds_total: float = 0.0
    last_committed_step: int | None = None
    last_size_bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How a failed persist is retried (exponential backoff, ``wait = min(max_wait_s, base_s * 2**n)``)."""

    attempts: int = 5
    base_s: float = 1.0
    max_wait_s: float = 30.0


class _HashingWriter:
    """A write-only file wrapper that counts bytes and SHA-256s them on the way through."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = self._f.write(data)
        self.sha256.update(data)
        self.size_bytes += len(data)
        return n if n is not None else len(data)

    def flush(self) -> None:
        self._f.flush()


def _verify(f: BinaryIO, *, size_bytes: int, sha256: str, what: str,
            abandon: threading.Event | None = None) -> None:
    """Check that ``f`` holds ``size_bytes`` bytes whose SHA-256 is ``sha256``, reading it in 1 MiB
    chunks, then rewind it.

    Raises:
        CheckpointCorruptError: the size or the SHA-256 differs.
        _VerificationAbandoned: ``abandon`` was set before a chunk was read.
    """
    h = hashlib.sha256()
    n = 0
    while True:
        if abandon is not None and abandon.is_set():
            raise _VerificationAbandoned(f"{what}: verification abandoned after {n} bytes")
        chunk = f.read(1 << 20)
        if not chunk:
            break
        h.update(chunk)
        n += len(chunk)
    if n != size_bytes:
        raise CheckpointCorruptError(f"{what}: {n} bytes, manifest says {size_bytes}")
    if h.hexdigest() != sha256:
        raise CheckpointCorruptError(f"{what}: SHA-256 mismatch")
    f.seek(0)


def _cannot_read_now(e: BaseException | None) -> bool:
    """Whether ``e``, or an exception it was raised from, is the machine or the storage failing — an
    ``OSError`` (EIO, ESTALE, ETIMEDOUT, ...; torch wraps one raised inside ``torch.load`` in a
    ``SystemError``) or memory running out — rather than bytes that cannot be unpickled."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError | MemoryError | torch.OutOfMemoryError):
            return True
        if isinstance(e, RuntimeError) and "can't allocate memory" in str(e):  # torch's CPU allocator
            return True
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    return False


class _Stager:
    """Copies a state tree into reusable CPU buffers (pinned + side stream when tensors are on CUDA)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._stream: Any = None

    def stage(self, tree: Any) -> tuple[Any, Any]:
        """Return ``(staged_tree, cuda_event_or_None)``; the event fires when all copies are done."""
        on_cuda = torch.cuda.is_available() and _any_cuda(tree)
        if not on_cuda:
            return self._copy(tree, (), non_blocking=False), None
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        self._stream.wait_stream(torch.cuda.current_stream())  # weights written by the last step
        with torch.cuda.stream(self._stream):
            staged = self._copy(tree, (), non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return staged, event

    def _copy(self, obj: Any, path: tuple, *, non_blocking: bool) -> Any:
        if isinstance(obj, torch.Tensor):
            src = obj.detach()
            buf = self._buffers.get(path)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.is_cuda)
                self._buffers[path] = buf
            buf.copy_(src, non_blocking=non_blocking)
            if src.is_cuda:  # on the side stream: keep src's memory from reuse until this copy ran
                src.record_stream(torch.cuda.current_stream())
            return buf
        if isinstance(obj, dict):
            return {k: self._copy(v, (*path, k), non_blocking=non_blocking) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            items = [self._copy(v, (*path, i), non_blocking=non_blocking) for i, v in enumerate(obj)]
            return type(obj)(items) if isinstance(obj, list) else tuple(items)
        return copy.deepcopy(obj)


def _any_cuda(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.is_cuda
    if isinstance(obj, dict):
        return any(_any_cuda(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return any(_any_cuda(v) for v in obj)
    return False


@dataclass(slots=True)
class _InFlight:
    step: int
    future: Future
    """The whole background task: persist, then retention."""
    committed: Future
    """Done once the persist committed or gave up (before retention): what blocking saves wait for."""
    started_s: float
    extra: dict = field(default_factory=dict)


class CheckpointManager:
    """Saves, verifies, loads and retains checkpoints of one training job.

    Args:
        storage: where this job's checkpoints live (already scoped to the job key).
        keep_last_k: known-good checkpoints kept (>= 1).
        retry: how a failed persist is retried.
        clock: monotonic seconds; injectable for tests.
        manifest_extra: constant fields copied into every manifest (job key, versions, ...).
        on_event: called from the persist thread with ``{"event": "checkpoint_committed", "step",
            "persist_s", "size_bytes"}`` or ``{"event": "checkpoint_failed", "step", "error"}``
            (``"fenced": True`` when a newer writer took the key). Exceptions it raises are logged
            and ignored: a full disk under the metrics file never stops checkpointing.

    Raises:
        ValueError: ``keep_last_k < 1``.
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        *,
        keep_last_k: int = 3,
        retry: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        manifest_extra: dict[str, Any] | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        if keep_last_k < 1:
            raise ValueError(f"keep_last_k must be >= 1, got {keep_last_k}")
        self.storage = storage
        self.keep_last_k = keep_last_k
        self.retry = retry or RetryPolicy()
        self.clock = clock
        self.manifest_extra = dict(manifest_extra or {})
        self.on_event = on_event or (lambda event: None)
        self.stats = CheckpointStats()
        self.generation: int | None = None
        """This writer's generation once :meth:`claim` ran."""
        self.fenced: WriterFencedError | None = None
        self.last_failure: BaseException | None = None
        """Why the newest persist that failed did (its last attempt's error); None after a commit."""
        self._loadable_types: set[type] = set()  # of values a weights_only load was shown to accept
        """Set (for good) once a newer writer generation is seen."""
        self._good: set[int] = set()  # steps known to verify: committed here, or verified once
        self._stager = _Stager()
        self._staging_event: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-persist")
        # retention's verifications read here, so the persist thread is free for a blocking save at once
        self._verifier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-verify")
        self._verifying: Future[Any] | None = None  # the newest verification submitted
        self._in_flight: _InFlight | None = None
        self._lock = threading.Lock()
        self._hurry = threading.Event()  # a blocking save waits: the running retention stops early
        self._foreign_keys: set[str] = set()  # listed keys that are no valid storage key (logged once each)

    # ------------------------------------------------------------------------ writer fencing
    def claim(self) -> int:
        """Claim the next writer generation of this job key (create-only), then remove leftovers of
        interrupted writes. Returns the generation. Call once, before loading, on the writer rank.

        Raises:
            CheckpointStorageError: the storage failed.
        """
        if self.generation is not None:
            return self.generation
        generation = self._newest_generation() + 1
        record = {"pid": os.getpid(), "host": socket.gethostname(), "claimed_at": datetime.now(UTC).isoformat(),
                  **{k: v for k, v in self.manifest_extra.items() if k == "job_key"}}
        while True:
            try:
                write_bytes(self.storage, layout.writer_key(generation),
                            json.dumps({**record, "generation": generation}).encode(), create_only=True)
                break
            except ObjectExistsError:
                generation += 1  # another writer claimed it first
        self.generation = generation
        removed = self.storage.cleanup_incomplete(older_than_s=None)
        log.info("claimed writer generation %d%s", generation,
                 f"; removed {removed} leftover(s) of interrupted writes" if removed else "")
        return generation

    def _newest_generation(self) -> int:
        return max((g for k in self._list(layout.WRITERS_PREFIX) if (g := layout.parse_writer(k)) is not None),
                   default=0)

    def _list(self, prefix: str) -> list[str]:
        """``storage.list(prefix)`` without keys that are no valid storage key (``step-1//notes.txt``
        is legal on S3): no writer of ours made them, and deleting or reading them would fail. Each
        is logged once and left alone, never deleted."""
        keys = []
        for k in self.storage.list(prefix):
            try:
                keys.append(validate_key(k))
            except ValueError:
                if k not in self._foreign_keys:
                    self._foreign_keys.add(k)
                    log.info("ignoring object %r under %s: not a valid storage key, so not a checkpoint's; "
                             "it is left alone", k, self.storage.uri)
        return keys

    def check_fence(self) -> None:
        """Raise :class:`WriterFencedError` if a newer writer generation claimed the key."""
        if self.fenced is None and self.generation is not None:
            newest = self._newest_generation()
            if newest > self.generation:
                self.fenced = WriterFencedError(
                    f"writer generation {newest} took over this job key from generation {self.generation} "
                    f"({self.storage.uri}): another run is training it; this one stops writing")
        if self.fenced is not None:
            raise self.fenced

    # ----------------------------------------------------------------- discovery and loading
    def committed_steps(self) -> list[int]:
        """Steps whose manifest exists, newest first (manifests are not validated here)."""
        steps = {
            layout.parse_step(k)
            for k in self._list("step-")
            if layout.is_manifest_key(k)
        }
        return sorted((s for s in steps if s is not None), reverse=True)

    def read_manifest(self, step: int) -> dict[str, Any]:
        """The validated manifest of ``step``.

        Raises:
            CheckpointCorruptError: missing, unreadable or invalid, or for another step.
            CheckpointStorageError: the storage itself failed.
        """
        prefix = layout.step_prefix(step)
        try:
            data = self._read_bytes(layout.manifest_key(step))
        except ObjectNotFoundError as e:
            raise CheckpointCorruptError(f"{prefix}: no manifest") from e
        try:
            manifest = layout.validate_manifest(json.loads(data))
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointCorruptError(f"{prefix}: bad manifest: {e}") from e
        if manifest["step"] != step:
            raise CheckpointCorruptError(f"{prefix}: manifest is for step {manifest['step']}")
        return manifest

    def load_step(self, step: int, *, map_location: str | torch.device = "cpu",
                  load_state: bool = True) -> LoadedCheckpoint:
        """Load and verify one checkpoint (``load_state=False``: verify only; ``state`` is empty).

        Raises:
            CheckpointCorruptError: the manifest missing or invalid, a file missing, of the wrong size
                or failing its SHA-256, or ``torch.load`` failing to unpickle a file that verified.
            CheckpointStorageError: the storage or the machine failed while reading (unreachable,
                permission, an ``OSError`` such as EIO/ESTALE, a transport error, memory running out):
                the checkpoint may be good, so it is neither skipped nor deleted over it.
        """
        return self._load_step(step, map_location=map_location, load_state=load_state, abandon=None)

    def _load_step(self, step: int, *, map_location: str | torch.device, load_state: bool,
                   abandon: threading.Event | None) -> LoadedCheckpoint:
        """:meth:`load_step`, given up (:class:`_VerificationAbandoned`, ``step`` not marked good) once
        ``abandon`` is set: checked before each file of the step and each 1 MiB chunk read of it, and
        passed to the storage's ``open_read``, whose download (S3) stops at its next progress report."""
        t0 = self.clock()
        prefix = layout.step_prefix(step)
        manifest = self.read_manifest(step)
        state = None
        for name, meta in manifest["files"].items():
            key = f"{prefix}/{name}"
            if abandon is not None and abandon.is_set():
                raise _VerificationAbandoned(f"{prefix}: verification abandoned before {name}")
            try:
                validate_key(key)
            except ValueError as e:  # the manifest names something no writer of ours wrote
                raise CheckpointCorruptError(f"{prefix}: bad manifest: {e}") from e
            try:
                with self.storage.open_read(key, abandon=abandon) as f:
                    _verify(f, size_bytes=meta["size_bytes"], sha256=meta["sha256"], what=key, abandon=abandon)
                    if load_state and layout.is_state_name(name):
                        state = _torch_load(f, key=key, map_location=map_location)
            except (CheckpointCorruptError, CheckpointRefusedError, _VerificationAbandoned):
                raise
            except ReadAbandoned as e:  # the storage stopped its download of the file (S3)
                raise _VerificationAbandoned(f"{prefix}: verification abandoned while reading {name}") from e
            except ObjectNotFoundError as e:
                raise CheckpointCorruptError(f"{key} is missing") from e
            except CheckpointStorageError:
                raise
            except Exception as e:  # EIO/ESTALE mid-read, a transport error a backend let through: not corruption
                raise CheckpointStorageError(f"reading {key} failed: {describe_error(e)}") from e
        if load_state and not isinstance(state, dict):
            raise CheckpointCorruptError(f"{prefix}: its state file holds no state dict")
        self._good.add(step)
        return LoadedCheckpoint(step=step, state=state or {}, manifest=manifest, load_seconds=self.clock() - t0)

    def _read_bytes(self, key: str) -> bytes:
        """The whole object at ``key``. Raises :class:`ObjectNotFoundError` if absent and
        :class:`CheckpointStorageError` for any other failure (an ``OSError`` of a local read included)."""
        try:
            return read_bytes(self.storage, key)
        except CheckpointStorageError:
            raise
        except Exception as e:
            raise CheckpointStorageError(f"reading {key} failed: {describe_error(e)}") from e

    def latest_manifest(self) -> dict[str, Any] | None:
        """The manifest of the newest committed step that has a valid one (files not verified), or None."""
        for step in self.committed_steps():
            try:
                return self.read_manifest(step)
            except CheckpointCorruptError:
                continue
        return None

    def load_latest(self, *, map_location: str | torch.device = "cpu") -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, or ``None`` if there is none.

        Corrupt or partial checkpoints are skipped with a warning naming the reason.

        Raises:
            CheckpointStorageError: reading failed for another reason than corruption (see
                :meth:`load_step`); never answered by rolling back to an older checkpoint.
        """
        for step in self.committed_steps():
            try:
                return self.load_step(step, map_location=map_location)
            except CheckpointCorruptError as e:
                log.warning("skipping checkpoint at step %d: %s; trying the previous one", step, e)
        return None

    # ----------------------------------------------------------------------------- saving
    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        blocking: bool = False,
        manifest_fields: dict[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> str:
        """Stage ``state`` and persist it in the background (or synchronously if ``blocking``).

        Args:
            step: the global step the state belongs to (completed steps).
            state: a tree of dicts/lists/tuples with tensors and picklable-with-``weights_only`` leaves.
            blocking: wait for the in-flight persist to commit, then persist this one before returning
                (and its retention too, unless ``deadline_s`` is given).
            manifest_fields: extra JSON fields for this checkpoint's manifest (epoch, world size...).
            deadline_s: blocking only: give up after this many seconds in all (waiting for the
                in-flight persist, retries included); the persist may still finish in the background.
                Returns at the commit: retention runs afterwards, outside the deadline.

        Returns:
            ``"staged"`` (persisting in the background), ``"committed"`` / ``"failed"`` (blocking;
            ``"failed"`` also when the deadline passed first), ``"skipped"`` (a previous persist is
            still in flight) or ``"fenced"`` (a newer writer owns the key; nothing is written).
        """
        t0 = self.clock()
        deadline = None if deadline_s is None else t0 + deadline_s
        if self.fenced is not None:
            return "fenced"
        self._check_loadable(state)
        if self._in_flight is not None and not self._in_flight.future.done():
            if not blocking:
                self.stats.skipped_in_flight += 1
                log.warning("checkpoint at step %d skipped: the save of step %d is still persisting", step,
                            self._in_flight.step)
                return "skipped"
            self._hurry.set()  # its retention, if running, stops at its next step: this save goes first
            try:
                self._in_flight.committed.result(None if deadline is None else max(0.0, deadline - self.clock()))
            except TimeoutError:
                log.warning("checkpoint at step %d NOT saved: the save of step %d still persists after %.1f s",
                            step, self._in_flight.step, deadline_s)
                return "failed"
        staged, event = self._stager.stage(state)
        self._staging_event = event
        fields = {**self.manifest_extra, **(manifest_fields or {})}
        committed: Future = Future()
        future = self._executor.submit(self._persist, step, staged, event, fields, deadline, committed)
        self._in_flight = _InFlight(step=step, future=future, committed=committed, started_s=t0)
        stall = self.clock() - t0
        timed_out = False
        if blocking:
            try:  # with a deadline, until the commit: retention runs after it, outside the deadline
                committed.result(timeout=None if deadline is None else max(0.0, deadline - self.clock()))
                if deadline is None:
                    future.result()  # no deadline to keep: the retention too (the final save)
            except TimeoutError:
                timed_out = True
                log.warning("checkpoint at step %d NOT saved within its %.1f s deadline", step, deadline_s)
            stall = self.clock() - t0
        self.stats.last_stall_seconds = stall
        self.stats.stall_seconds_total += stall
        if not blocking:
            return "staged"
        if self.fenced is not None:
            return "fenced"
        return "committed" if not timed_out and self.stats.last_committed_step == step else "failed"

    def _check_loadable(self, state: dict[str, Any]) -> None:
        """Raise :class:`CheckpointRefusedError` if ``torch.load(weights_only=True)`` would refuse
        ``state``: a checkpoint that commits but can never be loaded would be skipped at every
        resume (training rolled back). Checked by a round trip of the state with its tensors left
        out, whenever the state holds a type no earlier save held (the first save, mostly)."""
        types: set[type] = set()
        skeleton = _skeleton(state, types)
        if types <= self._loadable_types:
            return
        buf = io.BytesIO()
        torch.save(skeleton, buf)
        buf.seek(0)
        try:
            torch.load(buf, weights_only=True)
        except pickle.UnpicklingError as e:  # the weights-only unpickler's refusal, and only it: anything
            # else raised meanwhile (a DataLoader worker's death, surfacing here through SIGCHLD) is
            # not this checkpoint's fault, and made a permanent failure (exit 2) of a preemption
            raise CheckpointRefusedError(
                f"this checkpoint could never be loaded back ({_weights_only_reason(e)}): keep the state to "
                "tensors, numbers, strings and dicts/lists/tuples of them, or allow its types with "
                "torch.serialization.add_safe_globals in the task's module") from e
        self._loadable_types |= types

    def ready_for_periodic(self, step: int) -> bool:
        """Whether a periodic save can start at ``step``: no persist (nor the retention after it) is
        still in flight.

        The trainer asks before it declares a save due, so a save that cannot start yet costs the
        steps nothing (no gathering of RNG states, no staging) and is made at the first step after
        the persist ends, instead of a whole interval later. A deferral is counted in
        ``stats.skipped_in_flight``, logged and recorded (a ``checkpoint_deferred`` event) once per
        in-flight persist."""
        inflight = self._in_flight
        if inflight is None or inflight.future.done():
            return True
        if not inflight.extra.get("deferral_logged"):
            inflight.extra["deferral_logged"] = True
            self.stats.skipped_in_flight += 1
            log.warning("checkpoint at step %d deferred: the save of step %d is still persisting", step,
                        inflight.step)
            self._emit({"event": "checkpoint_deferred", "step": step, "persisting_step": inflight.step})
        return False

    def wait_for_staging(self) -> None:
        """Gate before ``optimizer.step()``: the current CUDA stream waits for the staging copies to
        have read the weights (this thread does not block). A no-op when nothing is staging."""
        if self._staging_event is not None:
            torch.cuda.current_stream().wait_event(self._staging_event)
            self._staging_event = None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the in-flight persist and the retention after it (``timeout_s`` seconds; ``None``:
        no limit); ``False`` if either is still running then."""
        inflight = self._in_flight
        if inflight is None:
            return True
        try:
            inflight.future.result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def verifying(self) -> bool:
        """Whether a retention verification (maybe an abandoned one) still reads on the verify thread.
        Python joins that thread at exit: a process that must exit now uses ``os._exit`` then (an
        abandoned read ends at its next chunk, an S3 download at its next progress report — on a
        stalled connection only at its read timeout —, :meth:`_verified_unless_hurried`)."""
        future = self._verifying
        return future is not None and not future.done()

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for the in-flight persist and its retention (up to ``timeout_s`` seconds; ``None``: no
        limit) and stop the persist thread, and the verify thread unless that retention still runs."""
        if self.wait(timeout_s):  # else the retention still running may need the verify thread
            self._verifier.shutdown(wait=False)  # an abandoned read stops at its next chunk
        self._executor.shutdown(wait=timeout_s is None, cancel_futures=False)

    def _emit(self, event: dict[str, Any]) -> None:
        try:
            self.on_event(event)
        except Exception as e:  # e.g. ENOSPC under the metrics file: never lose a checkpoint over it
            log.warning("checkpoint event %s not recorded: %s", event.get("event"), e)

    def _persist(self, step: int, staged: Any, event: Any, fields: dict[str, Any], deadline: float | None,
                 committed: Future) -> None:
        """Persist (``committed`` is resolved once it committed or gave up), then, if it committed, retention."""
        self._hurry.clear()  # a blocking save that hurried the previous retention is this one
        try:
            ok = self._commit(step, staged, event, fields, deadline)
        finally:
            committed.set_result(None)
        if ok:
            self._apply_retention(step)

    def _commit(self, step: int, staged: Any, event: Any, fields: dict[str, Any], deadline: float | None) -> bool:
        """Write ``step`` with retries; ``True`` once its manifest is committed, ``False`` if it gave up."""
        if event is not None:
            event.synchronize()
        t0 = self.clock()
        stop = stop_after_attempt(self.retry.attempts)
        if deadline is not None:
            stop = stop | stop_after_delay(max(0.0, deadline - t0))
        try:
            if self.generation is None:
                self.claim()
            for attempt in Retrying(
                stop=stop,
                wait=wait_exponential(multiplier=self.retry.base_s, max=self.retry.max_wait_s),
                retry=retry_if_exception_type(CheckpointStorageError),
                before_sleep=lambda rs: log.warning(
                    "checkpoint at step %d: persist attempt %d failed (%s); retrying",
                    step,
                    rs.attempt_number,
                    rs.outcome.exception() if rs.outcome else "?",
                ),
                reraise=True,
            ):
                with attempt:
                    size = self._write(step, staged, fields)
        except WriterFencedError as e:
            with self._lock:
                self.stats.failed += 1
                self.last_failure = e
            log.error("checkpoint at step %d NOT saved: %s", step, e)
            self._emit({"event": "checkpoint_failed", "step": step, "error": str(e)[:300], "fenced": True})
            return False
        except (CheckpointStorageError, CheckpointCorruptError, RetryError) as e:
            with self._lock:
                self.stats.failed += 1
                self.last_failure = e
            log.warning("checkpoint at step %d NOT saved after %d attempts: %s", step, self.retry.attempts, e)
            self._emit({"event": "checkpoint_failed", "step": step, "error": str(e)[:300]})
            return False
        except Exception as e:  # a bug, not a storage hiccup: never kill the persist thread silently
            with self._lock:
                self.stats.failed += 1
                self.last_failure = e
            log.exception("checkpoint at step %d NOT saved: unexpected error", step)
            self._emit({"event": "checkpoint_failed", "step": step, "error": "unexpected error"})
            return False
        persist_s = self.clock() - t0
        with self._lock:
            self.stats.committed += 1
            self.stats.last_committed_step = step
            self.stats.last_commit_unix_s = time.time()
            self.stats.last_persist_seconds = persist_s
            self.stats.persist_seconds_total += persist_s
            self.stats.last_size_bytes = size
            self.last_failure = None
        self._good.add(step)
        log.info("checkpoint at step %d committed (%.1f MB in %.2f s)", step, size / 1e6, persist_s)
        self._emit({"event": "checkpoint_committed", "step": step, "persist_s": persist_s, "size_bytes": size})
        return True

    def _write(self, step: int, staged: Any, fields: dict[str, Any]) -> int:
        """Write the state file, then — unless fenced — the manifest, create-only. Returns the state's size.

        A step that already has a manifest (committed by an earlier writer, e.g. a SIGTERM right after a
        resume) is left as it is: the state at that step is already saved.
        """
        assert self.generation is not None
        prefix = layout.step_prefix(step)
        self.check_fence()
        if layout.manifest_key(step) in self._list(layout.manifest_key(step)):
            size = self._existing_commit(step, ours=None)
            if size is not None:
                return size
        name = layout.state_name(self.generation)
        with self.storage.open_write(f"{prefix}/{name}") as f:
            writer = _HashingWriter(f)
            torch.save(staged, writer)  # type: ignore[arg-type]
        files = {name: {"size_bytes": writer.size_bytes, "sha256": writer.sha256.hexdigest()}}
        manifest = {
            **fields,
            "format": layout.FORMAT,
            "step": step,
            "writer_generation": self.generation,
            "created_at": datetime.now(UTC).isoformat(),
            "files": files,
        }
        data = json.dumps(manifest, indent=1).encode()
        for _ in range(2):
            self.check_fence()
            try:
                write_bytes(self.storage, layout.manifest_key(step), data, create_only=True)
                return writer.size_bytes
            except ObjectExistsError:  # another writer committed this step meanwhile
                size = self._existing_commit(step, ours=name)
                if size is not None:
                    return size
        raise CheckpointStorageError(f"step {step}: could not commit its manifest (another writer keeps replacing it)")

    def has_good(self, step: int) -> bool:
        """Whether ``step`` is committed and verifies (sizes + SHA-256; cached once verified)."""
        if step in self._good:
            return True
        try:
            self.load_step(step, load_state=False)
        except CheckpointCorruptError:
            return False
        return True

    def _existing_commit(self, step: int, *, ours: str | None) -> int | None:
        """``step`` already has a manifest. Ours (a retried write whose reply was lost) or an earlier
        writer's that verifies: keep it, drop our state file ``ours``, return its size. A newer
        writer's: we are fenced. An earlier writer's that is corrupt: un-commit it and return None
        (the caller writes its own)."""
        try:
            existing = json.loads(self._read_bytes(layout.manifest_key(step)))
            owner = existing.get("writer_generation", 0)
            size = sum(int(m["size_bytes"]) for m in existing["files"].values())
        except ObjectNotFoundError:
            return None  # deleted meanwhile
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            owner, size = 0, 0
        if owner == self.generation:
            return size
        if isinstance(owner, int) and self.generation is not None and owner > self.generation:
            self.check_fence()
        if not self.has_good(step):
            log.warning("step %d holds a corrupt checkpoint of writer generation %s: replacing it", step, owner)
            keys = self._list(layout.step_prefix(step) + "/")
            manifest = [k for k in keys if k == layout.manifest_key(step)]
            self.storage.delete(manifest)  # un-commit first
            keep = f"{layout.step_prefix(step)}/{ours}" if ours is not None else None
            self.storage.delete([k for k in keys if k not in manifest and k != keep])
            return None
        if ours is not None:
            self.storage.delete([f"{layout.step_prefix(step)}/{ours}"])
        log.info("step %d was already committed by writer generation %s: keeping that checkpoint", step, owner)
        return size

    def _hurried(self) -> bool:
        if self._hurry.is_set():
            log.info("checkpoint retention stopped early: a blocking save is waiting (the next retention goes on)")
            return True
        return False

    def _verified_unless_hurried(self, step: int) -> bool:
        """Verify ``step`` (sizes + SHA-256, :meth:`load_step` without loading) on the verify thread,
        while this thread (the persist thread) waits for it and looks every :data:`HURRY_POLL_S`
        seconds whether a blocking save is waiting. If one is, the verification is abandoned (its
        read stops at its next 1 MiB chunk; S3's download in ``open_read`` stops at its next
        progress report, within 256 KiB per ranged GET under way, so it stops competing with the
        save's upload for bandwidth) and the persist thread is free for the save within
        :data:`HURRY_POLL_S`, however big the checkpoint being verified.

        Returns:
            ``True`` once ``step`` verified; ``False`` if the verification was abandoned: nothing is
            known about ``step``, so nothing may be deleted on its account.

        Raises:
            CheckpointCorruptError: ``step`` fails verification.
            CheckpointStorageError: reading it failed for another reason (see :meth:`load_step`).
        """
        abandon = threading.Event()
        future = self._verifier.submit(self._load_step, step, map_location="cpu", load_state=False, abandon=abandon)
        self._verifying = future
        while not wait_futures([future], timeout=HURRY_POLL_S).done:
            if self._hurry.is_set():
                abandon.set()
                log.info("checkpoint retention stopped early: a blocking save is waiting; verifying step %d "
                         "abandoned, nothing deleted (the next retention goes on)", step)
                return False
        future.result()
        return True

    def _apply_retention(self, newest_own: int) -> None:
        """Keep ``newest_own`` and the newest ``keep_last_k - 1`` other known-good checkpoints below it,
        every good one above it, uncommitted steps above it (may be in flight); delete the rest.

        Stops early when a blocking save is waiting (the next retention finishes the job): between two
        deletions, and also within a verification, which is then abandoned before any deletion (see
        :meth:`_verified_unless_hurried`): a big checkpoint being verified holds up the SIGTERM or
        final save by at most :data:`HURRY_POLL_S` seconds. A store call already under way (the
        fence check, a listing, one deletion, the cleanup of unfinished uploads) still ends first."""
        try:
            self.check_fence()
            keys = self._list("step-")
            by_step: dict[int, list[str]] = {}
            for k in keys:
                s = layout.parse_step(k)
                if s is not None:
                    by_step.setdefault(s, []).append(k)
            committed = sorted(
                (s for s, ks in by_step.items() if any(layout.is_manifest_key(k) for k in ks)),
                reverse=True,
            )
            keep, corrupt = {newest_own}, set()
            kept_below = 0
            for s in committed:
                if s == newest_own or (s < newest_own and kept_below >= self.keep_last_k - 1):
                    continue
                if s not in self._good:
                    if self._hurried():
                        return
                    try:
                        if not self._verified_unless_hurried(s):  # sizes + SHA-256, once per step
                            return
                    except CheckpointCorruptError as e:
                        log.warning("checkpoint at step %d is corrupt (%s): deleting it", s, e)
                        corrupt.add(s)
                        continue
                keep.add(s)
                kept_below += s < newest_own
            for s, ks in sorted(by_step.items()):
                if s in keep or (s > newest_own and s not in corrupt):
                    continue
                if self._hurried():
                    return
                self.check_fence()
                manifest = [k for k in ks if layout.is_manifest_key(k)]
                self.storage.delete(manifest)  # un-commit first
                self.storage.delete([k for k in ks if k not in manifest])
            if self._hurried():
                return
            self.storage.cleanup_incomplete(older_than_s=STALE_WRITE_AGE_S)
        except WriterFencedError as e:
            log.error("checkpoint retention skipped: %s", e)
        except CheckpointStorageError as e:
            log.warning("checkpoint retention skipped: %s", e)
        except Exception as e:  # a bug or an unexpected store: never lost in the background future
            log.error("checkpoint retention failed: %s", describe_error(e))
            log.debug("checkpoint retention failure", exc_info=True)


def _torch_load(f: BinaryIO, *, key: str, map_location: str | torch.device) -> Any:
    """``torch.load`` of a file that passed its checksum. Unpickling and format errors mean the bytes
    are bad (:class:`CheckpointCorruptError`); an I/O error or memory running out does not
    (:class:`CheckpointStorageError`: try again later, never delete or skip the checkpoint over it)."""
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except Exception as e:
        if _cannot_read_now(e):
            raise CheckpointStorageError(f"{key}: cannot be loaded now: {describe_error(e)}") from e
        if "Unsupported global:" in str(e):  # bytes that passed their checksum name a type the allow-list refuses
            raise CheckpointRefusedError(
                f"{key} cannot be loaded by this run ({_weights_only_reason(e)}): allow the type with "
                "torch.serialization.add_safe_globals in the task's module (or use the torch version "
                "that wrote it), or start afresh under another --job-key") from e
        raise CheckpointCorruptError(f"{key}: cannot be loaded: {describe_error(e)}") from e


def _skeleton(tree: Any, types: set[type]) -> Any:
    """``tree`` with every tensor replaced by an empty one (what ``weights_only`` judges is the rest);
    the type of every other node, dict keys and set members included, is added to ``types``.
    dicts, OrderedDicts, lists and tuples (exact types) are rebuilt; any other value is kept whole."""
    if isinstance(tree, torch.Tensor):
        return _EMPTY
    kind = type(tree)
    types.add(kind)
    if kind is dict or kind is collections.OrderedDict:  # a module's state_dict() is an OrderedDict
        return kind((_skeleton(k, types), _skeleton(v, types)) for k, v in tree.items())
    if kind is list or kind is tuple:
        return kind(_skeleton(v, types) for v in tree)
    if kind is set or kind is frozenset:  # kept whole (hashable members), their types recorded
        for v in tree:
            _skeleton(v, types)
    return tree


_EMPTY = torch.empty(0)


def _weights_only_reason(e: BaseException) -> str:
    """The line of torch's ``weights_only`` refusal that names the type (torch/_weights_only_unpickler.py
    prints it as ``WeightsUnpickler error: Unsupported global: GLOBAL <type> ...``), else the first."""
    for line in str(e).splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip().split(" was not an allowed", 1)[0][:200]
    return describe_error(e)


def describe_error(e: BaseException) -> str:
    """One line naming ``e`` (its first line, at most 300 characters)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}"[:300] if lines else type(e).__name__


def state_bytes(state: dict[str, Any]) -> bytes:
    """Serialize a state tree the way checkpoints do (for tests and hashing)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()
