"""Key naming inside a job's checkpoint root, and the manifest format.

::

    <checkpoint uri>/<job key>/
        step-0000000120/state.pt        torch.save of the whole training state (model, optimizer, ...)
        step-0000000120/MANIFEST.json   written LAST: a checkpoint exists only once this exists
        faults/...                       fault-injection markers (see components.training.faults)

Steps are zero-padded so lexicographic listing (S3 ``ListObjectsV2``) equals numeric order.
"""

from __future__ import annotations

import re

FORMAT = "trainflow-checkpoint/1"
MANIFEST_NAME = "MANIFEST.json"
STATE_NAME = "state.pt"
_STEP_RE = re.compile(r"^step-(\d{10})/")


def step_prefix(step: int) -> str:
    """``120`` → ``"step-0000000120"``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:010d}"


def manifest_key(step: int) -> str:
    return f"{step_prefix(step)}/{MANIFEST_NAME}"


def parse_step(key: str) -> int | None:
    """The step a key belongs to (``step-0000000120/state.pt`` → 120), or ``None``."""
    m = _STEP_RE.match(key)
    return int(m.group(1)) if m else None


def validate_manifest(manifest: object) -> dict:
    """Return ``manifest`` if it has the fields a loader relies on, else raise ``ValueError``."""
    if not isinstance(manifest, dict):
        raise ValueError("manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"manifest format is {manifest.get('format')!r}, expected {FORMAT!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or STATE_NAME not in files:
        raise ValueError(f"manifest lists no {STATE_NAME}")
    for name, meta in files.items():
        if not (isinstance(meta, dict) and isinstance(meta.get("size_bytes"), int) and isinstance(meta.get("sha256"), str)):
            raise ValueError(f"manifest entry for {name!r} lacks size_bytes/sha256")
    if not isinstance(manifest.get("step"), int):
        raise ValueError("manifest has no integer step")
    return manifest
