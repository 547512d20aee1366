"""trainflow.common.listing: the listing fingerprint of a folder (real files; S3 in tests/airflow_bridge)."""

from __future__ import annotations

import os

import pytest

from trainflow.common.listing import (
    ListingEntry,
    is_data_key,
    list_folder,
    listing_change,
    listing_fingerprint,
    split_s3_uri,
)


def test_fingerprint_is_order_free_and_content_sensitive() -> None:
    a, b = ListingEntry("0/a.png", 3, "x"), ListingEntry("1/b.png", 4, "y")
    assert listing_fingerprint([a, b]) == listing_fingerprint([b, a])
    assert listing_fingerprint([a, b]) != listing_fingerprint([a, b._replace(tag="z")])
    assert listing_fingerprint([a]) != listing_fingerprint([a, b]) and len(listing_fingerprint([])) == 64
    change = listing_change([a, b], [a._replace(size_bytes=5), ListingEntry("2/c.png", 1, "w")])
    assert (change.added, change.removed, change.changed) == (("2/c.png",), ("1/b.png",), ("0/a.png",))
    assert change.summary() == {"added": 1, "removed": 1, "changed": 1} and not change.empty


def test_folder_rewrite_with_same_bytes_keeps_the_fingerprint(tmp_path) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "1.png").write_bytes(b"meow")
    (tmp_path / "cat" / ".upload.tmp").write_bytes(b"partial")  # hidden: not data
    memo: dict = {}
    first = list_folder(tmp_path, memo)
    assert first == [ListingEntry("cat/1.png", 4, "4a4be40c96ac6314e91d93f38043a634")]  # md5(b"meow")
    os.utime(tmp_path / "cat" / "1.png", ns=(1, 1))
    (tmp_path / "cat" / "1.png").write_bytes(b"meow")  # re-written, new mtime, same bytes
    assert listing_fingerprint(list_folder(tmp_path, memo)) == listing_fingerprint(first)
    (tmp_path / "cat" / "2.png").write_bytes(b"purr")
    assert listing_fingerprint(list_folder(f"file://{tmp_path}", memo)) != listing_fingerprint(first)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_folder(tmp_path / "missing")


def test_keys_and_uris() -> None:
    assert split_s3_uri("s3://b/a/b/") == ("b", "a/b/") and split_s3_uri("s3://b") == ("b", "")
    assert not is_data_key("x/.trainflow-write-probe-1") and not is_data_key("x/") and is_data_key("x/.d/y")
    with pytest.raises(ValueError, match="names no bucket"):
        split_s3_uri("s3:///x")
