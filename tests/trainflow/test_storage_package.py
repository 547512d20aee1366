"""trainflow.storage as a package: what it exports, which backend a URI gets, and that a local
store never loads boto3 (the S3 backend is imported only for s3:// URIs)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import trainflow.storage as storage
from trainflow.storage import CheckpointStorageError, ObjectExistsError, ObjectWriteConflict
from trainflow.storage.local import LocalStorage


def test_storage_for_picks_the_backend_by_uri(tmp_path) -> None:
    local = storage.storage_for(str(tmp_path / "root"))
    assert isinstance(local, LocalStorage) and isinstance(local, storage.ObjectStore)
    assert isinstance(storage.storage_for(f"file://{tmp_path}/x"), LocalStorage)
    with pytest.raises(storage.CheckpointStorageError, match="no checkpoint storage accepts 'gs://b/p'"):
        storage.storage_for("gs://b/p")


def test_the_old_protocol_name_is_the_same_protocol() -> None:
    assert storage.CheckpointStorage is storage.ObjectStore
    assert issubclass(storage.ObjectExistsError, storage.CheckpointStorageError)
    assert issubclass(storage.ObjectNotFoundError, storage.CheckpointStorageError)
    assert not issubclass(storage.ReadAbandoned, storage.CheckpointStorageError)  # a stopped read is no failure


def test_a_local_read_ignores_abandon(tmp_path) -> None:
    """Local storage opens the file lazily (nothing read ahead to stop): the caller, reading in
    chunks, checks its event itself."""
    store = storage.storage_for(str(tmp_path))
    storage.write_bytes(store, "a.bin", b"abc")
    abandon = threading.Event()
    abandon.set()
    with store.open_read("a.bin", abandon=abandon) as f:
        assert f.read() == b"abc"


def test_bytes_round_trip_through_the_package_helpers(tmp_path) -> None:
    store = storage.storage_for(str(tmp_path))
    storage.write_bytes(store, "a/b.bin", b"\x00\x01")
    assert storage.read_bytes(store, "a/b.bin") == b"\x00\x01"
    with pytest.raises(storage.ObjectExistsError):
        storage.write_bytes(store, "a/b.bin", b"x", create_only=True)
    assert storage.join_uri("s3://b/p/", "/x/", "", "y") == "s3://b/p/x/y"


def test_a_local_store_does_not_import_boto3(tmp_path) -> None:
    code = ("import sys, trainflow.storage as s; s.storage_for(sys.argv[1]).check(); "
            "print(sorted(m for m in ('boto3', 'botocore', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("status", "code", "error"), [
    (412, "PreconditionFailed", ObjectExistsError),
    (409, "ConditionalRequestConflict", ObjectWriteConflict),  # a write under way: retry, it may never exist
    (503, "SlowDown", CheckpointStorageError),
])
def test_a_create_only_put_tells_an_existing_object_from_a_conflict(status: int, code: str, error: type) -> None:
    from botocore.exceptions import ClientError

    from trainflow.storage.s3 import S3Storage

    class Refusing:
        def put_object(self, **kwargs):
            raise ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                              "PutObject")

    store = S3Storage("s3://bucket/prefix")
    store._client = Refusing()
    with pytest.raises(error) as raised, store.open_write("writers/g1.json", create_only=True) as f:
        f.write(b"{}")
    assert raised.type is error  # ObjectExistsError is a CheckpointStorageError too: the exact class counts
