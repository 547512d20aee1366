"""Review findings (shared/research/reliability-review-2026-11.md) in the checkpoint layer, each
reproduced first: two writers on one job key (2), retention after a fallback (3), leftovers of
interrupted writes and a full disk under the metrics file (7), the SIGTERM save's deadline (8),
secrets in ``S3Settings``' repr (10), and a durable job folder (12). Local folder here; the S3 variants
against MinIO are in test_checkpoint_s3_hardening.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from components.training.checkpoint import layout
from components.training.checkpoint.manager import CheckpointManager, RetryPolicy, WriterFencedError
from components.training.metrics import JsonlSink
from trainflow.storage import CheckpointStorageError, read_bytes, write_bytes
from trainflow.storage import local as local_mod
from trainflow.storage.local import LocalStorage


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((64,), float(value))}, "train_state": {"step": int(value)}}


class _GatedStorage(LocalStorage):
    """Blocks the manifest write of one step until ``release`` is set (to interleave two writers)."""

    def __init__(self, uri: str, gate_step: int) -> None:
        super().__init__(uri)
        self.gate_key = layout.manifest_key(gate_step)
        self.reached = threading.Event()
        self.release = threading.Event()

    def open_write(self, key, *, create_only=False):
        if key == self.gate_key:
            self.reached.set()
            assert self.release.wait(30)
        return super().open_write(key, create_only=create_only)


def test_two_writers_on_one_key_leave_a_loadable_checkpoint(tmp_path) -> None:
    """Finding 2: writes ordered A.state, B.state, B.manifest, A.manifest (A the older writer)."""
    root = str(tmp_path / "job")
    a = CheckpointManager(_GatedStorage(root, gate_step=100), keep_last_k=2, retry=RetryPolicy(attempts=1))
    a.claim()
    assert a.save(100, _state(1.0)) == "staged"
    assert a._in_flight is not None
    assert a.storage.reached.wait(30)  # A wrote its state and waits before its manifest
    b = CheckpointManager(LocalStorage(root), keep_last_k=2)
    assert b.claim() == a.generation + 1  # a retry / second run takes the key over
    assert b.save(100, _state(2.0), blocking=True) == "committed"
    a.storage.release.set()
    assert a.wait(30)
    assert a.fenced is not None and a.stats.failed == 1  # A saw B's claim: wrote no manifest
    loaded = CheckpointManager(LocalStorage(root)).load_latest()
    assert loaded is not None and loaded.step == 100 and torch.equal(loaded.state["model"]["w"], torch.full((64,), 2.0))
    assert loaded.manifest["writer_generation"] == b.generation


def test_a_fenced_writer_neither_commits_nor_deletes(tmp_path) -> None:
    root = str(tmp_path / "job")
    old = CheckpointManager(LocalStorage(root), keep_last_k=1)
    old.claim()
    new = CheckpointManager(LocalStorage(root), keep_last_k=3)
    new.claim()
    for step in (50, 60):
        assert new.save(step, _state(step), blocking=True) == "committed"
    assert old.save(70, _state(70), blocking=True) == "fenced"
    assert new.committed_steps() == [60, 50]  # the old writer's retention (k=1) did not run
    with pytest.raises(WriterFencedError, match="took over this job key"):
        old.check_fence()
    assert old.save(80, _state(80)) == "fenced"  # and it stays fenced


def test_retention_after_a_fallback_keeps_the_new_commit(tmp_path) -> None:
    """Finding 3: k=1, the newest checkpoint is corrupt, a new manager starts fresh and saves an
    earlier step: its own retention must not delete what it just committed."""
    storage = LocalStorage(str(tmp_path / "job"))
    first = CheckpointManager(storage, keep_last_k=1)
    assert first.save(100, _state(100), blocking=True) == "committed"
    key = f"step-0000000100/{layout.state_name(first.generation)}"
    data = bytearray(read_bytes(storage, key))
    data[len(data) // 2] ^= 0xFF
    write_bytes(storage, key, bytes(data))
    again = CheckpointManager(storage, keep_last_k=1)
    again.claim()
    assert again.load_latest() is None
    assert again.save(10, _state(10), blocking=True) == "committed"
    assert again.committed_steps() == [10]  # the corrupt step 100 is gone, step 10 stays
    assert again.load_latest().step == 10


def test_retention_verifies_older_checkpoints_once_and_drops_corrupt_ones(tmp_path) -> None:
    storage = LocalStorage(str(tmp_path / "job"))
    first = CheckpointManager(storage, keep_last_k=3)
    for step in (10, 20, 30):
        first.save(step, _state(step), blocking=True)
    write_bytes(storage, f"step-0000000020/{layout.state_name(first.generation)}", b"truncated")
    second = CheckpointManager(storage, keep_last_k=3)
    second.claim()
    assert second.load_latest().step == 30
    second.save(40, _state(40), blocking=True)
    assert second.committed_steps() == [40, 30, 10]  # 20 failed its checksum: not counted, deleted


def _kill_mid_write(root: str) -> None:
    code = (
        "import os, signal, sys\n"
        "from trainflow.storage.local import LocalStorage\n"
        f"s = LocalStorage({root!r})\n"
        "with s.open_write('step-0000000005/state-g0000000001.pt') as f:\n"
        "    f.write(b'x' * 100000); f.flush()\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_leftovers_of_a_killed_persist_are_removed(tmp_path) -> None:
    """Finding 7: a persist killed mid-write leaves a hidden temp file that nothing removed."""
    root = str(tmp_path / "job")
    _kill_mid_write(root)
    leftovers = [p for p in (tmp_path / "job").rglob("*") if ".tmp-" in p.name]
    assert len(leftovers) == 1
    mgr = CheckpointManager(LocalStorage(root), keep_last_k=1)
    mgr.claim()  # a restarted writer claims the key
    assert mgr.save(10, _state(10), blocking=True) == "committed"
    assert [p for p in (tmp_path / "job").rglob("*") if ".tmp-" in p.name] == []
    assert not (tmp_path / "job" / "step-0000000005").exists()


def test_a_full_disk_under_the_metrics_file_does_not_stop_checkpoints(tmp_path, caplog) -> None:
    """Finding 7: ENOSPC from the metrics sink in the persist thread skipped retention."""
    sink = JsonlSink("/dev/full")  # every write fails with ENOSPC
    sink.record({"event": "start"})
    assert sink.dropped == 1
    storage = LocalStorage(str(tmp_path / "job"))
    events = []

    def on_event(event):
        events.append(event)
        raise OSError(28, "No space left on device")

    mgr = CheckpointManager(storage, keep_last_k=1, on_event=on_event)
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        for step in (1, 2, 3):
            assert mgr.save(step, _state(step), blocking=True) == "committed"
    assert mgr.committed_steps() == [3]  # retention ran after every commit
    assert len(events) == 3


class _StuckStorage(LocalStorage):
    def open_write(self, key, *, create_only=False):
        if layout.is_state_name(key.rsplit("/", 1)[-1]):
            time.sleep(5)
        return super().open_write(key, create_only=create_only)


def test_a_blocking_save_gives_up_at_its_deadline(tmp_path, caplog) -> None:
    """Finding 8: the SIGTERM save must fit the grace period, and say so when it did not."""
    mgr = CheckpointManager(_StuckStorage(str(tmp_path / "job")))
    mgr.claim()
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        outcome = mgr.save(7, _state(7), blocking=True, deadline_s=0.5)
    assert outcome == "failed" and time.monotonic() - t0 < 2.0
    assert any("checkpoint at step 7 NOT saved within its 0.5 s deadline" in r.getMessage() for r in caplog.records)


def test_s3_settings_repr_hides_secrets() -> None:
    """Finding 10."""
    from trainflow.storage.s3 import S3Settings

    text = repr(S3Settings(access_key="AKIAEXAMPLE", secret_key="s3cr3t-value", session_token="t0ken-value"))
    assert "s3cr3t-value" not in text and "t0ken-value" not in text and "AKIAEXAMPLE" in text


def test_local_commit_makes_new_folders_durable(tmp_path, monkeypatch) -> None:
    """Finding 12: creating ``step-N/`` (and the job folder) must be fsynced in its parent too."""
    synced = []
    real = local_mod._fsync_dir
    monkeypatch.setattr(local_mod, "_fsync_dir", lambda p: (synced.append(p), real(p)))
    storage = LocalStorage(str(tmp_path / "ckpt" / "job"))
    write_bytes(storage, "step-0000000001/MANIFEST.json", b"{}")
    # the parents of every created folder, then the folder holding the committed file
    assert synced == [tmp_path, tmp_path / "ckpt", tmp_path / "ckpt" / "job", tmp_path / "ckpt" / "job" / "step-0000000001"]
    # The trainer's first call, on every rank, is check(): the folders it creates are fsynced into
    # their parents too (review 2026-11-30: its mkdir -p was not, and _makedirs later found them there).
    synced.clear()
    LocalStorage(str(tmp_path / "other" / "run1" / "train")).check()
    assert synced[:3] == [tmp_path, tmp_path / "other", tmp_path / "other" / "run1"]


def test_claims_are_create_only_and_numbered(tmp_path) -> None:
    storage = LocalStorage(str(tmp_path / "job"))
    gens = [CheckpointManager(storage).claim() for _ in range(3)]
    assert gens == [1, 2, 3]
    claim = json.loads(read_bytes(storage, layout.writer_key(2)))
    assert claim["generation"] == 2 and claim["pid"] == os.getpid()


def test_a_step_already_committed_is_kept_when_good_and_replaced_when_corrupt(tmp_path) -> None:
    storage = LocalStorage(str(tmp_path / "job"))
    first = CheckpointManager(storage)
    first.save(30, _state(30), blocking=True)
    second = CheckpointManager(storage)
    second.claim()
    assert second.save(30, _state(99), blocking=True) == "committed"  # e.g. SIGTERM right after a resume
    kept = second.load_latest()
    assert kept.manifest["writer_generation"] == 1 and torch.equal(kept.state["model"]["w"], torch.full((64,), 30.0))
    assert storage.list("step-0000000030/") == ["step-0000000030/MANIFEST.json", f"step-0000000030/{layout.state_name(1)}"]
    write_bytes(storage, f"step-0000000030/{layout.state_name(1)}", b"garbage")
    third = CheckpointManager(storage)
    third.claim()
    assert third.save(30, _state(31), blocking=True) == "committed"
    replaced = third.load_latest()
    assert replaced.step == 30 and replaced.manifest["writer_generation"] == 3
    assert storage.list("step-0000000030/") == ["step-0000000030/MANIFEST.json", f"step-0000000030/{layout.state_name(3)}"]


# --------------------------------------------------------------- transient read errors are no corruption
class _FlakyReadStorage(LocalStorage):
    """A real local store whose reads of one step's state file fail with ``error`` while it is set:
    ``after_verify=False`` from the first read (the checksum pass), ``True`` only once the manager
    rewound the file for ``torch.load`` (an NFS hiccup between the two passes)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.fail_step: int | None = None
        self.error: BaseException = OSError(5, "Input/output error")
        self.after_verify = False

    def open_read(self, key, *, abandon=None):
        inner = super().open_read(key, abandon=abandon)
        if self.fail_step is None or not key.startswith(f"{layout.step_prefix(self.fail_step)}/state"):
            return inner
        return _FailingReads(inner, self.error, armed=not self.after_verify)


