"""Both pipelines pass ``train`` the KFP task id, so a sweep — a pipeline running them inside a
``dsl.ParallelFor`` — trains each iteration under its own job key and PyTorchJob.

KFP 2.14's driver resolves ``{{$.pipeline_task_name}}`` to the task's name, the same in every
iteration of a loop, and ``{{$.pipeline_task_uuid}}`` to the id of the task's parent DAG execution,
which each iteration creates anew (``backend/src/v2/driver/resolve.go``); see
tests/components/training/test_task_identity.py for what the step makes of it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml
from kfp import dsl

from pipelines.platform import PlatformSettings

TASK_ID = {"runtimeValue": {"constant": dsl.PIPELINE_TASK_ID_PLACEHOLDER}}
TASK_NAME = {"runtimeValue": {"constant": dsl.PIPELINE_TASK_NAME_PLACEHOLDER}}


def _compiled(func, tmp_path) -> dict:
    from kfp import compiler

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(func, str(out))
    return next(iter(yaml.safe_load_all(out.read_text())))


def _train_tasks(spec: dict) -> dict[tuple[str, ...], dict]:
    """Every ``train`` task, by its path of DAG task names from the root, and whether a loop is above it."""
    found: dict[tuple[str, ...], dict] = {}

    def walk(dag: dict, path: tuple[str, ...], looped: bool) -> None:
        for name, task in dag.get("tasks", {}).items():
            if re.fullmatch(r"comp-train(-\d+)?", task["componentRef"]["name"]):  # -<n>: a second copy
                found[(*path, name)] = {**task, "looped": looped}
            sub = spec["components"][task["componentRef"]["name"]].get("dag")
            if sub:
                walk(sub, (*path, name), looped or "parameterIterator" in task)

    walk(spec["root"]["dag"], (), False)
    return found


def test_both_pipelines_pass_train_the_task_id(tmp_path) -> None:
    from pipelines.retraining import build_retraining_pipeline
    from pipelines.training import build_pipeline

    for build in (build_pipeline, build_retraining_pipeline):
        (task,) = _train_tasks(_compiled(build(PlatformSettings()), tmp_path)).values()
        params = task["inputs"]["parameters"]
        assert params["kfp_task_id"] == TASK_ID, build.__module__
        assert params["kfp_task_name"] == TASK_NAME, build.__module__


def test_inside_a_parallel_for_every_iterations_train_task_gets_the_task_id(tmp_path) -> None:
    """A hyperparameter sweep: both trainflow pipelines as sub-pipelines of one ``dsl.ParallelFor``.
    Their ``train`` tasks are named ``train`` in every iteration; the task-id placeholder, which the
    driver resolves per iteration, reaches them as it is."""
    from pipelines.retraining import build_retraining_pipeline
    from pipelines.training import build_pipeline

    platform = PlatformSettings()
    training, retraining = build_pipeline(platform), build_retraining_pipeline(platform)

    @dsl.pipeline(name="sweep")
    def sweep():  # no parameters: this module's annotations are strings, which KFP would misread
        with dsl.ParallelFor(items=[0.01, 0.05, 0.1]) as learning_rate:
            training(learning_rate=learning_rate)
            retraining(dataset_source="digits", registry_uri="s3://registry", learning_rate=learning_rate)

    tasks = _train_tasks(_compiled(sweep, tmp_path))
    assert len(tasks) == 2 and {path[-1] for path in tasks} == {"train"}
    for path, task in tasks.items():
        assert task["looped"], path
        assert task["inputs"]["parameters"].get("kfp_task_id") == TASK_ID, path
        assert task["inputs"]["parameters"]["kfp_task_name"] == TASK_NAME, path


def test_the_component_hands_the_task_id_to_the_step(monkeypatch, tmp_path) -> None:
    """``train`` (the component's function) puts ``kfp_task_id`` into the spec the step runs."""
    from components.specs import train
    from components.training import step

    seen = []

    class Ran(Exception):
        pass

    def run_train_step(spec, **_: object) -> None:
        seen.append(spec)
        raise Ran

    monkeypatch.setattr(step, "run_train_step", run_train_step)
    monkeypatch.setenv("TRAINFLOW_LOG_DIR", str(tmp_path / "work"))
    artifact = SimpleNamespace(path=str(tmp_path / "a"), uri="", metadata={})
    with pytest.raises(Ran):
        train.python_func(dataset=artifact, model=artifact, metrics=artifact, kfp_run_id="run-1",
                          kfp_task_name="train", kfp_task_id="101", pipeline_root="s3://root")
    (spec,) = seen
    assert (spec.kfp_run_id, spec.kfp_task_name, spec.kfp_task_id) == ("run-1", "train", "101")
