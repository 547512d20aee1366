"""``trainflow drift``: bad input is one line and exit 2; a verdict is printed and written as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TRAINFLOW = [sys.executable, "-m", "trainflow.cli"]


def _drift(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAINFLOW, "drift", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def _one_line_exit_2(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainflow: ") and message in lines[0], proc.stderr


def test_missing_and_empty_folders(tmp_path) -> None:
    _one_line_exit_2(_drift([str(tmp_path / "nope"), "--registry", str(tmp_path / "m")], tmp_path),
                     f"dataset folder {tmp_path / 'nope'} does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_exit_2(_drift([str(tmp_path / "empty"), "--registry", str(tmp_path / "m")], tmp_path),
                     "holds no objects")
    _one_line_exit_2(_drift(["mnist", "--alpha", "2"], tmp_path), "alpha must be in (0, 1), got 2.0")
    _one_line_exit_2(_drift(["mnist", "--model-name", "Bad Name", "--registry", str(tmp_path / "m")], tmp_path),
                     "model name 'Bad Name' must match")


def test_no_current_version_is_a_verdict_not_an_error(tmp_path) -> None:
    out = tmp_path / "verdict.json"
    proc = _drift(["mnist", "--registry", str(tmp_path / "models"), "--output", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no-reference (retrain: yes)")
    verdict = json.loads(out.read_text())
    assert verdict["decision"] == "no-reference" and verdict["retrain"] is True
    assert verdict["thresholds"] == {"alpha": 0.01, "max_accuracy_drop": 0.05}
    assert _drift(["mnist", "--registry", str(tmp_path / "models"), "--fail-on-drift"], tmp_path).returncode == 1


@pytest.mark.s3
def test_s3_missing_prefix_missing_bucket_and_bad_credentials(s3_server, s3_bucket, tmp_path) -> None:
    env = s3_server.env()
    registry = ["--registry", str(tmp_path / "models")]
    _one_line_exit_2(_drift([f"s3://{s3_bucket}/no/such/prefix", *registry], tmp_path, env),
                     f"s3://{s3_bucket}/no/such/prefix holds no objects")
    _one_line_exit_2(_drift(["s3://no-such-bucket-x1/data", *registry], tmp_path, env),
                     "listing s3://no-such-bucket-x1/data failed: the bucket does not exist")
    bad = {**env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
    _one_line_exit_2(_drift([f"s3://{s3_bucket}/data", *registry], tmp_path, bad),
                     f"listing s3://{s3_bucket}/data failed: S3 credentials rejected (SignatureDoesNotMatch)")


def test_an_unreadable_image_in_the_new_data_is_one_line(tmp_path) -> None:
    """Review (2026-11-29): one undecodable .png in the new data ended `trainflow drift` in a
    PIL.UnidentifiedImageError traceback (an OSError: no ValueError, so no one line); an AppleDouble
    ``._x.png`` (macOS) did too. Now the dot-file is left out and the bad image named in one line."""
    import numpy as np
    from PIL import Image

    from components.drift.profile import PROFILE_FILE, profile_prepared
    from components.registry.store import ModelRegistry
    from components.training.sources import prepare
    from trainflow.common.listing import list_folder, listing_fingerprint
    from trainflow.storage.local import LocalStorage

    rng = np.random.default_rng(0)
    for folder in ("train", "new"):
        for label in ("a", "b"):
            (tmp_path / folder / label).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(tmp_path / folder / label / f"{i}.png")
    prepare(str(tmp_path / "train"), tmp_path / "prepared", image_size=8, channels=1)
    listing_fp = listing_fingerprint(list_folder(tmp_path / "train"))
    model = tmp_path / "model"  # never read: the new data fails first
    model.mkdir()
    (model / "model.pt").write_bytes(b"weights")
    (model / "model.json").write_text("{}")
    ModelRegistry(LocalStorage(str(tmp_path / "models"))).register(
        "m", model, {"dataset": {"listing_fingerprint": listing_fp}},
        extra_files={PROFILE_FILE: profile_prepared(tmp_path / "prepared", listing_fingerprint=listing_fp).dumps()})
    args = ["--registry", str(tmp_path / "models"), "--model-name", "m"]

    (tmp_path / "new" / "a" / "._0.png").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    proc = _drift([str(tmp_path / "new"), *args], tmp_path)
    assert proc.returncode == 0 and proc.stdout.split(" ", 1)[0] in ("no-drift", "drift"), proc.stderr
    (tmp_path / "new" / "b" / "bad.png").write_bytes(b"not a png")
    _one_line_exit_2(_drift([str(tmp_path / "new"), *args], tmp_path),
                     f"{tmp_path / 'new' / 'b' / 'bad.png'} is not a readable image: not a format PIL can identify")
    # Review 2026-11-30: a registry file that cannot be read (here a folder where the profile was; on
    # S3 a 503 or a reset) was a CheckpointStorageError traceback.
    (tmp_path / "new" / "b" / "bad.png").unlink()
    profile = next((tmp_path / "models").rglob(PROFILE_FILE))
    profile.unlink()
    profile.mkdir()
    _one_line_exit_2(_drift([str(tmp_path / "new"), *args], tmp_path),
                     f"model registry {tmp_path / 'models'}: reading {profile} failed: [Errno 21] Is a directory")
