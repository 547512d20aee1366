"""Keys the checkpoint code did not write, manifests naming unsafe files, and stores that ignore
create-only writes:

* a foreign key that is no valid storage key (``step-0000000001//notes.txt``, legal on AWS S3) in a
  listing is ignored — never deleted — instead of killing every later retention silently;
* any other exception in retention is logged (error, one line), never lost in the background future;
* a committed manifest naming ``../x`` or ``a/b`` is a corrupt checkpoint (the load falls back to an
  older one), not a storage failure that fails every restart;
* ``S3Storage.check`` refuses an endpoint that ignores ``If-None-Match: *`` (writer fencing would
  silently stop working); a fake client here, the real-MinIO variants in
  test_checkpoint_s3_hardening.py.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from components.training.checkpoint import layout
from components.training.checkpoint.manager import CheckpointManager
from trainflow.storage import CheckpointStorageError, read_bytes, write_bytes
from trainflow.storage.local import LocalStorage


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((8,), float(value))}, "train_state": {"step": int(value)}}


class _ForeignKeysStorage(LocalStorage):
    """A local store whose listing also shows ``foreign`` keys (as an S3 bucket may: ``a//b`` is a
    legal S3 key), and that records every key it is asked to delete."""

    def __init__(self, uri: str, foreign: list[str]) -> None:
        super().__init__(uri)
        self.foreign = foreign
        self.deleted: list[str] = []

    def list(self, prefix: str = "") -> list[str]:
        return sorted(super().list(prefix) + [k for k in self.foreign if k.startswith(prefix)])

    def delete(self, keys) -> None:
        keys = list(keys)
        self.deleted.extend(keys)
        super().delete(keys)


FOREIGN = ["step-0000000001//notes.txt", "step-0000000050//MANIFEST.json", "writers//g0000000009.json",
           "step-0000000002/../up.txt"]


def test_foreign_invalid_keys_are_ignored_and_retention_keeps_deleting(tmp_path, caplog) -> None:
    storage = _ForeignKeysStorage(str(tmp_path / "job"), FOREIGN)
    mgr = CheckpointManager(storage, keep_last_k=1)
    with caplog.at_level(logging.INFO, logger="trainflow.checkpoint"):
        assert mgr.claim() == 1  # writers//g0000000009.json is no claim
        for step in (10, 20, 30):
            assert mgr.save(step, _state(step)) == "staged"
            mgr._in_flight.future.result(timeout=60)  # before: ValueError from validate_key, every round
    assert mgr.committed_steps() == [30]  # before: [50, 30, 20, 10] — nothing was ever deleted
    assert not set(storage.deleted) & set(FOREIGN)  # not ours: never deleted
    notes = [r for r in caplog.records if "step-0000000001//notes.txt" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno <= logging.INFO  # logged once, not as a problem
    assert not any(r.levelno >= logging.WARNING for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert mgr.load_latest().step == 30


def test_a_corrupt_step_is_replaced_although_a_foreign_key_sits_in_its_folder(tmp_path) -> None:
    """``_existing_commit`` un-commits a corrupt step by listing its folder: a foreign key there must
    not make the save fail (before: "NOT saved: unexpected error")."""
    root = str(tmp_path / "job")
    first = CheckpointManager(LocalStorage(root))
    assert first.save(10, _state(1), blocking=True) == "committed"
    write_bytes(first.storage, f"step-0000000010/{layout.state_name(first.generation)}", b"truncated")
    storage = _ForeignKeysStorage(root, ["step-0000000010//notes.txt"])
    second = CheckpointManager(storage)
    assert second.save(10, _state(2), blocking=True) == "committed"
    assert second.stats.failed == 0 and "step-0000000010//notes.txt" not in storage.deleted
    assert torch.equal(second.load_latest().state["model"]["w"], torch.full((8,), 2.0))


class _FailingCleanupStorage(LocalStorage):
    def cleanup_incomplete(self, *, older_than_s):
        if older_than_s is not None:  # retention's call, not the claim's
            raise KeyError("boom")
        return super().cleanup_incomplete(older_than_s=older_than_s)


def test_an_unexpected_error_in_retention_is_logged_not_lost(tmp_path, caplog) -> None:
    mgr = CheckpointManager(_FailingCleanupStorage(str(tmp_path / "job")), keep_last_k=1)
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        assert mgr.save(10, _state(10)) == "staged"
        mgr._in_flight.future.result(timeout=60)  # before: KeyError, seen by nobody
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["checkpoint retention failed: KeyError: 'boom'"]
    assert mgr.save(20, _state(20), blocking=True) == "committed"
    assert mgr.committed_steps() == [20]  # the deletions before the failure still happened


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "/abs"])
def test_manifest_file_names_must_be_plain_names(name: str) -> None:
    manifest = {"format": layout.FORMAT, "step": 1,
                "files": {"state.pt": {"size_bytes": 1, "sha256": "0"}, name: {"size_bytes": 1, "sha256": "0"}}}
    with pytest.raises(ValueError, match="plain file name"):
        layout.validate_manifest(manifest)


def _commit_with_extra_file(tmp_path, name: str) -> CheckpointManager:
    """Step 10 is good; step 20's committed manifest also names ``name``."""
    storage = LocalStorage(str(tmp_path / "job"))
    mgr = CheckpointManager(storage)
    assert mgr.save(10, _state(10), blocking=True) == "committed"
    manifest = json.loads(read_bytes(storage, layout.manifest_key(10)))
    state = layout.state_name(mgr.generation)
    write_bytes(storage, f"step-0000000020/{state}", read_bytes(storage, f"step-0000000010/{state}"))
    manifest["step"] = 20
    manifest["files"] = {name: {"size_bytes": 1, "sha256": "0"}, **manifest["files"]}
    write_bytes(storage, layout.manifest_key(20), json.dumps(manifest).encode())
    return CheckpointManager(storage)