class _FailingReads:
    def __init__(self, inner, error: BaseException, *, armed: bool) -> None:
        self._inner, self._error, self._armed = inner, error, armed

    def __enter__(self):
        self._f = self._inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)

    def read(self, n=-1):
        if self._armed:
            raise self._error
        return self._f.read(n)

    def readinto(self, buf):
        if self._armed:
            raise self._error
        return self._f.readinto(buf)

    def seek(self, *args):
        self._armed = True  # the checksum pass is over: the next read is torch.load's
        return self._f.seek(*args)

    def tell(self):
        return self._f.tell()

    def readable(self):
        return True

    def seekable(self):
        return True


def _three_commits(storage) -> None:
    first = CheckpointManager(storage, keep_last_k=3)
    for step in (10, 20, 30):
        assert first.save(step, _state(step), blocking=True) == "committed"
    first.close()


def test_a_read_error_while_retention_verifies_deletes_nothing(tmp_path, caplog) -> None:
    """An EIO while a restarted writer's retention verifies an older checkpoint is no corruption:
    retention skips its round (before: it deleted the good step 20)."""
    storage = _FlakyReadStorage(str(tmp_path / "job"))
    _three_commits(storage)
    restarted = CheckpointManager(storage, keep_last_k=3)  # its cache of known-good steps is empty
    restarted.claim()
    storage.fail_step = 20
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        assert restarted.save(40, _state(40), blocking=True) == "committed"
    assert restarted.committed_steps() == [40, 30, 20, 10]  # nothing deleted this round
    assert not any("corrupt" in r.getMessage() for r in caplog.records)
    assert any(r.getMessage().startswith("checkpoint retention skipped: reading step-0000000020/state-g0000000001.pt "
                                         "failed: OSError: [Errno 5] Input/output error") for r in caplog.records)
    storage.fail_step = None
    assert torch.equal(restarted.load_step(20).state["model"]["w"], torch.full((64,), 20.0))
    assert restarted.save(50, _state(50), blocking=True) == "committed"
    assert restarted.committed_steps() == [50, 40, 30]  # the next round catches up


