"""The object-store protocol (:class:`ObjectStore`) every backend implements.

A backend stores opaque objects under ``str`` keys relative to its root (``step-0000000120/state.pt``).
Keys are strings, not paths, because the root may be a remote URI (``s3://bucket/prefix``) that
``pathlib`` would mangle.

The protocol is deliberately small: retention, "latest committed checkpoint" and checksum checks live
in :class:`~components.training.checkpoint.manager.CheckpointManager` (and the registry's own rules in
``components.registry``), so every backend gets them for
free (the same split as torchtitan's ``CheckpointStorage``, ``torchtitan/components/checkpointer/base.py``).

Contract every backend honours:

* ``open_write(key)`` is atomic: the object becomes visible whole when the ``with`` block exits without
  an exception, and never becomes visible otherwise (local: temp file + fsync + rename; S3: a single
  PUT or CompleteMultipartUpload).
* ``open_write(key, create_only=True)`` fails with :class:`ObjectExistsError` when ``key`` already
  exists (local: ``link(2)``; S3: ``If-None-Match: *``), which makes it usable as a lock or a claim.
* ``list()`` never returns objects that are still being written.
* ``cleanup_incomplete(older_than_s)`` removes what interrupted writes left behind (local: hidden
  temp files; S3: unfinished multipart uploads) under the root.
* Every failure surfaces as :class:`~trainflow.storage.errors.CheckpointStorageError` (or a subclass)
  with the cause chained. A read stopped through ``open_read(key, abandon=event)`` is no failure: it
  raises :class:`~trainflow.storage.errors.ReadAbandoned` (only where the backend reads ahead: S3).

Backends claim URIs through a ``accepts(uri)`` classmethod, the way
``torch/distributed/checkpoint/_storage_utils.py`` asks each writer ``validate_checkpoint_id``;
:func:`trainflow.storage.resolve.storage_for` asks them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol, runtime_checkable


@runtime_checkable
class ObjectStore(Protocol):
    """Where checkpoints, models, datasets and metrics segments live; see the module docstring for
    the atomicity contract. Errors: :mod:`trainflow.storage.errors`."""

    uri: str
    """The root this storage writes under, as the user gave it (a local path or ``s3://bucket/prefix``)."""

    def check(self) -> None:
        """Raise :class:`CheckpointStorageError` with a one-line reason if the root is unusable."""
        ...

    def open_write(self, key: str, *, create_only: bool = False) -> AbstractContextManager[BinaryIO]:
        """A writable binary file; its content is committed atomically when the block exits cleanly."""
        ...

    def open_read(self, key: str, *, abandon: threading.Event | None = None) -> AbstractContextManager[BinaryIO]:
        """A readable, seekable binary file.

        Args:
            key: the object to read.
            abandon: a stop signal for a read the reader may give up (a verification that a more
                urgent upload preempts). Once it is set, a storage that reads the object ahead of the
                caller (S3 downloads it whole before yielding the file) stops that transfer at its
                next progress report and raises :class:`ReadAbandoned`; a storage that opens the file
                lazily (local) ignores it: the caller, reading in chunks, checks the event itself.

        Raises:
            ObjectNotFoundError: ``key`` does not exist.
            CheckpointStorageError: the storage failed.
            ReadAbandoned: ``abandon`` was set before or during the read ahead (no failure).
        """
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys that start with ``prefix`` (committed objects only)."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Delete ``keys``; keys that do not exist are ignored. Any key that fails raises."""
        ...

    def cleanup_incomplete(self, *, older_than_s: float | None) -> int:
        """Remove leftovers of interrupted writes last touched more than ``older_than_s`` seconds ago
        (``None``: all of them — only safe where no other writer is active). Returns how many."""
        ...


CheckpointStorage = ObjectStore
"""The protocol's former name (kept for one release)."""


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise ``ValueError``."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid storage key {key!r}: must be a relative path without '.', '..' or '//'")
    return key


def write_bytes(storage: ObjectStore, key: str, data: bytes, *, create_only: bool = False) -> None:
    """Write ``data`` to ``key`` atomically."""
    with storage.open_write(key, create_only=create_only) as f:
        f.write(data)


def read_bytes(storage: ObjectStore, key: str) -> bytes:
    """Read the whole object at ``key``."""
    with storage.open_read(key) as f:
        return f.read()
