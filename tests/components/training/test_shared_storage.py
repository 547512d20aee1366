"""What worker pods read and write on shared storage: dataset locations, metrics segments.

Local storage (a folder named by ``file://``) here; the same code against a real S3 server (MinIO)
in the ``s3`` tests at the end.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from components.training import data as d
from components.training.metrics import JsonlSink, read_jsonl, read_segments
from components.training.sources import is_builtin, prepare


def test_builtin_sources_are_prepared_on_the_spot_once_per_cache(tmp_path: Path) -> None:
    """A worker given ``--dataset digits`` (no prepared folder) gets what prepare_dataset would
    write with its defaults; ranks racing for the cache end up with one folder."""
    reference = prepare("digits", tmp_path / "ref")
    folders: list[Path] = []
    threads = [threading.Thread(target=lambda: folders.append(d.local_folder("digits", cache_dir=tmp_path / "c")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(folders)) == 1
    assert d.DatasetInfo.read(folders[0]).fingerprint == reference.fingerprint
    assert [p.name for p in (tmp_path / "c").iterdir()] == [folders[0].name]  # no partial folders left
    assert d.read_info("digits").fingerprint == reference.fingerprint
    assert is_builtin("synthetic-cifar:64") and not is_builtin("/data/mnist") and not is_builtin("s3://b/mnist")


def test_a_local_folder_wins_over_a_builtin_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepare("digits", tmp_path / "mnist", test_fraction=0.5)
    monkeypatch.chdir(tmp_path)
    assert d.local_folder("mnist") == Path("mnist")
    assert d.read_info("mnist").splits["test"] > 800


def test_publish_writes_the_info_last_and_only_once(tmp_path: Path) -> None:
    prepare("digits", tmp_path / "prepared")
    target = tmp_path / "store" / "job" / "dataset"
    info = d.publish(tmp_path / "prepared", str(target))
    assert sorted(p.name for p in target.iterdir()) == ["dataset.json", "test.npz", "train.npz"]
    assert d.read_info(str(target)).fingerprint == info.fingerprint
    stamp = (target / "train.npz").stat().st_mtime_ns
    d.publish(tmp_path / "prepared", str(target))  # a retry: same fingerprint, nothing copied
    assert (target / "train.npz").stat().st_mtime_ns == stamp


def test_image_folder_datasets_on_a_local_folder_cannot_be_published(tmp_path: Path) -> None:
    from PIL import Image

    for cls in ("cat", "dog"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / "images" / cls / f"{i}.png")
    prepare(str(tmp_path / "images"), tmp_path / "prepared", test_fraction=0.34, image_size=8)
    with pytest.raises(d.DatasetError, match=r"local folder .*images, which other machines cannot read"):
        d.publish(tmp_path / "prepared", str(tmp_path / "store"))


@pytest.mark.parametrize("location", ["gs://bucket/ds", "https://example.com/ds"])
def test_unsupported_locations_are_one_line(location: str) -> None:
    with pytest.raises(d.DatasetError, match="unsupported dataset location") as err:
        d.local_folder(location)
    assert "\n" not in str(err.value)
    assert d.storage_uri("minio://mlpipeline/v2/artifacts/x") == "s3://mlpipeline/v2/artifacts/x"


def test_metrics_segments_keep_write_order_across_writers_and_rollover(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/job/metrics"
    first = JsonlSink(uri, flush_interval_s=60)
    first._segments.SEGMENT_BYTES = 200  # type: ignore[union-attr]  # roll over every few records
    for step in range(1, 11):
        first.record({"step": step, "loss": 1.0 / step})
        first._segments.flush()  # type: ignore[union-attr]  # as the interval would
    first.close()
    second = JsonlSink(uri, flush_interval_s=60)  # a restarted worker group
    second.record({"event": "resume", "resumed_from_step": 8})
    second.record({"step": 9, "loss": 0.5})
    second.close()
    records = read_jsonl(uri)
    assert [r.get("step") for r in records] == [*range(1, 11), None, 9]
    keys = [k for k, _ in read_segments(uri)]
    assert len({k.split("/")[0] for k in keys}) == 2 and len(keys) > 3  # two writers, several segments
    assert read_jsonl(f"file://{tmp_path}/nothing-here") == []


#: How long the sink's background thread may take to write what is due (a loaded machine).
SEGMENT_WRITE_DEADLINE_S = 30.0


def _written(uri: str, want: list, field: str) -> list:
    """Poll the segments until their records' ``field`` values are ``want`` (or the deadline); return the last read."""
    deadline = time.monotonic() + SEGMENT_WRITE_DEADLINE_S
    while (got := [r.get(field) for r in read_jsonl(uri)]) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_urgent_events_are_written_at_once_and_the_rest_within_the_interval(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/metrics"
    sink = JsonlSink(uri, flush_interval_s=0.3)
    sink.record({"event": "start", "world_size": 2})
    assert _written(uri, ["start"], "event") == ["start"]
    sink.record({"step": 1, "loss": 2.0})
    assert _written(uri, [None, 1], "step") == [None, 1]  # not closed: the interval wrote it
    sink.close()


def test_a_failing_store_never_reaches_the_training_loop(tmp_path: Path) -> None:
    from trainflow.storage import CheckpointStorageError

    sink = JsonlSink(f"file://{tmp_path}/m", flush_interval_s=60)
    segments = sink._segments
    assert segments is not None
    broken = True
    real_open = segments.storage.open_write

    def open_write(key: str, **kw: object):
        if broken:
            raise CheckpointStorageError("store down")
        return real_open(key, **kw)

    segments.storage.open_write = open_write  # type: ignore[method-assign]
    sink.record({"event": "start"})
    segments.flush()  # fails quietly, keeps the line
    broken = False
    sink.record({"step": 1, "loss": 1.0})
    sink.close()
    assert [r.get("event", r.get("step")) for r in read_jsonl(f"file://{tmp_path}/m")] == ["start", 1]
    assert json.loads((tmp_path / "m").rglob("*.jsonl").__next__().read_text().splitlines()[0])["event"] == "start"


def test_sample_logs_of_several_ranks_go_to_one_storage_uri_or_one_file_each(tmp_path: Path) -> None:
    """``sample_log_dir`` of workers in pods is a storage URI: each process writes its own segments
    there (flushed on close), and reading the URI gives every rank's records."""
    from components.training.trainer import sample_log

    uri = f"file://{tmp_path}/job/samples"
    logs = [sample_log(uri) for _ in range(2)]
    for rank, log in enumerate(logs):
        log.record({"step": 1, "rank": rank, "ids": [rank, rank + 2]})
    for log in logs:
        log.close()
    records = read_jsonl(uri)
    assert sorted((r["rank"], r["ids"]) for r in records) == [(0, [0, 2]), (1, [1, 3])]
    assert len({key.split("/")[0] for key, _ in read_segments(uri)}) == 2  # one writer per process
    local = sample_log(str(tmp_path / "local"))
    local.record({"step": 1, "rank": 0, "ids": [5]})
    local.close()
    (written,) = (tmp_path / "local").glob("samples-*.jsonl")
    assert [r["ids"] for r in read_jsonl(written)] == [[5]]
