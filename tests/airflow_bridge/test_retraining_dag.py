"""The retraining example DAG parses in Airflow's DagBag: scheduled on the dataset Asset, whose
watcher is the listing trigger; the task submits the retraining pipeline with the event's payload."""

from __future__ import annotations

import shutil
from pathlib import Path

from airflow_bridge.triggers.dataset import CLASSPATH

EXAMPLE = Path(__file__).resolve().parents[2] / "airflow_bridge" / "example_dags" / "trainflow_retraining.py"


def test_dag_is_scheduled_on_the_watched_dataset(tmp_path, monkeypatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    monkeypatch.setenv("TRAINFLOW_DATASET_URI", "s3://data/mnist")
    monkeypatch.setenv("TRAINFLOW_REGISTRY_URI", "s3://models/registry")
    monkeypatch.setenv("TRAINFLOW_DATASET_POLL_S", "5")
    bag = DagBag(str(tmp_path))
    assert bag.import_errors == {}
    dag = bag.dags["trainflow_retraining"]
    (asset,) = dag.timetable.asset_condition.objects if hasattr(dag.timetable.asset_condition, "objects") \
        else [dag.timetable.asset_condition]
    assert asset.uri == "s3://data/mnist" and asset.name == "trainflow-dataset-mnist-classifier"
    (watcher,) = asset.watchers
    assert watcher.trigger.serialize() == (CLASSPATH, {"uri": "s3://data/mnist", "poll_interval_s": 5.0,
                                                       "baseline_fingerprint": "", "aws_conn_id": ""})
    task = dag.get_task("check_and_retrain")
    assert [a.uri for a in task.inlets] == ["s3://data/mnist"]
    assert [a.uri for a in task.outlets] == ["s3://models/registry/mnist-classifier"]
    assert task.parameters["retrain_policy"] == "{{ params['retrain_policy'] }}"
    assert "triggering_asset_events" in task.parameters["dataset_change"]
    assert dag.params.get_param("retrain_policy").schema["enum"] == ["on-drift", "always"]


def test_dataset_change_template_renders_the_newest_event_payload() -> None:
    import jinja2

    from airflow_bridge.example_dags.trainflow_retraining import DATASET_CHANGE

    class Event:
        def __init__(self, extra):
            self.extra = extra

    env = jinja2.Environment()
    events = {"a": [Event({"from_trigger": True, "payload": {"objects": 1}}),
                    Event({"from_trigger": True, "payload": {"objects": 8, "change": {"added": 7}}})]}
    assert env.from_string(DATASET_CHANGE).render(triggering_asset_events=events) == \
        '{"change": {"added": 7}, "objects": 8}'
    assert env.from_string(DATASET_CHANGE).render(triggering_asset_events={}) == ""
