"""The example DAG parses in Airflow's DagBag and builds its trigger form from the compiled
pipeline: one Param per pipeline parameter, typed, in the documented order, with bounds; and it
still parses (documented fallback parameters) when the compiled file is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_bridge.package import load_pipeline_package

EXAMPLE = Path(__file__).resolve().parents[2] / "airflow_bridge" / "example_dags" / "trainflow_training.py"


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: Path | None):
    from airflow.dag_processing.dagbag import DagBag

    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    monkeypatch.setenv("TRAINFLOW_TRAINING_PIPELINE", str(package or tmp_path / "missing.yaml"))
    bag = DagBag(str(tmp_path))
    assert bag.import_errors == {}
    return bag.dags["trainflow_training"]


def test_params_come_from_the_compiled_pipeline(tmp_path, monkeypatch, training_pipeline_package) -> None:
    dag = load(tmp_path, monkeypatch, training_pipeline_package)
    params = dag.params
    names = list(params.keys())
    assert names[:3] == ["dataset_source", "model_name", "epochs"]
    assert {"nproc_per_node", "registered_model_name", "job_key"} <= set(
        names
    )  # everything the YAML declares
    epochs = params.get_param("epochs")
    compiled_default = load_pipeline_package(training_pipeline_package).parameters["epochs"].default
    assert epochs.value == compiled_default and isinstance(epochs.value, int)
    assert epochs.schema["type"] == "integer" and epochs.schema["minimum"] == 1
    assert params.get_param("fault_at_step").schema["minimum"] == -1
    assert params.get_param("learning_rate").schema["type"] == "number"
    assert names[3:6] == ["global_batch_size", "adaptive_batch", "max_global_batch_size"]
    adaptive = params.get_param("adaptive_batch")
    assert adaptive.value is False and adaptive.schema["type"] == "boolean"
    assert "goodput" in adaptive.description
    max_batch = params.get_param("max_global_batch_size")
    assert max_batch.value == 0 and max_batch.schema["type"] == "integer" and max_batch.schema["minimum"] == 0
    assert "8x global_batch_size" in max_batch.description
    task = dag.get_task("train")
    assert task.parameters["epochs"] == "{{ params['epochs'] }}"
    assert task.parameters["adaptive_batch"] == "{{ params['adaptive_batch'] }}"
    assert task.deferrable is True and task.pipeline_package_path == str(training_pipeline_package)


def test_missing_package_falls_back_to_the_documented_parameters(tmp_path, monkeypatch) -> None:
    dag = load(tmp_path, monkeypatch, None)
    assert list(dag.params.keys()) == [
        "dataset_source",
        "model_name",
        "epochs",
        "global_batch_size",
        "adaptive_batch",
        "max_global_batch_size",
        "learning_rate",
        "min_workers",
        "max_workers",
        "checkpoint_interval_steps",
        "checkpoint_interval_s",
        "fault_at_step",
        "job_key",
        "backend",
    ]
    assert dag.params.get_param("adaptive_batch").value is False
    assert dag.params.get_param("adaptive_batch").schema["type"] == "boolean"
