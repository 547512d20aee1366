"""Dataset sources' failures are one-line DatasetErrors (review 2026-11-30): a listing page that fails
after the bucket check passed (503 SlowDown, a dropped connection, a deny scoped to a prefix) was a
raw botocore traceback out of ``prepare``."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from components.training.data import DatasetError
from components.training.sources import _S3Reader


class _FailingPages:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def paginate(self, **_: Any) -> Any:
        yield {"Contents": [{"Key": "data/a.png", "Size": 3, "ETag": '"e"'}]}
        raise self.error


@pytest.mark.parametrize(("error", "said"), [
    (ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                  "ResponseMetadata": {"HTTPStatusCode": 503}}, "ListObjectsV2"), "SlowDown"),
    (EndpointConnectionError(endpoint_url="http://minio:9000"), "Could not connect to the endpoint URL"),
])
def test_a_listing_page_that_fails_is_one_line(monkeypatch, error: Exception, said: str) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    reader = _S3Reader("s3://datasets/data")
    monkeypatch.setattr(reader._s3, "check", lambda **_: None)
    monkeypatch.setattr(reader._s3._client, "get_paginator", lambda _name: _FailingPages(error))
    with pytest.raises(DatasetError) as failed:
        reader.list()
    text = str(failed.value)
    assert text.startswith("listing s3://datasets/data") and said in text and "\n" not in text, text