def _cpu_allocator_fails(*args, **kwargs):
    torch.empty(2**55, dtype=torch.uint8)  # 32 PiB: torch's real "can't allocate memory" RuntimeError


def _memory_error(*args, **kwargs):
    raise MemoryError()


@pytest.mark.parametrize("fault", ["eio_while_verifying", "estale_in_torch_load", "memory_error_in_torch_load",
                                   "cpu_allocator_fails_in_torch_load"])
def test_a_read_error_on_load_fails_the_load_instead_of_rolling_back(tmp_path, monkeypatch, caplog, fault) -> None:
    """A transient failure reading the newest checkpoint must fail the load (the run is retried), not
    skip it as corrupt and resume from an older one (before: load_latest returned step 20)."""
    storage = _FlakyReadStorage(str(tmp_path / "job"))
    _three_commits(storage)
    mgr = CheckpointManager(storage, keep_last_k=3)
    real_load = torch.load
    if fault == "eio_while_verifying":
        storage.fail_step = 30
    elif fault == "estale_in_torch_load":
        storage.fail_step, storage.after_verify, storage.error = 30, True, OSError(116, "Stale file handle")
    else:
        monkeypatch.setattr(torch, "load", _memory_error if fault == "memory_error_in_torch_load"
                            else _cpu_allocator_fails)
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"), \
            pytest.raises(CheckpointStorageError) as raised:
        mgr.load_latest()
    reason = {"eio_while_verifying": "reading step-0000000030/state-g0000000001.pt failed: OSError: [Errno 5]",
              "estale_in_torch_load": "step-0000000030/state-g0000000001.pt: cannot be loaded now: ",
              "memory_error_in_torch_load": "step-0000000030/state-g0000000001.pt: cannot be loaded now: MemoryError",
              "cpu_allocator_fails_in_torch_load": "step-0000000030/state-g0000000001.pt: cannot be loaded now: "
                                                   "RuntimeError: "}[fault]
    assert str(raised.value).startswith(reason), str(raised.value)
    assert not any("skipping checkpoint" in r.getMessage() for r in caplog.records)
    storage.fail_step = None
    monkeypatch.setattr(torch, "load", real_load)
    loaded = mgr.load_latest()
    assert loaded.step == 30 and torch.equal(loaded.state["model"]["w"], torch.full((64,), 30.0))
    assert mgr.committed_steps() == [30, 20, 10]


