"""Checkpoint storage in a local folder (a disk, an NFS/PVC mount).

Writes go to a hidden temp file beside the target, are fsync'ed, then renamed into place, and the
folder is fsync'ed so the rename survives a crash (the same commit as
``torch/distributed/checkpoint/filesystem.py``'s ``.metadata.tmp`` → ``.metadata``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from trainflow.storage.base import validate_key
from trainflow.storage.errors import CheckpointStorageError, ObjectExistsError, ObjectNotFoundError

_TMP_MARK = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStorage:
    """:class:`~trainflow.storage.base.ObjectStore` over a local folder.

    Args:
        uri: a folder path or ``file://`` URI; created on first write.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = Path(uri.removeprefix("file://")).expanduser()

    @classmethod
    def accepts(cls, uri: str) -> bool:
        return uri.startswith("file://") or "://" not in uri

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def check(self) -> None:
        try:
            # fsynced into their parents, as every folder a commit needs (the job folder included):
            # mkdir -p alone left the entries of a new root and job folder to the kernel's writeback
            self._makedirs(self.root)
            probe = self.root / f".probe{_TMP_MARK}{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink(missing_ok=True)  # a claim's cleanup_incomplete on another rank may have removed it
        except OSError as e:
            raise CheckpointStorageError(f"checkpoint folder {self.root} is not writable: {e}") from e

    def _makedirs(self, folder: Path) -> None:
        """``mkdir -p`` that fsyncs the parent of every folder it creates, so a committed file's
        folder (``step-N/``, the job folder) survives a crash as well as the file itself."""
        missing = []
        while not folder.is_dir():
            missing.append(folder)
            folder = folder.parent
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):
                path.mkdir()
            _fsync_dir(path.parent)

    @contextlib.contextmanager
    def open_write(self, key: str, *, create_only: bool = False) -> Iterator[BinaryIO]:
        target = self._path(key)
        try:
            self._makedirs(target.parent)
        except OSError as e:
            raise CheckpointStorageError(f"cannot create {target.parent}: {e}") from e
        if create_only and target.exists():
            raise ObjectExistsError(f"{target} already exists")
        tmp = target.with_name(f".{target.name}{_TMP_MARK}{uuid.uuid4().hex}")
        try:
            with tmp.open("wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            if create_only:
                try:
                    os.link(tmp, target)  # fails with EEXIST if another writer won
                except FileExistsError as e:
                    raise ObjectExistsError(f"{target} already exists") from e
            else:
                os.replace(tmp, target)
            _fsync_dir(target.parent)
        except OSError as e:
            raise CheckpointStorageError(f"writing {target} failed: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def open_read(self, key: str, *, abandon: threading.Event | None = None) -> Iterator[BinaryIO]:
        """The file at ``key``, opened for reading. ``abandon`` is ignored: nothing is read ahead, so
        a caller that wants to stop reads in chunks and checks its event itself.

        Raises:
            ObjectNotFoundError: ``key`` does not exist.
            CheckpointStorageError: it could not be opened.
        """
        path = self._path(key)
        try:
            f = path.open("rb")
        except FileNotFoundError as e:
            raise ObjectNotFoundError(f"{path} does not exist") from e
        except OSError as e:
            raise CheckpointStorageError(f"reading {path} failed: {e}") from e
        with f:
            yield f

    def list(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` (files being written left out), sorted.

        Raises:
            CheckpointStorageError: a folder could not be read (denied, EIO, a stale NFS handle):
                a partial listing would look like fewer checkpoints, or none (a fresh start).
                Folders removed while listed (retention) are skipped.
        """
        def unreadable(e: OSError) -> None:
            if not isinstance(e, FileNotFoundError):
                raise CheckpointStorageError(f"listing {self.root} failed: {e}") from e

        try:
            if not self.root.is_dir():
                return []
        except OSError as e:
            raise CheckpointStorageError(f"listing {self.root} failed: {e}") from e
        keys = []
        for dirpath, _dirnames, filenames in os.walk(self.root, onerror=unreadable):
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if _TMP_MARK in name and name.startswith("."):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def cleanup_incomplete(self, *, older_than_s: float | None) -> int:
        if not self.root.is_dir():
            return 0
        cutoff = None if older_than_s is None else time.time() - older_than_s
        removed = 0
        for dirpath, _dirnames, filenames in os.walk(self.root):
            for name in filenames:
                if not (name.startswith(".") and _TMP_MARK in name):
                    continue
                path = Path(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    if cutoff is None or path.stat().st_mtime < cutoff:
                        path.unlink()
                        removed += 1
                        with contextlib.suppress(OSError):  # a step folder holding nothing else
                            if path.parent != self.root and not any(path.parent.iterdir()):
                                path.parent.rmdir()
        return removed

    def delete(self, keys: Iterable[str]) -> None:
        parents = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                raise CheckpointStorageError(f"deleting {path} failed: {e}") from e
            parents.add(path.parent)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):  # not empty, or already gone
                while parent != self.root and not any(parent.iterdir()):
                    parent.rmdir()
                    parent = parent.parent
