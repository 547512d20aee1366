"""The checkpoint storage protocol and the function that picks a backend for a URI.

A backend stores opaque objects under ``str`` keys relative to its root (``step-0000000120/state.pt``).
Keys are strings, not paths, because the root may be a remote URI (``s3://bucket/prefix``) that
``pathlib`` would mangle.

The protocol is deliberately small: retention, "latest committed checkpoint" and checksum checks live
in :class:`~components.training.checkpoint.manager.CheckpointManager`, so every backend gets them for
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
* Every failure surfaces as :class:`CheckpointStorageError` (or a subclass) with the cause chained.

Backends claim URIs through a ``accepts(uri)`` classmethod, the way
``torch/distributed/checkpoint/_storage_utils.py`` asks each writer ``validate_checkpoint_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import BinaryIO, Protocol, runtime_checkable


class CheckpointStorageError(RuntimeError):
    """A storage operation failed or the storage is unreachable. The cause is chained."""


class ObjectExistsError(CheckpointStorageError):
    """``open_write(..., create_only=True)`` found the key already present."""


class ObjectNotFoundError(CheckpointStorageError):
    """``open_read`` asked for a key that does not exist."""


@runtime_checkable
class CheckpointStorage(Protocol):
    """Where checkpoints live. See the module docstring for the atomicity contract."""

    uri: str
    """The root this storage writes under, as the user gave it (a local path or ``s3://bucket/prefix``)."""

    def check(self) -> None:
        """Raise :class:`CheckpointStorageError` with a one-line reason if the root is unusable."""
        ...

    def open_write(self, key: str, *, create_only: bool = False) -> AbstractContextManager[BinaryIO]:
        """A writable binary file; its content is committed atomically when the block exits cleanly."""
        ...

    def open_read(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A readable, seekable binary file. Raises :class:`ObjectNotFoundError` if absent."""
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


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe relative key, else raise ``ValueError``."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid storage key {key!r}: must be a relative path without '.', '..' or '//'")
    return key


def write_bytes(storage: CheckpointStorage, key: str, data: bytes, *, create_only: bool = False) -> None:
    """Write ``data`` to ``key`` atomically."""
    with storage.open_write(key, create_only=create_only) as f:
        f.write(data)


def read_bytes(storage: CheckpointStorage, key: str) -> bytes:
    """Read the whole object at ``key``."""
    with storage.open_read(key) as f:
        return f.read()


def _backends() -> Iterator[type]:
    from components.training.checkpoint.local import LocalStorage

    yield LocalStorage
    from components.training.checkpoint.s3 import S3Storage  # imported lazily: boto3 only for s3://

    yield S3Storage


def storage_for(uri: str) -> CheckpointStorage:
    """Return the backend that claims ``uri``.

    Args:
        uri: a local folder (``/data/ckpt``, ``file:///data/ckpt``) or ``s3://bucket[/prefix]``.
            S3 endpoint and credentials come from the environment; see
            :func:`components.training.checkpoint.s3.S3Settings.from_env`.

    Raises:
        CheckpointStorageError: no backend accepts the URI (e.g. ``gs://``).
    """
    for backend in _backends():
        if backend.accepts(uri):
            return backend(uri)
    raise CheckpointStorageError(
        f"no checkpoint storage accepts {uri!r}: use a local folder, file://PATH or s3://BUCKET/PREFIX"
    )


def join_uri(root: str, *parts: str) -> str:
    """Join ``parts`` under a storage root URI with single slashes (``s3://b/p`` + ``x`` → ``s3://b/p/x``)."""
    out = root.rstrip("/")
    for part in parts:
        part = part.strip("/")
        if part:
            out = f"{out}/{part}"
    return out
