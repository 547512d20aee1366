"""A SIGTERM save must not wait for a retention verification that is reading a big older checkpoint.

Known defect: ``_hurry`` was checked between verifications, not within one, and the verification read
on the persist thread, so the SIGTERM save (queued on that same single thread) waited until the read
ended and missed its deadline. Now the verification reads on a thread of its own and is abandoned
(within one 1 MiB chunk where the storage reads in chunks) — and an abandoned verification decides
nothing: no checkpoint is deleted on its account.

Real stores, slowed down for one step, stand for the two ways a backend reads: ``slow_chunks`` (a
local file read chunk by chunk) and ``slow_open`` (a store whose ``open_read`` reads the whole object
before it yields the file and cannot be stopped meanwhile, as S3's download could not before it took
``abandon``; also on the MinIO the tests start, marker s3). That S3's download now stops mid-way is
tested on MinIO in test_checkpoint_s3_hardening.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest
import torch

from components.training.checkpoint import layout
from components.training.checkpoint.manager import CheckpointManager
from trainflow.storage.local import LocalStorage
from trainflow.storage.s3 import S3Settings, S3Storage

#: Elements of the big tensor: 4 MiB of float32, i.e. 4 chunks of a verification's reads (+ pickle).
BIG_NUMEL = 1 << 20
#: Seconds one slow read takes: per chunk (``slow_chunks``, ~5 chunks) or per download (``slow_open``).
CHUNK_S = 1.0
DOWNLOAD_S = 5.0
#: The SIGTERM save's deadline: a local commit of 4 MiB fits many times over; the rest of a
#: verification under way (>= 3 chunks / the whole download) does not.
SIGTERM_DEADLINE_S = 2.0


def _state(value: int) -> dict:
    return {"model": {"w": torch.full((BIG_NUMEL,), float(value))}, "train_state": {"step": value}}


class _SlowFile:
    """A file whose ``read`` sleeps ``delay_s`` first; records the bytes read and whether EOF came."""

    def __init__(self, f, delay_s: float, record: dict) -> None:
        self._f = f
        self._delay_s = delay_s
        self._record = record

    def read(self, n: int = -1) -> bytes:
        time.sleep(self._delay_s)
        data = self._f.read(n)
        self._record["bytes"] += len(data)
        self._record["eof"] = self._record["eof"] or not data
        return data

    def __getattr__(self, name):
        return getattr(self._f, name)


class _SlowStep:
    """Mixed into a real store: its reads of one step's state file are slow while ``slow`` is set; it
    records every read of that file (``reads``) and every deleted key (``deleted``)."""

    def __init__(self, *args, step: int, mode: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.slow_prefix = layout.step_prefix(step) + "/"
        self.mode = mode
        self.slow = False
        self.reading = threading.Event()
        self.reads: list[dict] = []
        self.deleted: list[str] = []

    def _is_slow(self, key: str) -> bool:
        return self.slow and key.startswith(self.slow_prefix) and layout.is_state_name(key.rsplit("/", 1)[-1])

    @contextlib.contextmanager
    def open_read(self, key, *, abandon=None):
        if not self._is_slow(key):
            with super().open_read(key, abandon=abandon) as f:
                yield f
            return
        record = {"bytes": 0, "eof": False}
        self.reads.append(record)
        self.reading.set()
        if self.mode == "slow_open":
            time.sleep(DOWNLOAD_S)  # a whole-object download that cannot be stopped (S3's before abandon)
        with super().open_read(key, abandon=abandon) as f:
            yield _SlowFile(f, CHUNK_S if self.mode == "slow_chunks" else 0.0, record)

    def delete(self, keys):
        keys = list(keys)
        self.deleted.extend(keys)
        super().delete(keys)


class _SlowLocal(_SlowStep, LocalStorage):
    pass


class _SlowS3(_SlowStep, S3Storage):
    pass


def _slow_storage(request, tmp_path, backend: str, mode: str) -> _SlowStep:
    if backend == "local":
        return _SlowLocal(str(tmp_path / "job"), step=30, mode=mode)
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    settings = S3Settings(endpoint_url=server.endpoint_url, access_key=server.access_key,
                          secret_key=server.secret_key)
    return _SlowS3(f"s3://{bucket}/ckpt/job", settings, step=30, mode=mode)


@pytest.mark.parametrize(("backend", "mode"), [
    ("local", "slow_chunks"),
    ("local", "slow_open"),
    pytest.param("s3", "slow_open", marks=pytest.mark.s3),
])
def test_a_sigterm_save_abandons_a_verification_under_way(request, tmp_path, caplog, backend, mode) -> None:
    """Retention of the periodic save of step 40 is verifying the big step 30 (slowly) when SIGTERM
    comes: the save of step 41 commits within its 2 s deadline (before: it waited for the read and
    returned "failed"), the verification is abandoned without deleting anything, and the next
    retention verifies 30 again before it deletes what keep_last_k=3 lets go."""
    storage = _slow_storage(request, tmp_path, backend, mode)
    first = CheckpointManager(storage, keep_last_k=3)
    for step in (10, 20, 30):
        assert first.save(step, _state(step), blocking=True) == "committed"
    first.close()
    restarted = CheckpointManager(storage, keep_last_k=3)  # a restarted writer: no step is known good yet
    restarted.claim()
    storage.slow = True
    assert restarted.save(40, _state(40)) == "staged"  # its retention will verify 30, then 20
    assert storage.reading.wait(30)  # ... and is now reading step 30
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="trainflow.checkpoint"):
        outcome = restarted.save(41, _state(41), blocking=True, deadline_s=SIGTERM_DEADLINE_S)
    took_s = time.monotonic() - t0
    assert outcome == "committed", f"the SIGTERM save waited {took_s:.1f} s for the verification of step 30"
    assert took_s < SIGTERM_DEADLINE_S
    if mode == "slow_open":  # the abandoned download goes on: a preempted worker must not wait for it at exit
        assert restarted.verifying()
    assert storage.deleted == []  # the abandoned round deleted nothing (41's must verify 30 first)
    assert restarted.committed_steps() == [41, 40, 30, 20, 10]
    assert any(r.getMessage().startswith("checkpoint retention stopped early: a blocking save is waiting; "
                                         "verifying step 30 abandoned, nothing deleted") for r in caplog.records)
    storage.slow = False
    assert restarted.wait(timeout_s=60)
    if mode == "slow_chunks":  # the abandoned read stopped at its next chunk instead of reading on
        assert not storage.reads[0]["eof"] and storage.reads[0]["bytes"] < 4 * (1 << 20)
    assert restarted.committed_steps() == [41, 40, 30]  # 30 verified again; 20 and 10 deleted after that
    assert restarted.has_good(30) and not restarted.verifying()
    restarted.close()
