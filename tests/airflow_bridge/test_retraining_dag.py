"""The retraining example DAG parses in Airflow's DagBag: scheduled on the dataset Asset, whose
watcher is the listing trigger; the task submits the retraining pipeline with the event's payload."""

from __future__ import annotations

import json
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


def test_dataset_change_template_merges_every_triggering_event() -> None:
    """Review (2026-11-29): Airflow queues the asset events that arrive while the DAG is at
    max_active_runs for one later DAG run; only the newest one's payload reached the pipeline, so
    the new version's lineage named the last change, not every change since the model it replaces."""
    import jinja2

    from airflow_bridge.example_dags.trainflow_retraining import DATASET_CHANGE, dataset_change

    class Event:
        def __init__(self, extra):
            self.extra = extra

    def payload(before: str, after: str, objects: int, added: int, removed: int) -> dict:
        return {"uri": "s3://d/m", "previous_listing_fingerprint": before, "listing_fingerprint": after,
                "objects": objects, "total_bytes": 10 * objects,
                "change": {"added": added, "removed": removed, "changed": 0}}

    env = jinja2.Environment()
    env.filters["dataset_change"] = dataset_change
    one = {"a": [Event({"from_trigger": True, "payload": payload("f0", "f1", 8, 7, 0)})]}
    assert json.loads(env.from_string(DATASET_CHANGE).render(triggering_asset_events=one)) == payload("f0", "f1", 8, 7, 0)
    two = {"a": [Event({"from_trigger": True, "payload": payload("f0", "f1", 8, 7, 0)}),
                 Event({"from_trigger": True, "payload": payload("f1", "f2", 6, 0, 2)})]}
    assert json.loads(env.from_string(DATASET_CHANGE).render(triggering_asset_events=two)) == {
        "uri": "s3://d/m", "previous_listing_fingerprint": "f0", "listing_fingerprint": "f2", "objects": 6,
        "total_bytes": 60, "change": {"added": 7, "removed": 2, "changed": 0}, "events": 2}
    assert env.from_string(DATASET_CHANGE).render(triggering_asset_events={}) == ""
