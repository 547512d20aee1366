"""Ranks per worker pod against its GPUs (review 2026-11-30): each rank drives ``cuda:<local rank %
device count>`` (components/training/distributed.py), so with GPUs the only working
``nproc_per_node`` is the pod's GPU count — more ranks share a GPU (NCCL: "Duplicate GPU detected",
and torchrun retries until its restarts are spent), fewer leave GPUs idle. Like torchrun's
``--nproc-per-node gpu``, the default follows the GPUs; a different explicit value is refused before
anything is created."""

from __future__ import annotations

import json

import pytest

from components.launcher.pytorchjob import PyTorchJobSpec
from components.training.step import TrainStepError, worker_job_spec
from trainflow.common.training_spec import ROWS, TrainJobSpec


def _job(**rows: object) -> PyTorchJobSpec:
    spec = TrainJobSpec.build(backend="pytorchjob", checkpoint_uri="s3://ckpt/run-1", kfp_run_id="run-1",
                              kfp_task_name="train", **rows)
    cfg = spec.train_config(dataset="s3://data/ds", job_key="run-1/train", checkpoint_uri="s3://ckpt/run-1")
    return worker_job_spec(spec, cfg, namespace="team-a", image="img")


def test_the_default_nproc_per_node_follows_the_gpus_of_a_worker() -> None:
    """The KFP component passes every parameter, so "not set" is the row's default (2)."""
    from components.launcher.pytorchjob import render_pytorchjob

    assert ROWS["nproc_per_node"].default == 2
    assert _job(gpus_per_worker=4).nproc_per_node == 4
    assert _job(gpus_per_worker=1).nproc_per_node == 1  # 2 ranks on cuda:0 failed every rendezvous round
    assert _job(gpus_per_worker=8).nproc_per_node == 8  # 6 GPUs idled
    assert render_pytorchjob(_job(gpus_per_worker=4))["spec"]["nprocPerNode"] == "4"
    assert _job(gpus_per_worker=4, nproc_per_node=4).nproc_per_node == 4
    assert _job().nproc_per_node == 2 and _job(nproc_per_node=3).nproc_per_node == 3  # CPU: as asked


def test_gpus_asked_as_a_resource_limit_count_too() -> None:
    settings = json.dumps({"resources": {"limits": {"nvidia.com/gpu": "4"}}})
    assert _job(worker_pod_settings=settings).nproc_per_node == 4


@pytest.mark.parametrize(("gpus", "nproc", "why"), [
    (1, 3, "3 ranks would share 1 GPU (NCCL refuses two ranks on one GPU)"),
    (8, 4, "4 ranks would leave 4 of the 8 GPUs idle"),
])
def test_an_explicit_nproc_per_node_other_than_the_gpus_is_one_line(gpus: int, nproc: int, why: str) -> None:
    with pytest.raises(TrainStepError) as refused:
        _job(gpus_per_worker=gpus, nproc_per_node=nproc)
    assert str(refused.value) == (
        f"nproc_per_node {nproc} does not match gpus_per_worker {gpus}: each rank drives one GPU, so {why}; "
        f"set nproc_per_node to {gpus}, or leave it at its default (2), which follows gpus_per_worker")


def test_the_local_backend_follows_the_gpus_torch_sees_too() -> None:
    """Review 2026-11-30: the local backend passed nproc_per_node as given, so the default 2 put both
    ranks on cuda:0 of a one-GPU laptop (NCCL refuses; the step failed after its retries)."""
    from components.training.step import local_ranks

    assert local_ranks(2, 0) == 2 and local_ranks(3, 0) == 3  # CPU: as asked
    assert local_ranks(2, 1) == 1 and local_ranks(2, 4) == 4  # the default follows the GPUs
    assert local_ranks(1, 4) == 1 and local_ranks(4, 4) == 4  # fewer ranks than GPUs: allowed locally
    with pytest.raises(TrainStepError) as refused:
        local_ranks(3, 1)
    assert str(refused.value) == (
        "nproc_per_node 3 exceeds the 1 GPU torch sees on this machine: each rank drives one GPU and NCCL "
        "refuses two ranks on one; set nproc_per_node to at most 1, or leave it at its default (2), which "
        "follows the GPUs")


def test_the_local_backend_starts_its_agent_with_one_rank_per_gpu(monkeypatch, tmp_path) -> None:
    import torch

    from components.training import launch, step

    seen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(launch, "run_agent", lambda agent, *_, **__: seen.append(agent.nproc_per_node) or 0)
    spec = TrainJobSpec.build(backend="local", checkpoint_uri=str(tmp_path / "ckpt"))
    cfg = spec.train_config(dataset=str(tmp_path / "ds"), job_key="k", checkpoint_uri=str(tmp_path / "ckpt"))
    step._run_local(spec, cfg, tmp_path)
    assert seen == [1]


def test_the_local_backend_refuses_more_than_one_worker_as_its_minimum(tmp_path) -> None:
    """Review 2026-11-30: one agent never makes a rendezvous of 2; the KFP step waited minutes, then
    failed on a rendezvous timeout. ``trainflow run`` refused it already; the step now does too."""
    from components.training.step import run_train_step

    spec = TrainJobSpec.build(backend="local", checkpoint_uri=str(tmp_path / "ckpt"), job_key="k", min_workers=2,
                              max_workers=2, dataset_path=str(tmp_path / "ds"))
    with pytest.raises(TrainStepError) as refused:
        run_train_step(spec, model_dir=tmp_path / "model", work_dir=tmp_path / "work")
    assert str(refused.value) == ("min_workers 2 needs 2 agents, and the local backend starts one (its ranks: "
                                  "nproc_per_node); use min_workers 1, or the pytorchjob backend")
