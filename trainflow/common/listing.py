"""The listing fingerprint of a dataset prefix: a cheap content identity without downloads.

A dataset lives under an ``s3://bucket/prefix`` or a folder. Its *listing* is one
:class:`ListingEntry` per object under the root: the key relative to the root, the size in bytes
and a content tag. On S3 the tag is the object's ``ETag`` without quotes — the MD5 of the bytes for
a single-part upload (AWS S3 "Checking object integrity"; MinIO does the same), so re-uploading
identical bytes keeps the tag while ``LastModified`` changes. In a local folder the tag is the MD5
of the file's bytes, the same value S3 gives a single-part upload of that file, memoised by
(path, size, mtime) so a poll re-reads only files whose metadata moved.

Objects whose name (the last path segment) starts with ``.`` are not data and are left out: hidden
temporary files of an upload in progress, and the write-probe objects trainflow's S3 storage puts and
deletes when it checks its credentials (``.trainflow-write-probe-*``).

The fingerprint is SHA-256 over the sorted entries: equal listings give equal fingerprints, and it
never depends on listing order, timestamps or the root's own name. Known limit: a multipart upload's
ETag is ``md5(part md5s)-<parts>``, so re-uploading the same bytes with another part size changes
the tag (one spurious change; the drift check downstream then finds no drift).

Every trainflow part computes fingerprints here: the KFP ``prepare_dataset`` step records one in
the dataset's metadata (then the model registry's lineage), the Airflow prefix watcher compares
successive ones, and the drift check compares the current one with the registered version's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

LISTING_FORMAT = "trainflow-listing/1"


class ListingEntry(NamedTuple):
    key: str
    """Path relative to the dataset root, ``/``-separated."""
    size_bytes: int
    tag: str
    """S3 ETag without quotes, or the MD5 hex digest of a local file."""


@dataclass(frozen=True, slots=True)
class ListingChange:
    """What differs between two listings (keys relative to the root, sorted)."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    """Same key, another size or tag."""

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def summary(self) -> dict[str, int]:
        return {"added": len(self.added), "removed": len(self.removed), "changed": len(self.changed)}


def normalize_etag(etag: str) -> str:
    """``'"9e10..."'`` -> ``'9e10...'`` (S3 returns ETags quoted)."""
    return etag.strip().strip('"')


def listing_fingerprint(entries: Iterable[ListingEntry]) -> str:
    """SHA-256 hex digest (64 chars) of the sorted listing; the empty listing has one too."""
    h = hashlib.sha256(LISTING_FORMAT.encode() + b"\n")
    for e in sorted(entries):
        h.update(f"{e.key}\t{int(e.size_bytes)}\t{e.tag}\n".encode())
    return h.hexdigest()


def listing_change(old: Iterable[ListingEntry], new: Iterable[ListingEntry]) -> ListingChange:
    """Keys added, removed and changed from ``old`` to ``new``."""
    before = {e.key: (e.size_bytes, e.tag) for e in old}
    after = {e.key: (e.size_bytes, e.tag) for e in new}
    return ListingChange(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        changed=tuple(sorted(k for k in before.keys() & after.keys() if before[k] != after[k])),
    )


def total_bytes(entries: Iterable[ListingEntry]) -> int:
    return sum(e.size_bytes for e in entries)


def is_data_key(key: str) -> bool:
    """False for keys that are not dataset content (see the module docstring)."""
    return bool(key) and not key.endswith("/") and not key.rsplit("/", 1)[-1].startswith(".")


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b/")``: the prefix ends with ``/`` unless empty.

    Raises:
        ValueError: not an ``s3://`` URI with a bucket.
    """
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket (s3://BUCKET/PREFIX)")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def list_s3(client: Any, uri: str) -> list[ListingEntry]:
    """The listing of ``s3://bucket/prefix`` through an S3 client (boto3's, or any with the same
    ``get_paginator("list_objects_v2")``): one ListObjectsV2 page per 1,000 keys, no object read.

    Raises whatever the client raises (no such bucket, refused credentials, unreachable endpoint).
    """
    bucket, prefix = split_s3_uri(uri)
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = obj["Key"][len(prefix) :]
            if is_data_key(key):  # not a "folder" placeholder, temp file or write probe
                out.append(ListingEntry(key, int(obj["Size"]), normalize_etag(obj.get("ETag", ""))))
    return sorted(out)


_Memo = dict[tuple[str, int, int], str]


def list_folder(root: str | os.PathLike[str], memo: _Memo | None = None) -> list[ListingEntry]:
    """The listing of a local folder (``file://`` accepted); tags are MD5 digests of the bytes.

    Args:
        memo: (path, size, mtime_ns) -> MD5, kept by a caller that polls (files whose size and
            mtime did not move are not read again).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    base = Path(str(root).removeprefix("file://")).expanduser()
    if not base.is_dir():
        raise FileNotFoundError(f"dataset folder {base} does not exist")
    memo = {} if memo is None else memo
    out = []
    for path in sorted(base.rglob("*")):
        rel = path.relative_to(base).as_posix()
        if not path.is_file() or not is_data_key(rel):
            continue
        st = path.stat()
        cache_key = (str(path), st.st_size, st.st_mtime_ns)
        tag = memo.get(cache_key)
        if tag is None:
            digest = hashlib.md5(usedforsecurity=False)
            with path.open("rb") as fh:
                for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                    digest.update(block)
            tag = memo[cache_key] = digest.hexdigest()
        out.append(ListingEntry(rel, st.st_size, tag))
    return out


def describe_listing(entries: list[ListingEntry], previous: list[ListingEntry] | None = None) -> dict[str, Any]:
    """A small JSON summary: fingerprint, object count, bytes, and the change from ``previous``."""
    out: dict[str, Any] = {"listing_fingerprint": listing_fingerprint(entries), "objects": len(entries),
                           "total_bytes": total_bytes(entries)}
    if previous is not None:
        out["change"] = listing_change(previous, entries).summary()
    return out

