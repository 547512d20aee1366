"""What the cluster backend's workers read and write, on a real S3 server (MinIO on 127.0.0.1).

Worker pods share nothing with the train step but the object store: the dataset (the prepared
artifact's own URI, or a copy published next to the checkpoints), the metrics records the summary is
built from, and the exported model. Here real torchrun workers on this machine do exactly what the
pods do (``--dataset s3://... --metrics-path s3://... --model-output s3://...``); that pods reach
the store over the network is shown on the real node (tests marked ``realnode``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.training import data as d
from components.training.faults import fired_faults
from components.training.metrics import read_jsonl
from components.training.step import (
    TrainStepError,
    check_storage,
    copy_model,
    worker_dataset,
)
from components.training.summary import summarize
from trainflow.common.training_spec import TrainJobSpec
from trainflow.storage import join_uri, storage_for

pytestmark = pytest.mark.s3


@pytest.fixture
def s3_env(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)


def test_worker_dataset_reads_a_readable_artifact_in_place_else_publishes_a_copy(
    s3_server, s3_env, digits_dataset: Path
) -> None:
    bucket = s3_server.make_bucket("pipeline-root")
    artifact = f"s3://{bucket}/v2/artifacts/run-1/prepare-dataset/dataset"
    d.publish(digits_dataset, artifact)  # what KFP's launcher uploads after prepare_dataset
    job_root = f"s3://{bucket}/ckpt/run-1/train"

    # KFP on MinIO names artifacts minio://: the workers read them where they are.
    minio_uri = "minio://" + artifact.removeprefix("s3://")
    req = TrainJobSpec.build(dataset_path=str(digits_dataset), dataset_uri=minio_uri)
    assert worker_dataset(req, job_root) == artifact
    assert storage_for(job_root).list("dataset/") == []

    # A pipeline root the workers' credentials cannot read (another store, no such bucket), or a
    # local one (kfp.local): a copy next to the checkpoints.
    for uri in (f"s3://no-such-bucket-{bucket}/v2/artifacts/x/dataset", str(digits_dataset)):
        req = TrainJobSpec.build(dataset_path=str(digits_dataset), dataset_uri=uri)
        assert worker_dataset(req, job_root) == join_uri(job_root, "dataset")
    staged = storage_for(join_uri(job_root, "dataset")).list("")
    assert staged == ["dataset.json", "test.npz", "train.npz"]
    info = d.read_info(join_uri(job_root, "dataset"))
    assert info.fingerprint == d.DatasetInfo.read(digits_dataset).fingerprint


def test_storage_problems_are_one_line_naming_the_cause(s3_server, s3_env, monkeypatch) -> None:
    with pytest.raises(TrainStepError, match="checkpoint storage: S3 bucket 'no-such-bucket-x1' does not exist"):
        check_storage("s3://no-such-bucket-x1/ckpt", "run/train")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    bucket = s3_server.make_bucket("ckpt")
    with pytest.raises(TrainStepError) as err:
        check_storage(f"s3://{bucket}/ckpt", "run/train", s3_secret_name="trainflow-s3-credentials")
    message = str(err.value)
    assert "\n" not in message
    assert "does Secret 'trainflow-s3-credentials' exist in its namespace" in message


@pytest.mark.slow
def test_workers_read_the_dataset_and_write_metrics_and_model_only_to_s3(
    s3_server, s3_env, digits_dataset: Path, make_job, tmp_path: Path, monkeypatch
) -> None:
    """Two ranks under torchrun, given only URIs, as a PyTorchJob's pods are; the summary and the
    model come back from the store."""
    bucket = s3_server.make_bucket("ckpt")
    job_root = f"s3://{bucket}/ckpt/run-2"
    dataset = d.publish(digits_dataset, join_uri(job_root, "dataset"))
    monkeypatch.setenv("TRAINFLOW_DATASET_CACHE", str(tmp_path / "pod-cache"))
    job = make_job(digits_dataset, "run-2", ckpt_root=f"s3://{bucket}/ckpt")
    args = list(job.args)
    for flag, value in (("--dataset", join_uri(job_root, "dataset")), ("--metrics-path", join_uri(job_root, "metrics")),
                        ("--model-output", join_uri(job_root, "final-model"))):
        args[args.index(flag) + 1] = value
    job.args = [*args, "--epochs", "1", "--global-batch-size", "64", "--checkpoint-interval-steps", "10"]
    agent = job.agent()
    assert agent.wait(600) == 0, (job.root / "agent.log").read_text()[-3000:]

    assert not (job.root / "metrics.jsonl").exists() and not (job.root / "model").exists()
    cached = list((tmp_path / "pod-cache").iterdir())
    assert len(cached) == 1 and cached[0].name.endswith(dataset.fingerprint[:16])  # one copy for both ranks
    records = read_jsonl(join_uri(job_root, "metrics"))
    summary = summarize(records, fired_faults(storage_for(job_root)))
    assert summary.steps == summary.total_steps == 23 and summary.checkpoints_committed >= 2
    assert summary.world_sizes == [2]
    copy_model(join_uri(job_root, "final-model"), tmp_path / "model")
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["dataset_fingerprint"] == dataset.fingerprint and meta["steps"] == 23
