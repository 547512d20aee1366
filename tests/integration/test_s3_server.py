"""The s3_server fixture serves real S3: put/get, multipart, listing, and survives stop/start."""

from __future__ import annotations

import hashlib
import os

import botocore.exceptions
import pytest

from tests.support.s3 import S3Server

pytestmark = pytest.mark.s3

MiB = 1024 * 1024


def test_put_get_roundtrip(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    body = os.urandom(3 * 1024)
    s3.put_object(Bucket=s3_bucket, Key="a/b.bin", Body=body, Metadata={"step": "7"})
    got = s3.get_object(Bucket=s3_bucket, Key="a/b.bin")
    assert got["Body"].read() == body
    assert got["Metadata"] == {"step": "7"}
    assert got["ContentLength"] == len(body)
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        s3.get_object(Bucket=s3_bucket, Key="a/none")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"


def test_multipart_upload_assembles_parts_in_order(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(123)]  # S3 minimum part: 5 MiB
    upload = s3.create_multipart_upload(Bucket=s3_bucket, Key="ckpt/model.pt")
    etags = [
        s3.upload_part(
            Bucket=s3_bucket, Key="ckpt/model.pt", UploadId=upload["UploadId"], PartNumber=i, Body=p
        )["ETag"]
        for i, p in enumerate(parts, start=1)
    ]
    # Before completion the object does not exist, but the upload is listed.
    listed = s3.list_multipart_uploads(Bucket=s3_bucket)["Uploads"]
    assert [u["UploadId"] for u in listed] == [upload["UploadId"]]
    assert s3.list_objects_v2(Bucket=s3_bucket)["KeyCount"] == 0
    s3.complete_multipart_upload(
        Bucket=s3_bucket,
        Key="ckpt/model.pt",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": i} for i, e in enumerate(etags, start=1)]},
    )
    got = s3.get_object(Bucket=s3_bucket, Key="ckpt/model.pt")["Body"].read()
    assert hashlib.sha256(got).digest() == hashlib.sha256(b"".join(parts)).digest()
    assert "Uploads" not in s3.list_multipart_uploads(Bucket=s3_bucket)


def test_list_with_prefix_delimiter_and_pages(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client()
    keys = [f"run/step-{i:04d}/.marker" for i in range(7)] + ["run/latest", "other/x"]
    for key in keys:
        s3.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
    top = s3.list_objects_v2(Bucket=s3_bucket, Prefix="run/", Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == [f"run/step-{i:04d}/" for i in range(7)]
    assert [o["Key"] for o in top["Contents"]] == ["run/latest"]
    pages = list(
        s3.get_paginator("list_objects_v2").paginate(
            Bucket=s3_bucket, Prefix="run/step", PaginationConfig={"PageSize": 3}
        )
    )
    assert [len(p["Contents"]) for p in pages] == [3, 3, 1]


def test_killed_server_comes_back_with_same_endpoint_and_data(s3_server: S3Server, s3_bucket: str) -> None:
    s3 = s3_server.client(retries={"max_attempts": 1}, connect_timeout=1)
    s3.put_object(Bucket=s3_bucket, Key="kept", Body=b"before")
    endpoint, old_pid = s3_server.endpoint_url, s3_server.pid
    s3_server.stop(kill=True)
    assert not s3_server.alive()
    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        s3.get_object(Bucket=s3_bucket, Key="kept")
    s3_server.start()
    assert s3_server.endpoint_url == endpoint
    assert s3_server.pid != old_pid
    assert s3.get_object(Bucket=s3_bucket, Key="kept")["Body"].read() == b"before"