def test_a_state_file_that_verifies_but_does_not_unpickle_is_corrupt(tmp_path, caplog) -> None:
    """Format errors still count as corruption: the manifest describes bytes torch cannot load."""
    storage = LocalStorage(str(tmp_path / "job"))
    _three_commits(storage)
    key = f"step-0000000030/{layout.state_name(1)}"
    garbage = b"not a torch file" * 10
    write_bytes(storage, key, garbage)
    manifest = json.loads(read_bytes(storage, layout.manifest_key(30)))
    manifest["files"][layout.state_name(1)] = {"size_bytes": len(garbage),
                                               "sha256": hashlib.sha256(garbage).hexdigest()}
    write_bytes(storage, layout.manifest_key(30), json.dumps(manifest).encode())
    mgr = CheckpointManager(storage)
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        assert mgr.load_latest().step == 20
    assert any(r.getMessage().startswith(f"skipping checkpoint at step 30: {key}: cannot be loaded: ")
               for r in caplog.records)


# --------------------------------------------------------------- retention outside a blocking save's deadline
class _SlowStateReads(LocalStorage):
    """A real local store where reading a state file takes ``delay_s`` while ``slow`` (a big older
    checkpoint being downloaded and hashed by retention)."""

    def __init__(self, uri: str, delay_s: float) -> None:
        super().__init__(uri)
        self.delay_s = delay_s
        self.slow = False

    def open_read(self, key, *, abandon=None):
        if self.slow and layout.is_state_name(key.rsplit("/", 1)[-1]):
            time.sleep(self.delay_s)
        return super().open_read(key, abandon=abandon)