@pytest.mark.parametrize("name", ["../x", "a/b"])
def test_a_manifest_naming_an_unsafe_file_is_corrupt_and_the_load_falls_back(tmp_path, caplog, name) -> None:
    mgr = _commit_with_extra_file(tmp_path, name)
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        loaded = mgr.load_latest()  # before: CheckpointStorageError, the job restarted in a loop
    assert loaded is not None and loaded.step == 10
    assert any(r.getMessage().startswith("skipping checkpoint at step 20: ") for r in caplog.records)


def test_an_invalid_key_while_loading_is_corruption_not_a_storage_error(tmp_path, monkeypatch) -> None:
    """Defence in depth: even a manifest that got past validation counts as corrupt when its key is invalid."""
    mgr = _commit_with_extra_file(tmp_path, "a//b")
    monkeypatch.setattr(layout, "validate_manifest", lambda manifest: manifest)
    assert mgr.load_latest().step == 10


# ------------------------------------------------------------- S3: create-only writes must work


class _FakeS3Client:
    """head_bucket / put_object / delete_object of an S3 endpoint that may ignore ``If-None-Match``."""

    def __init__(self, *, honours_if_none_match: bool, first_create_only_error: str | None = None) -> None:
        self.honours = honours_if_none_match
        self.first_error = first_create_only_error
        self.objects: dict[str, bytes] = {}

    def head_bucket(self, **kwargs) -> dict:
        return {}

    def put_object(self, *, Bucket, Key, Body, IfNoneMatch=None) -> dict:
        from botocore.exceptions import ClientError

        if IfNoneMatch is not None and self.first_error:
            raise ClientError({"Error": {"Code": self.first_error, "Message": "not implemented"}}, "PutObject")
        if IfNoneMatch == "*" and self.honours and Key in self.objects:
            raise ClientError({"Error": {"Code": "PreconditionFailed", "Message": "At least one of the "
                                         "pre-conditions you specified did not hold"}}, "PutObject")
        self.objects[Key] = Body
        return {}

    def delete_object(self, *, Bucket, Key) -> dict:
        self.objects.pop(Key, None)
        return {}


def _fake_s3(client: _FakeS3Client):
    from trainflow.storage.s3 import S3Settings, S3Storage

    storage = S3Storage("s3://bucket/ckpt/job", S3Settings(endpoint_url="http://rgw.example:7480", access_key="a",
                                                           secret_key="b"))
    storage._client = client
    return storage


@pytest.mark.parametrize("first_error", [None, "NotImplemented"])
def test_s3_check_refuses_an_endpoint_that_ignores_create_only_writes(first_error) -> None:
    client = _FakeS3Client(honours_if_none_match=False, first_create_only_error=first_error)
    with pytest.raises(CheckpointStorageError) as raised:
        _fake_s3(client).check()
    message = str(raised.value)
    assert "\n" not in message and "http://rgw.example:7480" in message
    assert "does not support create-only writes" in message and "fencing cannot work" in message
    assert client.objects == {}  # the probe is deleted
    from components.training.__main__ import transient_storage_failure

    assert not transient_storage_failure(raised.value)  # exit 2: retrying cannot help (a 501 included)


def test_s3_check_passes_where_create_only_writes_work_and_leaves_nothing() -> None:
    client = _FakeS3Client(honours_if_none_match=True)
    storage = _fake_s3(client)
    storage.check()
    assert client.objects == {}
    storage.check(write=False)  # readers write nothing, probe nothing


def test_only_a_step_s_own_manifest_commits_it(tmp_path, caplog) -> None:
    """A nested ``step-N/x/MANIFEST.json`` (a valid key, but not a manifest) does not make step N look
    committed: neither loading nor retention treats it as a (corrupt) checkpoint."""
    storage = LocalStorage(str(tmp_path / "job"))
    write_bytes(storage, "step-0000000050/notes/MANIFEST.json", b"{}")
    mgr = CheckpointManager(storage, keep_last_k=1)
    with caplog.at_level(logging.WARNING, logger="trainflow.checkpoint"):
        for step in (10, 20):
            assert mgr.save(step, _state(step), blocking=True) == "committed"
        assert mgr.committed_steps() == [20]  # before: [50, 20]
        assert mgr.load_latest().step == 20
    assert not caplog.records, [r.getMessage() for r in caplog.records]
