"""The train step's identity in KFP: run id, task name and task id.

``{{$.pipeline_task_name}}`` is the same in every iteration of a ``dsl.ParallelFor`` loop (and in
every call of a sub-pipeline), so with run id and task name alone the iterations of a sweep shared one
checkpoint job key (an iteration resumed another's checkpoints) and one PyTorchJob (an iteration
reattached to, or replaced, another's). ``{{$.pipeline_task_uuid}}`` (KFP 2.14: the parent DAG
execution's id, one per iteration, the same for every retry of the task) tells them apart; without it
(a pipeline compiled before it was passed, or left unresolved) the identity is what it was."""

from __future__ import annotations

import re

import pytest

from components.launcher.pytorchjob import MAX_NAME_LEN, TASK_ID_ANNOTATION, PyTorchJobSpec, job_name
from components.training import step
from components.training.step import TrainStepError, resolve_job_key, worker_job_spec
from trainflow.common.training_spec import TrainJobSpec

UNRESOLVED = "{{$.pipeline_task_uuid}}"


def test_the_default_job_key_holds_the_task_id_when_kfp_resolved_one() -> None:
    assert resolve_job_key("", "run-1", "train", "101") == "run-1/train/101"
    assert resolve_job_key("", "run-1", "train", "102") == "run-1/train/102"
    # No task id, or one the backend left unresolved: the key is what it was before task ids.
    assert resolve_job_key("", "run-1", "train") == "run-1/train"
    assert resolve_job_key("", "run-1", "train", "") == "run-1/train"
    assert resolve_job_key("", "run-1", "train", UNRESOLVED) == "run-1/train"
    # An explicit key still wins (the Airflow DAG's), and a task id alone is no key.
    assert resolve_job_key("dag/run/train/-1", "run-1", "train", "101") == "dag/run/train/-1"
    with pytest.raises(TrainStepError, match="no job key"):
        resolve_job_key("", "", "train", "101")
    # A backend before 2.5 leaves the run id unresolved: said so, not "run inside a KFP pipeline".
    with pytest.raises(TrainStepError, match=r"did not resolve .* need a KFP backend >= 2\.5"):
        resolve_job_key("", "{{$.pipeline_job_uuid}}", "train", "101")
    # ... also with an explicit key: the job's name would be the same for every run.
    spec = TrainJobSpec.build(backend="pytorchjob", checkpoint_uri="s3://ckpt", job_key="mine",
                              kfp_run_id="{{$.pipeline_job_uuid}}", kfp_task_name="{{$.pipeline_task_name}}")
    cfg = spec.train_config(dataset="s3://data/ds", job_key="mine", checkpoint_uri="s3://ckpt")
    with pytest.raises(TrainStepError, match=r"did not resolve .* need a KFP backend >= 2\.5"):
        worker_job_spec(spec, cfg, namespace="team-a", image="img")


def _worker_job(kfp_task_id: str, **plumbing: str) -> PyTorchJobSpec:
    spec = TrainJobSpec.build(backend="pytorchjob", checkpoint_uri="s3://ckpt", kfp_run_id="run-1",
                              kfp_task_name="train", kfp_task_id=kfp_task_id, **plumbing)
    key = resolve_job_key(spec.job_key, spec.kfp_run_id, spec.kfp_task_name, spec.kfp_task_id)
    cfg = spec.train_config(dataset="s3://data/ds", job_key=key, checkpoint_uri="s3://ckpt")
    return worker_job_spec(spec, cfg, namespace="team-a", image="img")


def test_two_iterations_get_two_jobs_and_a_retry_the_same_one() -> None:
    one, two, again = _worker_job("101"), _worker_job("102"), _worker_job("101")
    assert one.name != two.name and one.name == again.name
    assert (one.job_key, two.job_key) == ("run-1/train/101", "run-1/train/102")
    for job in (one, two):
        assert re.fullmatch(r"train-[0-9a-f]{10}", job.name) and len(job.name) <= MAX_NAME_LEN
    assert (one.task_id, one.name) == ("101", job_name("run-1", "train", "101"))
    from components.launcher.pytorchjob import render_pytorchjob

    assert render_pytorchjob(one)["metadata"]["annotations"][TASK_ID_ANNOTATION] == "101"


@pytest.mark.parametrize("task_id", ["", UNRESOLVED])
def test_without_a_resolved_task_id_the_job_is_the_one_of_before(task_id: str) -> None:
    job = _worker_job(task_id)
    assert (job.task_id, job.name, job.job_key) == ("", job_name("run-1", "train"), "run-1/train")


def test_the_step_keys_its_checkpoints_by_the_task_id(monkeypatch, tmp_path) -> None:
    """``run_train_step`` itself (with the local backend too) resolves the key with the task id."""
    keys = []

    class Resolved(Exception):
        pass

    def stop(*_: object) -> str:
        raise Resolved

    real = step.resolve_job_key
    monkeypatch.setattr(step, "resolve_job_key", lambda *a: keys.append(real(*a)) or keys[-1])
    monkeypatch.setattr(step, "resolve_checkpoint_uri", stop)  # stop before anything starts
    for task_id in ("101", "102", ""):
        spec = TrainJobSpec.build(kfp_run_id="run-1", kfp_task_name="train", kfp_task_id=task_id)
        with pytest.raises(Resolved):
            step.run_train_step(spec, model_dir=tmp_path / "model", work_dir=tmp_path / "work")
    assert keys == ["run-1/train/101", "run-1/train/102", "run-1/train"]


def test_the_task_id_is_plumbing_of_the_spec() -> None:
    spec = TrainJobSpec.build(kfp_run_id="run-1", kfp_task_name="train", kfp_task_id="101")
    assert "kfp_task_id" in TrainJobSpec.PLUMBING and spec.kfp_task_id == "101"
    assert spec.replace(epochs=3).kfp_task_id == "101"
