"""CheckpointManager: two-phase save, manifest-last commit, verified load, fallback, retention.

Matrix: commit protocol (manifest written last, sizes/SHA-256 recorded); load newest; skip a latest
checkpoint that is corrupt (bit flip), truncated, missing its state file, has a garbage or wrong-step
manifest, or is uncommitted; staging isolates the saved values from later in-place updates;
at most one save in flight (skip when busy, wait when blocking); persist retries then gives up
without raising; retention keeps k and deletes leftovers. S3 variants run against MinIO (marker s3).
"""

from __future__ import annotations

import json
import logging
import threading

import pytest
import torch

from components.training.checkpoint import layout
from components.training.checkpoint.manager import CheckpointManager, CheckpointRefusedError, RetryPolicy
from trainflow.storage import CheckpointStorageError, read_bytes, write_bytes
from trainflow.storage.local import LocalStorage

STATE = layout.state_name(1)  # the state file of the first writer generation


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((4, 4), float(step))}, "train_state": {"step": step, "note": "x"}}


@pytest.fixture
def storage(tmp_path) -> LocalStorage:
    return LocalStorage(str(tmp_path / "job"))


def _save_all(mgr: CheckpointManager, steps) -> None:
    for s in steps:
        assert mgr.save(s, _state(s), blocking=True) == "committed"


