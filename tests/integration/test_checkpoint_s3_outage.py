"""Checkpoints on a real S3 server (MinIO on 127.0.0.1) that is killed mid-upload and brought back.

Training (2 ranks under torchrun, ResNet-18 so each checkpoint is ~90 MB and its upload takes a
while) must go on while the store is down: saves retry with backoff and log warnings, the periodic
saves that come due meanwhile are skipped rather than blocking, and once the server is back a later
checkpoint commits. Nothing partial is ever visible: every step folder either has a manifest whose
files verify, or holds no manifest at all, and the newest committed checkpoint loads.
"""

from __future__ import annotations

import time

import pytest

from components.training.checkpoint.manager import CheckpointManager
from trainflow.storage.s3 import S3Settings, S3Storage

pytestmark = [pytest.mark.s3, pytest.mark.slow]


def _wait(predicate, what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_training_survives_s3_killed_mid_upload(s3_server, digits_dataset, make_job, monkeypatch) -> None:
    bucket = s3_server.make_bucket()
    for k, v in {
        "AWS_ENDPOINT_URL_S3": s3_server.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
    }.items():
        monkeypatch.setenv(k, v)
    job = make_job(
        digits_dataset,
        "s3job",
        "--model-name",
        "resnet18",
        "--epochs",
        "1",
        "--global-batch-size",
        "32",
        "--checkpoint-interval-steps",
        "4",
        "--checkpoint-interval-s",
        "1e9",
        "--throttle-step-s",
        "0.3",
        ckpt_root=f"s3://{bucket}/ckpt",
    )
    agent = job.agent()
    try:

        def staged_not_committed() -> bool:
            recs = job.records()
            staged = [r["step"] for r in recs if r.get("event") == "checkpoint"]
            done = {
                r["step"] for r in recs if r.get("event") in ("checkpoint_committed", "checkpoint_failed")
            }
            return any(s not in done for s in staged) and len(done) >= 1

        _wait(staged_not_committed, "a checkpoint upload in flight (after a first commit)")
        s3_server.stop(kill=True)  # the S3 server dies mid-upload
        down_at = max(r["step"] for r in job.records() if "loss" in r)
        _wait(
            lambda: max(r["step"] for r in job.records() if "loss" in r) >= down_at + 8, "training to go on"
        )
        s3_server.start()
        _wait(
            lambda: any(
                r.get("event") == "checkpoint_committed" and r["step"] > down_at for r in job.records()
            ),
            "a checkpoint committed after the outage",
        )
        assert agent.wait(600) == 0
    finally:
        if agent.proc.poll() is None:
            agent.kill()
        if not s3_server.alive():
            s3_server.start()

    log = (job.root / "agent.log").read_text()
    assert "persist attempt 1 failed" in log and "retrying" in log  # backoff, logged as warnings
    records = job.records()
    # training went on: the periodic saves due during the outage waited for the failing persist
    # (deferred, never stalling a step) or the persist gave up
    assert any(r.get("event") == "checkpoint_deferred" for r in records) or any(
        r.get("event") == "checkpoint_failed" for r in records
    )

    settings = S3Settings(
        endpoint_url=s3_server.endpoint_url, access_key=s3_server.access_key, secret_key=s3_server.secret_key
    )
    storage = S3Storage(f"s3://{bucket}/ckpt/s3job", settings)
    mgr = CheckpointManager(storage)
    committed = mgr.committed_steps()
    assert committed and committed[0] == max(r["step"] for r in records if "loss" in r)  # the final save
    for step in committed:  # every visible manifest verifies: nothing partial was committed
        assert mgr.load_step(step).step == step
    assert mgr.load_latest().step == committed[0]
