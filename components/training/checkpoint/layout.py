"""Key naming inside a job's checkpoint root, and the manifest format.

::

    <checkpoint uri>/<job key>/
        writers/g0000000003.json             create-only claim of writer generation 3 (the newest owns the key)
        step-0000000120/state-g0000000003.pt torch.save of the whole training state, by writer generation 3
        step-0000000120/MANIFEST.json        written LAST, create-only: a checkpoint exists only once this exists
        faults/...                           fault-injection markers (see components.training.faults)

Steps and generations are zero-padded so lexicographic listing (S3 ``ListObjectsV2``) equals numeric
order. Each writer generation names its own state file, so two writers of one step never overwrite
each other's bytes, and a manifest always describes the file its writer wrote. Checkpoints written
before generations existed hold ``state.pt`` (still loaded). A manifest lists plain file names of its
own step folder only (no ``/``, ``.`` or ``..``); one that names anything else is corrupt.
"""

from __future__ import annotations

import re

FORMAT = "trainflow-checkpoint/1"
MANIFEST_NAME = "MANIFEST.json"
STATE_NAME = "state.pt"
WRITERS_PREFIX = "writers/"
_STEP_RE = re.compile(r"^step-(\d{10})/")
_WRITER_RE = re.compile(r"^writers/g(\d{10})\.json$")
_STATE_RE = re.compile(r"^state(-g\d{10})?\.pt$")
_MANIFEST_RE = re.compile(r"step-\d{10}/MANIFEST\.json")


def step_prefix(step: int) -> str:
    """``120`` → ``"step-0000000120"``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:010d}"


def manifest_key(step: int) -> str:
    return f"{step_prefix(step)}/{MANIFEST_NAME}"


def state_name(generation: int) -> str:
    """The state file a writer generation writes (``3`` → ``"state-g0000000003.pt"``)."""
    return f"state-g{generation:010d}.pt"


def is_state_name(name: str) -> bool:
    """``state.pt`` (before writer generations) or ``state-g<N>.pt``."""
    return bool(_STATE_RE.match(name))


def writer_key(generation: int) -> str:
    return f"{WRITERS_PREFIX}g{generation:010d}.json"


def parse_writer(key: str) -> int | None:
    """The generation a claim key names (``writers/g0000000003.json`` → 3), or ``None``."""
    m = _WRITER_RE.match(key)
    return int(m.group(1)) if m else None


def parse_step(key: str) -> int | None:
    """The step a key belongs to (``step-0000000120/state.pt`` → 120), or ``None``."""
    m = _STEP_RE.match(key)
    return int(m.group(1)) if m else None


def is_manifest_key(key: str) -> bool:
    """Whether ``key`` is a step's manifest (``step-0000000120/MANIFEST.json``, nothing nested)."""
    return bool(_MANIFEST_RE.fullmatch(key))


def is_plain_name(name: object) -> bool:
    """A file name a manifest may list: a non-empty string without ``/``, not ``.`` or ``..``."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name


def validate_manifest(manifest: object) -> dict:
    """Return ``manifest`` if it has the fields a loader relies on, else raise ``ValueError``."""
    if not isinstance(manifest, dict):
        raise ValueError("manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"manifest format is {manifest.get('format')!r}, expected {FORMAT!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or sum(is_state_name(n) for n in files) != 1:
        raise ValueError("manifest lists no state file (or more than one)")
    for name, meta in files.items():
        if not is_plain_name(name):
            raise ValueError(f"manifest lists {name!r}, not a plain file name")
        if not (isinstance(meta, dict) and isinstance(meta.get("size_bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise ValueError(f"manifest entry for {name!r} lacks size_bytes/sha256")
    if not isinstance(manifest.get("step"), int):
        raise ValueError("manifest has no integer step")
    return manifest
