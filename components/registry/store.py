"""A versioned model store on any :class:`CheckpointStorage` (a local folder or ``s3://``).

Layout under the registry root::

    <model name>/v000003/CLAIM          create-only: reserves version 3 for exactly one writer
    <model name>/v000003/model.pt
    <model name>/v000003/model.json
    <model name>/v000003/VERSION.json   written LAST: lineage + SHA-256 of each file; a version exists
                                        only once this exists
    <model name>/CURRENT.json           the serving pointer: {"version": 3, "history": [...]}

Versions are allocated by a create-only write of ``CLAIM`` (``If-None-Match: *`` on S3, ``link(2)``
locally), so two pipelines registering at once get distinct versions. ``rollback`` moves the
``CURRENT`` pointer to an earlier version; versions themselves are immutable.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.training.checkpoint.storage import (
    CheckpointStorage,
    ObjectExistsError,
    ObjectNotFoundError,
    read_bytes,
    write_bytes,
)

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
_VERSION_RE = re.compile(r"^v(\d{6})/VERSION\.json$")
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

    def register(self, name: str, model_dir: str | Path, lineage: dict[str, Any], *, promote: bool = True) -> ModelVersion:
        """Store a new version of ``name`` from an exported model folder; optionally make it current.

        Raises:
            RegistryError: bad name or model folder.
        """
        model_dir = Path(model_dir)
        missing = [f for f in MODEL_FILES if not (model_dir / f).is_file()]
        if missing:
            raise RegistryError(f"{model_dir} is not an exported model (missing {', '.join(missing)})")
        version = self._claim(name)
        prefix = self._prefix(name, version)
        files = {}
        for fname in MODEL_FILES:
            data = (model_dir / fname).read_bytes()
            write_bytes(self.storage, f"{prefix}/{fname}", data)
            files[fname] = {"size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        record = {"name": name, "version": version, "created_at": datetime.now(UTC).isoformat(),
                  "lineage": lineage, "files": files}
        write_bytes(self.storage, f"{prefix}/VERSION.json", json.dumps(record, indent=1, sort_keys=True).encode())
        if promote:
            self._set_current(name, version, reason="registered")
        return self.get(name, version)

    def _claim(self, name: str) -> int:
        existing = [int(m.group(1)) for k in self.storage.list(f"{_validate_name(name)}/v")
                    if (m := re.match(r"^v(\d{6})/", k[len(name) + 1 :]))]
        version = max(existing, default=0) + 1
        while True:
            try:
                write_bytes(self.storage, f"{self._prefix(name, version)}/CLAIM", b"", create_only=True)
                return version
            except ObjectExistsError:
                version += 1  # another writer took it first

    def current(self, name: str) -> ModelVersion | None:
        """The version ``CURRENT.json`` points at, or ``None`` before the first promotion."""
        try:
            pointer = json.loads(read_bytes(self.storage, f"{_validate_name(name)}/CURRENT.json"))
        except ObjectNotFoundError:
            return None
        return self.get(name, int(pointer["version"]))

    def rollback(self, name: str, version: int) -> ModelVersion:
        """Point ``CURRENT`` at an earlier (existing) version.

        Raises:
            RegistryError: the version does not exist.
        """
        target = self.get(name, version)
        self._set_current(name, version, reason="rollback")
        return target

    def history(self, name: str) -> list[dict[str, Any]]:
        try:
            return json.loads(read_bytes(self.storage, f"{_validate_name(name)}/CURRENT.json"))["history"]
        except ObjectNotFoundError:
            return []

    def _set_current(self, name: str, version: int, *, reason: str) -> None:
        history = self.history(name)
        history.append({"version": version, "at": datetime.now(UTC).isoformat(), "reason": reason})
        pointer = {"version": version, "history": history[-100:]}
        write_bytes(self.storage, f"{name}/CURRENT.json", json.dumps(pointer, indent=1).encode())

    def download(self, name: str, version: int, dest: str | Path) -> Path:
        """Copy a version's model files into ``dest``, verifying their SHA-256."""
        mv = self.get(name, version)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for fname, meta in mv.files.items():
            data = read_bytes(self.storage, f"{self._prefix(name, version)}/{fname}")
            if hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise RegistryError(f"model {name!r} v{version} file {fname} fails its SHA-256")
            (dest / fname).write_bytes(data)
        return dest
