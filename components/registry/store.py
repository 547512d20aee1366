"""A versioned model store on any :class:`CheckpointStorage` (a local folder or ``s3://``).

Layout under the registry root::

    <model name>/v000003/CLAIM          create-only: reserves version 3 for exactly one writer
    <model name>/v000003/model.pt
    <model name>/v000003/model.json
    <model name>/v000003/data_profile.json   optional extra files (``register(extra_files=...)``), e.g.
                                        the drift check's profile of the training data
    <model name>/v000003/VERSION.json   written LAST: lineage + SHA-256 of each file; a version exists
                                        only once this exists
    <model name>/CURRENT/p0000000004.json   the serving pointer's log: each move is a create-only entry
                                          {"version", "at", "reason"}; the newest entry is current
                                          (sequence numbers 1, 2, ... with no gaps)
    <model name>/keys/<sha256>.json     create-only: which version a registration (idempotency key +
                                        model SHA-256) got, so a retried registration finds it

Versions are allocated by a create-only write of ``CLAIM`` (``If-None-Match: *`` on S3, ``link(2)``
locally), so two pipelines registering at once get distinct versions. The pointer is a log of
create-only entries rather than one object rewritten in place, so two moves at once never overwrite
each other's history. An unconditional move (``rollback``, ``register(promote=True)``) takes the next
free entry, so it always lands. A conditional one (:meth:`ModelRegistry.promote`) is made against the
:class:`Pointer` read when the candidate was compared with the current version: it creates exactly
the entry after that one, so when another move landed meanwhile it fails, writes nothing, and the
caller compares again with the new current version (``components/registry/promotion.py``) — a model
becomes current only over the version it was compared with. ``rollback`` appends an entry pointing at
an earlier version; versions themselves are immutable. A registry written before the log existed
keeps its ``CURRENT.json``, read as the log's first entries (sequence number 0).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainflow.common.training_spec import MODEL_NAME_PATTERN
from trainflow.storage import (
    CheckpointStorage,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectWriteConflict,
    read_bytes,
    write_bytes,
)

#: Pauses, in seconds, before each retry of a create-only write that collided with another write of
#: the same key still under way (:class:`~trainflow.storage.ObjectWriteConflict`); then it fails.
CONFLICT_RETRY_PAUSES_S = (0.1, 0.3, 1.0, 3.0)

_NAME_RE = re.compile(MODEL_NAME_PATTERN)
_VERSION_RE = re.compile(r"^v(\d{6})/VERSION\.json$")
_FILE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
_POINTER_RE = re.compile(r"^CURRENT/p(\d{10})\.json$")
MODEL_FILES = ("model.pt", "model.json")


class RegistryError(ValueError):
    """Bad model name, unknown version, or an unreadable registry entry (one-line message)."""


@dataclass(frozen=True, slots=True)
class ModelVersion:
    name: str
    version: int
    created_at: str
    lineage: dict[str, Any]
    """dataset fingerprint, training parameters, metrics, code version, job key, ..."""
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    uri: str = ""

    def holds_model(self, model_dir: str | Path) -> bool:
        """Whether this version stores exactly the model files (:data:`MODEL_FILES`) of the exported
        model folder ``model_dir``: same SHA-256 each; ``False`` when one is missing on either side."""
        model_dir = Path(model_dir)
        for fname in MODEL_FILES:
            path = model_dir / fname
            recorded = self.files.get(fname, {}).get("sha256")
            if not recorded or not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != recorded:
                return False
        return True


@dataclass(frozen=True, slots=True)
class Pointer:
    """The serving pointer as read at one moment (:meth:`ModelRegistry.pointer`)."""

    seq: int
    """sequence number of the newest ``CURRENT/p<seq>.json`` entry; 0 when there is none yet"""
    version: int | None
    """the version that entry (or a legacy ``CURRENT.json``) names; ``None`` before the first promotion"""


def _version_files(model_dir: str | Path, extra_files: dict[str, bytes] | None) -> tuple[dict[str, bytes],
                                                                                       dict[str, dict[str, Any]]]:
    """The files a version of ``model_dir`` stores (name -> bytes) and their ``files`` record
    (name -> size_bytes, sha256).

    Raises:
        RegistryError: not an exported model folder, or a bad extra file name.
    """
    model_dir = Path(model_dir)
    missing = [f for f in MODEL_FILES if not (model_dir / f).is_file()]
    if missing:
        raise RegistryError(f"{model_dir} is not an exported model (missing {', '.join(missing)})")
    blobs = {fname: (model_dir / fname).read_bytes() for fname in MODEL_FILES}
    for fname, data in (extra_files or {}).items():
        if fname in MODEL_FILES or not _FILE_RE.match(fname):
            raise RegistryError(f"extra file name {fname!r} must match {_FILE_RE.pattern} and not be a model file")
        blobs[fname] = data
    return blobs, {f: {"size_bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for f, d in blobs.items()}


def _validate_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise RegistryError(f"model name {name!r} must match {_NAME_RE.pattern} (lowercase, digits, . _ -)")
    return name


class ModelRegistry:
    """Register, list, fetch and roll back model versions.

    Args:
        storage: the registry root.
    """

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage

    def _prefix(self, name: str, version: int) -> str:
        return f"{_validate_name(name)}/v{version:06d}"

    def versions(self, name: str) -> list[ModelVersion]:
        """Committed versions of ``name``, oldest first."""
        out = []
        for key in self.storage.list(f"{_validate_name(name)}/v"):
            m = _VERSION_RE.match(key[len(name) + 1 :])
            if m:
                out.append(self.get(name, int(m.group(1))))
        return out

    def get(self, name: str, version: int) -> ModelVersion:
        """Raises :class:`RegistryError` if the version does not exist (or is not committed)."""
        prefix = self._prefix(name, version)
        try:
            meta = json.loads(read_bytes(self.storage, f"{prefix}/VERSION.json"))
        except ObjectNotFoundError as e:
            raise RegistryError(f"model {name!r} has no version {version}") from e
        except ValueError as e:
            raise RegistryError(f"model {name!r} version {version} is unreadable: {e}") from e
        return ModelVersion(name=name, version=version, created_at=meta["created_at"], lineage=meta["lineage"],
                            files=meta["files"], uri=f"{self.storage.uri.rstrip('/')}/{prefix}")

    def register(self, name: str, model_dir: str | Path, lineage: dict[str, Any], *, promote: bool = True,
                 idempotency_key: str | None = None, extra_files: dict[str, bytes] | None = None) -> ModelVersion:
        """Store a new version of ``name`` from an exported model folder; optionally make it current.

        Args:
            idempotency_key: identifies the registration across retries (e.g. the training job key):
                registering the same model files again under the same key returns the version the
                first attempt got — finishing it if that attempt died half-way — instead of a new one.
            extra_files: more files stored with the version (name -> bytes), listed with their
                SHA-256 in ``files`` like the model's (:meth:`read_file` reads one back).

        Raises:
            RegistryError: bad name or model folder.
        """
        blobs, files = _version_files(model_dir, extra_files)
        version = self._version_for(name, idempotency_key, files) if idempotency_key else self._claim(name)
        prefix = self._prefix(name, version)
        if not self.storage.list(f"{prefix}/VERSION.json"):
            for fname, data in blobs.items():
                write_bytes(self.storage, f"{prefix}/{fname}", data)
            record = {"name": name, "version": version, "created_at": datetime.now(UTC).isoformat(),
                      "lineage": lineage, "files": files}
            write_bytes(self.storage, f"{prefix}/VERSION.json", json.dumps(record, indent=1, sort_keys=True).encode())
        if promote and not any(h["version"] == version and h["reason"] == "registered" for h in self.history(name)):
            self._set_current(name, version, reason="registered")
        return self.get(name, version)

    def registered(self, name: str, model_dir: str | Path, *, idempotency_key: str,
                   extra_files: dict[str, bytes] | None = None) -> ModelVersion | None:
        """The version a :meth:`register` of these files under ``idempotency_key`` made, if one did
        and finished (its ``VERSION.json`` exists); None otherwise. Reads only: claims nothing.

        Raises:
            RegistryError: bad name or model folder.
        """
        _, files = _version_files(model_dir, extra_files)
        try:
            version = int(json.loads(read_bytes(self.storage, self._key_of(name, idempotency_key, files)))["version"])
        except ObjectNotFoundError:
            return None
        return self.get(name, version) if self.storage.list(f"{self._prefix(name, version)}/VERSION.json") else None

    @staticmethod
    def _key_of(name: str, idempotency_key: str, files: dict[str, dict[str, Any]]) -> str:
        digest = hashlib.sha256(json.dumps([idempotency_key, files], sort_keys=True).encode()).hexdigest()
        return f"{_validate_name(name)}/keys/{digest}.json"

    def _version_for(self, name: str, idempotency_key: str, files: dict[str, dict[str, Any]]) -> int:
        """The version this registration owns: the one recorded for its key, else a new claim."""
        key = self._key_of(name, idempotency_key, files)
        try:
            return int(json.loads(read_bytes(self.storage, key))["version"])
        except ObjectNotFoundError:
            pass
        version = self._claim(name)
        if not self._create(key, json.dumps({"version": version}).encode()):
            # the same registration, running concurrently, recorded first
            version = int(json.loads(read_bytes(self.storage, key))["version"])
        return version

    def _create(self, key: str, data: bytes) -> bool:
        """Write ``key`` only if it does not exist: True if this call created it, False if it
        existed. A write that collided with another one of the key still under way (S3's 409) is
        retried after :data:`CONFLICT_RETRY_PAUSES_S`: the other one may or may not land.

        Raises:
            CheckpointStorageError: the storage failed, or the conflict outlasted the retries.
        """
        for pause_s in (*CONFLICT_RETRY_PAUSES_S, None):
            try:
                write_bytes(self.storage, key, data, create_only=True)
                return True
            except ObjectExistsError:
                return False
            except ObjectWriteConflict:
                if pause_s is None:
                    raise
                time.sleep(pause_s)
        raise AssertionError("unreachable")

    def _claim(self, name: str) -> int:
        existing = [int(m.group(1)) for k in self.storage.list(f"{_validate_name(name)}/v")
                    if (m := re.match(r"^v(\d{6})/", k[len(name) + 1 :]))]
        version = max(existing, default=0) + 1
        while not self._create(f"{self._prefix(name, version)}/CLAIM", b""):
            version += 1  # another writer took it first
        return version

    def current(self, name: str) -> ModelVersion | None:
        """The version the newest pointer entry names, or ``None`` before the first promotion."""
        history = self.history(name)
        return self.get(name, int(history[-1]["version"])) if history else None

    def pointer(self, name: str) -> Pointer:
        """Where ``CURRENT`` stands now: pass it to :meth:`promote` to promote over exactly that version."""
        entries = self._pointer_entries(name)
        if entries:
            seq, key = entries[-1]
            return Pointer(seq=seq, version=int(json.loads(read_bytes(self.storage, key))["version"]))
        legacy = self._legacy_history(name)
        return Pointer(seq=0, version=int(legacy[-1]["version"]) if legacy else None)

    def promote(self, name: str, version: int, *, expected: Pointer) -> bool:
        """Make ``version`` current only if the pointer has not moved since ``expected`` was read.

        ``expected`` is the :meth:`pointer` read before ``version`` was compared with the current
        version; the entry is created only at ``expected.seq + 1``.

        Returns:
            ``True`` when ``version`` is current now: promoted by this call, or current already (a
            retry whose first attempt promoted it; nothing is written). ``False`` when another move of
            the pointer landed after ``expected``: nothing is written; read :meth:`pointer` again,
            compare with its version, and call again with it. A version promoted once and no longer
            current is no exception: it is promoted again only over ``expected``, like any other.

        Raises:
            RegistryError: bad name, or the version does not exist.
        """
        self.get(name, version)
        if self.pointer(name).version == version:
            return True
        return self._append_pointer(name, expected.seq + 1, version, reason="registered")

    def rollback(self, name: str, version: int) -> ModelVersion:
        """Point ``CURRENT`` at an earlier (existing) version.

        Raises:
            RegistryError: the version does not exist.
        """
        target = self.get(name, version)
        self._set_current(name, version, reason="rollback")
        return target

    def _pointer_entries(self, name: str) -> list[tuple[int, str]]:
        return sorted((int(m.group(1)), k) for k in self.storage.list(f"{_validate_name(name)}/CURRENT/")
                      if (m := _POINTER_RE.match(k[len(name) + 1 :])))

    def _legacy_history(self, name: str) -> list[dict[str, Any]]:
        try:
            return list(json.loads(read_bytes(self.storage, f"{name}/CURRENT.json"))["history"])
        except ObjectNotFoundError:
            return []

    def history(self, name: str) -> list[dict[str, Any]]:
        """Every move of the ``CURRENT`` pointer, oldest first: ``{"version", "at", "reason"}``."""
        entries = [json.loads(read_bytes(self.storage, key)) for _, key in self._pointer_entries(name)]
        return self._legacy_history(name) + entries

    def _set_current(self, name: str, version: int, *, reason: str) -> None:
        """Unconditional move: the next free entry, whatever landed meanwhile."""
        seq = max((n for n, _ in self._pointer_entries(name)), default=0) + 1
        while not self._append_pointer(name, seq, version, reason=reason):
            seq += 1  # another move landed first: ours goes after it

    def _append_pointer(self, name: str, seq: int, version: int, *, reason: str) -> bool:
        """Create pointer entry ``seq``; ``False`` (nothing written) if it exists already."""
        entry = {"version": version, "at": datetime.now(UTC).isoformat(), "reason": reason}
        return self._create(f"{_validate_name(name)}/CURRENT/p{seq:010d}.json", json.dumps(entry).encode())

    def read_file(self, name: str, version: int, fname: str) -> bytes:
        """One file of a version, verified against its recorded SHA-256.

        Raises:
            RegistryError: no such version or file, or the bytes fail their SHA-256.
        """
        mv = self.get(name, version)
        if fname not in mv.files:
            raise RegistryError(f"model {name!r} v{version} has no file {fname!r} (has {sorted(mv.files)})")
        data = read_bytes(self.storage, f"{self._prefix(name, version)}/{fname}")
        if hashlib.sha256(data).hexdigest() != mv.files[fname]["sha256"]:
            raise RegistryError(f"model {name!r} v{version} file {fname} fails its SHA-256")
        return data

    def download(self, name: str, version: int, dest: str | Path) -> Path:
        """Copy a version's files into ``dest``, verifying their SHA-256."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for fname in self.get(name, version).files:
            (dest / fname).write_bytes(self.read_file(name, version, fname))
        return dest