#: One state-file read of a retention that verifies older checkpoints (2 of them below: 8 s in all).
RETENTION_READ_S = 4.0
#: The SIGTERM save's deadline: well above a commit on a loaded machine, below the retention's reads.
RETENTION_SAVE_DEADLINE_S = 1.5 * RETENTION_READ_S
#: A save that does not wait for the retention returns within half of the retention's reads.
RETURNED_WITHIN_S = RETENTION_READ_S


def test_a_blocking_save_is_committed_although_its_retention_is_slow(tmp_path) -> None:
    """The SIGTERM save returns at its commit; retention of the older checkpoints (2 x 4 s of reads
    here) runs after it, outside the 6 s deadline (before: "failed", though step 40 was committed)."""
    storage = _SlowStateReads(str(tmp_path / "job"), delay_s=RETENTION_READ_S)
    _three_commits(storage)
    restarted = CheckpointManager(storage, keep_last_k=3)
    restarted.claim()
    storage.slow = True
    t0 = time.monotonic()
    assert restarted.save(40, _state(40), blocking=True, deadline_s=RETENTION_SAVE_DEADLINE_S) == "committed"
    assert time.monotonic() - t0 < RETURNED_WITHIN_S  # waiting for the retention: 2 x RETENTION_READ_S
    assert restarted.stats.last_committed_step == 40 and restarted.stats.failed == 0
    assert not restarted.wait(timeout_s=0)  # retention still verifies 30 and 20
    assert restarted.wait(timeout_s=60)
    assert restarted.committed_steps() == [40, 30, 20]  # and then deleted 10
    restarted.close()


#: One state-file read of the previous save's retention (three older checkpoints: 9 s in all).
HURRIED_READ_S = 3.0
#: The SIGTERM save's deadline: the retention's read under way (one) and a commit on a loaded machine
#: fit; its three reads (what the save would wait for if the retention did not stop early) do not.
HURRIED_SAVE_DEADLINE_S = 2 * HURRIED_READ_S


def test_a_blocking_save_does_not_wait_for_the_previous_save_s_retention(tmp_path, caplog) -> None:
    """A SIGTERM right after a periodic commit whose retention verifies three older checkpoints
    (3 x 3 s): that retention stops early, the SIGTERM save commits within its 6 s deadline, and
    a later retention finishes the clean-up."""
    storage = _SlowStateReads(str(tmp_path / "job"), delay_s=HURRIED_READ_S)
    first = CheckpointManager(storage, keep_last_k=4)
    for step in (10, 20, 30, 35):
        assert first.save(step, _state(step), blocking=True) == "committed"
    first.close()
    restarted = CheckpointManager(storage, keep_last_k=4)
    restarted.claim()
    storage.slow = True
    assert restarted.save(40, _state(40)) == "staged"
    deadline = time.monotonic() + 30
    while restarted.stats.last_committed_step != 40:  # committed; its retention now reads step 35
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="trainflow.checkpoint"):
        assert restarted.save(41, _state(41), blocking=True, deadline_s=HURRIED_SAVE_DEADLINE_S) == "committed"
    assert time.monotonic() - t0 < HURRIED_SAVE_DEADLINE_S  # waiting for the whole retention: 3 x HURRIED_READ_S
    assert any(r.getMessage().startswith("checkpoint retention stopped early: a blocking save is waiting")
               for r in caplog.records)
    storage.slow = False
    assert restarted.wait(timeout_s=30)
    assert restarted.committed_steps() == [41, 40, 35, 30]  # the next retention deleted 20 and 10
    restarted.close()
