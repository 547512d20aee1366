"""A storage failure while a worker reads checkpoints back (after the start-up ``check()`` passed) is
sorted like one at start: permanent — exit 2 and one line naming the path and the storage's reason —
or transient — exit 1 and one line, retried. Before: a traceback and exit 1 either way, so torchrun
and the PyTorchJob retried a permanent refusal over and over. The checkpoint it could not read is
neither skipped as corrupt nor deleted (that would roll training back).
Real processes: lone ``python -m components.training``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.training.__main__ import transient_storage_failure
from components.training.checkpoint.manager import CheckpointManager
from trainflow.storage import CheckpointStorageError
from trainflow.storage.local import LocalStorage

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

_EIO_ON_STATE_FILES = """
import contextlib, errno, sys
from trainflow.storage.local import LocalStorage

real_open_read = LocalStorage.open_read

class _Failing:
    def read(self, *args):
        raise OSError(errno.EIO, "Input/output error")

@contextlib.contextmanager
def open_read(self, key, *, abandon=None):
    if "/state-" in key:  # a step's state file: the disk answers EIO (a transient fault)
        yield _Failing()
        return
    with real_open_read(self, key, abandon=abandon) as f:
        yield f

LocalStorage.open_read = open_read
from components.training.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def _worker(dataset: Path, ckpt: Path, *extra: str, error_file: Path | None = None,
            eio_on_state_files: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
    entry = ["-c", _EIO_ON_STATE_FILES] if eio_on_state_files else ["-m", "components.training"]
    cmd = [sys.executable, *entry, "--dataset", str(dataset), "--checkpoint-uri", str(ckpt), "--job-key", "job",
           "--epochs", "1", "--global-batch-size", "32", "--threads-per-rank", "1",
           "--checkpoint-interval-steps", "5", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)


def test_a_step_file_that_cannot_be_opened_fails_the_resume_for_good(digits_dataset, tmp_path) -> None:
    """The committed step's state file replaced by a folder (EISDIR, a read no retry can fix; we
    run as root, where ``chmod 000`` would not stop the read): exit 2 with one line naming the
    path, recorded in torchelastic's error file. Step 5 is not skipped (no roll-back to step 0):
    once the file is back, the same command resumes from it."""
    ckpt = tmp_path / "ckpt"
    first = _worker(digits_dataset, ckpt, "--max-steps", "5")
    assert first.returncode == 0, first.stderr[-2000:]
    state = next((ckpt / "job" / "step-0000000005").glob("state-*.pt"))
    saved = state.read_bytes()
    state.unlink()
    state.mkdir()

    error_file = tmp_path / "error.json"
    refused = _worker(digits_dataset, ckpt, "--max-steps", "10", error_file=error_file)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last == f"trainflow: reading {state} failed: [Errno 21] Is a directory: '{state}'", last
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["extraInfo"]["trainflow_exit_code"] == "2" and recorded["message"] == last
    assert "skipping checkpoint" not in refused.stderr
    mgr = CheckpointManager(LocalStorage(str(ckpt / "job")))
    assert mgr.committed_steps() == [5]
    with pytest.raises(CheckpointStorageError) as raised:  # what the worker sorted: the OSError is the cause
        mgr.load_latest()
    assert isinstance(raised.value.__cause__, IsADirectoryError) and not transient_storage_failure(raised.value)

    state.rmdir()
    state.write_bytes(saved)
    back = _worker(digits_dataset, ckpt, "--max-steps", "10")
    assert back.returncode == 0, back.stderr[-2000:]
    assert "resumed from step 5 " in back.stderr


def test_a_transient_read_error_on_resume_is_retried_in_one_line(digits_dataset, tmp_path) -> None:
    """EIO while the committed step's state file is read: exit 1 (torchrun restarts the group) with
    one ``storage unavailable`` line, nothing recorded as permanent, the checkpoint kept."""
    ckpt = tmp_path / "ckpt"
    first = _worker(digits_dataset, ckpt, "--max-steps", "5")
    assert first.returncode == 0, first.stderr[-2000:]
    error_file = tmp_path / "error.json"
    failed = _worker(digits_dataset, ckpt, "--max-steps", "10", error_file=error_file, eio_on_state_files=True)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("trainflow: storage unavailable for now, the worker group is restarted: reading "
                           "step-0000000005/state-g0000000001.pt failed: OSError: [Errno 5] Input/output error"), last
    assert not error_file.exists()
    assert "skipping checkpoint" not in failed.stderr
    assert CheckpointManager(LocalStorage(str(ckpt / "job"))).committed_steps() == [5]