def test_save_commits_manifest_last_with_checksums(storage) -> None:
    mgr = CheckpointManager(storage, keep_last_k=5, manifest_extra={"job_key": "j"})
    _save_all(mgr, [10])
    manifest = json.loads(read_bytes(storage, "step-0000000010/MANIFEST.json"))
    assert manifest["format"] == layout.FORMAT and manifest["step"] == 10 and manifest["job_key"] == "j"
    meta = manifest["files"][STATE]
    assert manifest["writer_generation"] == 1
    data = read_bytes(storage, f"step-0000000010/{STATE}")
    import hashlib

    assert meta == {"size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 10
    assert torch.equal(loaded.state["model"]["w"], torch.full((4, 4), 10.0))
    assert loaded.state["train_state"] == {"step": 10, "note": "x"}
    assert mgr.stats.committed == 1 and mgr.stats.last_committed_step == 10


def _flip_byte(storage, key: str) -> None:
    data = bytearray(read_bytes(storage, key))
    data[len(data) // 2] ^= 0xFF
    write_bytes(storage, key, bytes(data))


@pytest.mark.parametrize(
    "damage",
    ["bit_flip", "truncated", "missing_state", "garbage_manifest", "wrong_step_manifest", "uncommitted"],
)
def test_corrupt_latest_falls_back_to_previous(storage, damage, caplog) -> None:
    mgr = CheckpointManager(storage, keep_last_k=5)
    _save_all(mgr, [1, 2])
    state_key, manifest_key = f"step-0000000002/{STATE}", "step-0000000002/MANIFEST.json"
    if damage == "bit_flip":
        _flip_byte(storage, state_key)
    elif damage == "truncated":
        write_bytes(storage, state_key, read_bytes(storage, state_key)[:100])
    elif damage == "missing_state":
        storage.delete([state_key])
    elif damage == "garbage_manifest":
        write_bytes(storage, manifest_key, b"{not json")
    elif damage == "wrong_step_manifest":
        m = json.loads(read_bytes(storage, manifest_key))
        write_bytes(storage, manifest_key, json.dumps({**m, "step": 7}).encode())
    elif damage == "uncommitted":
        storage.delete([manifest_key])
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        loaded = mgr.load_latest()
    assert loaded is not None and loaded.step == 1
    assert torch.equal(loaded.state["model"]["w"], torch.full((4, 4), 1.0))
    if damage != "uncommitted":  # an uncommitted checkpoint is invisible, not "skipped"
        assert any("skipping checkpoint at step 2" in r.getMessage() for r in caplog.records)


def test_all_corrupt_means_fresh_start(storage) -> None:
    mgr = CheckpointManager(storage)
    _save_all(mgr, [3])
    _flip_byte(storage, f"step-0000000003/{STATE}")
    assert mgr.load_latest() is None


def test_staging_snapshots_values_before_later_updates(storage) -> None:
    mgr = CheckpointManager(storage)
    w = torch.zeros(1000)
    state = {"model": {"w": w}}
    assert mgr.save(1, state) == "staged"
    w.add_(5.0)  # the optimizer updates the weights while the persist runs
    assert mgr.wait()
    loaded = mgr.load_latest()
    assert loaded is not None and torch.count_nonzero(loaded.state["model"]["w"]) == 0


class _SlowStorage(LocalStorage):
    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.release = threading.Event()

    def open_write(self, key, *, create_only=False):
        if layout.is_state_name(key.rsplit("/", 1)[-1]):
            assert self.release.wait(10)
        return super().open_write(key, create_only=create_only)


def test_at_most_one_save_in_flight(tmp_path) -> None:
    storage = _SlowStorage(str(tmp_path / "slow"))
    mgr = CheckpointManager(storage, keep_last_k=5)
    assert mgr.save(1, _state(1)) == "staged"
    assert mgr.save(2, _state(2)) == "skipped"  # training does not wait for a slow store
    assert mgr.stats.skipped_in_flight == 1
    storage.release.set()
    assert mgr.save(3, _state(3), blocking=True) == "committed"  # blocking waits for step 1 first
    assert mgr.committed_steps() == [3, 1]


class _FlakyStorage(LocalStorage):
    def __init__(self, uri: str, failures: int) -> None:
        super().__init__(uri)
        self.failures = failures

    def open_write(self, key, *, create_only=False):
        if layout.is_state_name(key.rsplit("/", 1)[-1]) and self.failures > 0:
            self.failures -= 1
            raise CheckpointStorageError("S3 endpoint unreachable (simulated)")
        return super().open_write(key, create_only=create_only)


def test_persist_retries_with_backoff_then_commits(tmp_path, caplog) -> None:
    mgr = CheckpointManager(
        _FlakyStorage(str(tmp_path / "f"), failures=2), retry=RetryPolicy(attempts=3, base_s=0.01)
    )
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        assert mgr.save(5, _state(5), blocking=True) == "committed"
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 2


def test_persist_gives_up_without_raising(tmp_path, caplog) -> None:
    mgr = CheckpointManager(
        _FlakyStorage(str(tmp_path / "f"), failures=99), retry=RetryPolicy(attempts=2, base_s=0.01)
    )
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        assert mgr.save(5, _state(5), blocking=True) == "failed"
    assert mgr.stats.failed == 1 and mgr.committed_steps() == []
    assert any("NOT saved after 2 attempts" in r.getMessage() for r in caplog.records)


def test_retention_keeps_last_k_and_removes_leftovers(storage) -> None:
    write_bytes(storage, "step-0000000001/state.pt", b"crashed persist, never committed")
    mgr = CheckpointManager(storage, keep_last_k=2)
    _save_all(mgr, [2, 3, 4])
    write_bytes(storage, "step-0000000009/state.pt", b"in flight elsewhere")
    _save_all(mgr, [5])
    assert mgr.committed_steps() == [5, 4]
    assert storage.list("step-0000000001") == [] and storage.list("step-0000000003") == []
    assert storage.list("step-0000000009") == ["step-0000000009/state.pt"]  # newer: not ours to delete


def test_keep_last_k_must_be_positive(storage) -> None:
    with pytest.raises(ValueError, match="keep_last_k must be >= 1"):
        CheckpointManager(storage, keep_last_k=0)


def test_a_state_weights_only_refuses_is_refused_at_save_and_at_load(storage) -> None:
    """Review (2026-11-29): a state holding a type outside ``torch.load(weights_only=True)``'s
    allow-list committed fine, and every resume skipped it as corrupt (rolled training back to an
    older checkpoint, or to step 0). Now the save that first holds it is refused, and a checkpoint
    written that way (an older trainer, another torch) fails the load in one line, not skipped."""
    import collections

    mgr = CheckpointManager(storage)
    mgr.claim()
    _save_all(mgr, [10])
    bad = {**_state(20), "task_state": {"recent": collections.deque([1.0])}}
    with pytest.raises(CheckpointRefusedError, match=r"^this checkpoint could never be loaded back \(Unsupported "
                                                      r"global: GLOBAL collections\.deque\): keep the state"):
        mgr.save(20, bad, blocking=True)
    assert mgr.committed_steps() == [10]  # nothing written for it
    assert mgr.save(30, _state(30), blocking=True) == "committed"  # the check passed once: cached, still checked
    mgr._loadable_types.add(collections.deque)  # as a trainer without the check wrote it
    assert mgr.save(40, bad, blocking=True) == "committed"
    mgr.close()
    with pytest.raises(CheckpointRefusedError) as refused:
        CheckpointManager(storage).load_latest()
    message = str(refused.value)
    assert "\n" not in message and message.startswith("step-0000000040/")
    assert "(Unsupported global: GLOBAL collections.deque): allow the type with torch.serialization" in message


def test_a_refused_type_is_found_in_dict_keys_and_sets_after_an_earlier_save_passed(storage) -> None:
    """Review (2026-11-29): the check recorded the types of values only, so a later save whose new
    type sat in a dict key (a numpy integer) or a set was taken as already checked and committed."""
    import numpy as np

    mgr = CheckpointManager(storage)
    mgr.claim()
    assert mgr.save(10, {**_state(10), "task_state": {"counts": {}, "seen": set()}}, blocking=True) == "committed"
    for bad in ({"counts": {np.int64(3): 5}, "seen": set()}, {"counts": {}, "seen": {np.int64(3)}}):
        with pytest.raises(CheckpointRefusedError, match=r"^this checkpoint could never be loaded back \(.*numpy"):
            mgr.save(20, {**_state(20), "task_state": bad}, blocking=True)
    assert mgr.committed_steps() == [10]


def test_an_error_raised_while_checking_loadability_is_not_a_refusal(storage, monkeypatch) -> None:
    """Review 2026-11-30: any exception of the round trip read as "could never be loaded back", a
    permanent failure (exit 2). A DataLoader worker killed meanwhile surfaced there (SIGCHLD) and
    ended a preempted job for good; only the weights-only unpickler's refusal is one."""
    import torch

    mgr = CheckpointManager(storage)
    mgr.claim()

    def dying_worker(*args, **kwargs):
        raise RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated.")

    monkeypatch.setattr(torch, "load", dying_worker)
    with pytest.raises(RuntimeError, match="killed by signal"):
        mgr.save(10, _state(10), blocking=True)
    mgr.close()
