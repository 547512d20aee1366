"""DatasetChangeTrigger against the test bed's real MinIO: one event per real change, none for
identical re-uploads or listing errors. Drives ``run()`` the way the triggerer does (async for)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_bridge.triggers.dataset import CLASSPATH, DatasetChangeTrigger
from trainflow.common.listing import list_s3, listing_fingerprint

POLL_S = 0.2


class Watch:
    """Runs the trigger's generator in the background and collects its events."""

    def __init__(self, trigger: DatasetChangeTrigger) -> None:
        self.trigger = trigger
        self.events: list[dict] = []
        self.polls = 0
        original = trigger.list

        def counting_list(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                self.polls += 1

        trigger.list = counting_list  # type: ignore[method-assign]
        self.task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        async for event in self.trigger.run():
            self.events.append(event.payload)

    async def polls_pass(self, n: int) -> None:
        """Wait until ``n`` more listings have completed (the state the trigger acts on)."""
        target = self.polls + n
        async with asyncio.timeout(60):
            while self.polls < target:
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def _put(client, bucket: str, key: str, body: bytes) -> None:
    client.put_object(Bucket=bucket, Key=key, Body=body)


@pytest.mark.s3
async def test_added_objects_fire_once_identical_reuploads_never(s3_server, s3_bucket, monkeypatch) -> None:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    client = s3_server.client()
    for i in range(3):
        _put(client, s3_bucket, f"mnist/{i}/img-{i}.png", b"image %d" % i)
    watch = Watch(DatasetChangeTrigger(uri=f"s3://{s3_bucket}/mnist", poll_interval_s=POLL_S))
    try:
        await watch.polls_pass(3)
        assert watch.events == []  # the first listing is the baseline

        for i in range(3, 8):  # an upload spread over several polls
            _put(client, s3_bucket, f"mnist/{i}/img-{i}.png", b"image %d" % i)
            await asyncio.sleep(POLL_S / 2)
        await watch.polls_pass(4)
        assert len(watch.events) == 1, watch.events
        event = watch.events[0]
        assert event["change"] == {"added": 5, "removed": 0, "changed": 0} and event["objects"] == 8
        assert event["listing_fingerprint"] == listing_fingerprint(list_s3(client, f"s3://{s3_bucket}/mnist"))

        for i in range(8):  # the same bytes again: new LastModified, same ETags
            _put(client, s3_bucket, f"mnist/{i}/img-{i}.png", b"image %d" % i)
        _put(client, s3_bucket, "mnist/.trainflow-write-probe-x", b"")  # not data
        await watch.polls_pass(5)
        assert len(watch.events) == 1

        _put(client, s3_bucket, "mnist/0/img-0.png", b"other bytes")  # a real change of content
        await watch.polls_pass(4)
        assert len(watch.events) == 2 and watch.events[1]["change"] == {"added": 0, "removed": 0, "changed": 1}
        assert watch.events[1]["previous_listing_fingerprint"] == event["listing_fingerprint"]
    finally:
        await watch.stop()


@pytest.mark.s3
async def test_baseline_from_the_model_version_and_bad_input(s3_server, s3_bucket, monkeypatch, capsys) -> None:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    client = s3_server.client()
    _put(client, s3_bucket, "data/a/1.png", b"1")
    trained_on = listing_fingerprint(list_s3(client, f"s3://{s3_bucket}/data"))
    _put(client, s3_bucket, "data/a/2.png", b"2")  # arrived since the current version was trained
    watch = Watch(DatasetChangeTrigger(uri=f"s3://{s3_bucket}/data", poll_interval_s=POLL_S,
                                       baseline_fingerprint=trained_on))
    try:
        await watch.polls_pass(3)
        assert len(watch.events) == 1 and watch.events[0]["previous_listing_fingerprint"] == trained_on
        assert watch.events[0]["change"] is None  # the baseline's listing itself is not known
    finally:
        await watch.stop()

    missing = Watch(DatasetChangeTrigger(uri="s3://no-such-bucket-zz/data", poll_interval_s=POLL_S))
    try:
        await missing.polls_pass(2)
        assert missing.events == []
    finally:
        await missing.stop()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    bad = Watch(DatasetChangeTrigger(uri=f"s3://{s3_bucket}/data", poll_interval_s=POLL_S))
    try:
        await bad.polls_pass(2)
        assert bad.events == []
    finally:
        await bad.stop()
    log = capsys.readouterr().out  # the triggerer's structlog lines
    assert f"cannot list s3://{s3_bucket}/data: S3 credentials rejected (SignatureDoesNotMatch)" in log
    assert "cannot list s3://no-such-bucket-zz/data: the bucket does not exist" in log


async def test_folder_and_serialization(tmp_path) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "1.png").write_bytes(b"meow")
    trigger = DatasetChangeTrigger(uri=str(tmp_path), poll_interval_s=POLL_S)
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH and DatasetChangeTrigger(**kwargs).serialize() == (classpath, kwargs)
    watch = Watch(trigger)
    try:
        await watch.polls_pass(2)
        (tmp_path / "cat" / "1.png").write_bytes(b"meow")  # same bytes
        await watch.polls_pass(3)
        assert watch.events == []
        (tmp_path / "dog").mkdir()
        (tmp_path / "dog" / "1.png").write_bytes(b"woof")
        await watch.polls_pass(3)
        assert [e["change"] for e in watch.events] == [{"added": 1, "removed": 0, "changed": 0}]
    finally:
        await watch.stop()
    with pytest.raises(ValueError, match="not 'gs://b/x'"):
        DatasetChangeTrigger(uri="gs://b/x")
    with pytest.raises(ValueError, match="poll_interval_s"):
        DatasetChangeTrigger(uri=str(tmp_path), poll_interval_s=0)
