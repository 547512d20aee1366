"""``trainflow_retraining``: retrain when the training data changes (data-aware scheduling).

The DAG is scheduled on the dataset's Asset. The Asset's watcher (:class:`DatasetChangeTrigger`, in
the triggerer) lists the dataset's ``s3://`` prefix or folder every ``TRAINFLOW_DATASET_POLL_S``
seconds and creates one asset event per settled change of its listing fingerprint (keys, sizes,
ETags; re-uploading identical bytes changes nothing). Each event starts one DAG run, whose task
submits ``retraining_pipeline`` (pipelines/retraining.py) to KFP and waits in the triggerer:

    drift check ▶ (verdict says retrain, or retrain_policy=always) prepare ▶ train ▶ evaluate ▶
    register — only if the new model beats the current version on the held-out split

The asset event's payload (fingerprints, objects added/removed/changed) goes to the pipeline as
``dataset_change`` and ends up in the new version's lineage (the events queued while a retraining
ran, which Airflow hands to one later DAG run, merged into one change: :func:`dataset_change`). The task's outlet is the model's Asset.

Configuration (environment of the DAG processor and workers):

* ``TRAINFLOW_DATASET_URI`` — the data (default ``s3://trainflow-data/mnist``);
* ``TRAINFLOW_REGISTRY_URI`` — the model registry (default ``s3://trainflow-models/models``);
* ``TRAINFLOW_MODEL_NAME`` — the registered model (default ``mnist-classifier``);
* ``TRAINFLOW_DATASET_POLL_S`` — seconds between listings (default 60);
* ``TRAINFLOW_RETRAINING_PIPELINE`` — the compiled pipeline (default ``retraining_pipeline.yaml``
  next to this file: ``kfp dsl compile --py pipelines/retraining.py --function retraining_pipeline``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, AssetWatcher, Param

from airflow_bridge.operators.kfp import KfpRunPipelineOperator
from airflow_bridge.triggers.dataset import DatasetChangeTrigger, merged_change
from trainflow.common.training_spec import ROWS

DATASET_URI = os.environ.get("TRAINFLOW_DATASET_URI", "s3://trainflow-data/mnist")
REGISTRY_URI = os.environ.get("TRAINFLOW_REGISTRY_URI", "s3://trainflow-models/models")
MODEL_NAME = os.environ.get("TRAINFLOW_MODEL_NAME", "mnist-classifier")
POLL_S = float(os.environ.get("TRAINFLOW_DATASET_POLL_S", "60"))
PIPELINE_PACKAGE = os.environ.get("TRAINFLOW_RETRAINING_PIPELINE") or str(
    Path(__file__).with_name("retraining_pipeline.yaml")
)

def _row_param(name: str, kind: str, note: str = "") -> Param:
    """A form field for the training spec's row ``name``: its default, bounds and description."""
    row = ROWS[name]
    return Param(row.default, type=kind, description=row.describe() + note, **row.json_schema())


def dataset_change(triggering_asset_events: Any) -> str:
    """The dataset's listing change since the current model, as JSON (``""`` for a run started by
    hand): every triggering asset event's payload merged (``DatasetChangeTrigger``'s
    ``merged_change``): changes that came while a retraining ran are one DAG run's events."""
    events = [event for events in triggering_asset_events.values() for event in events]
    change = merged_change([event.extra.get("payload", event.extra) for event in events])
    return "" if change is None else json.dumps(change, sort_keys=True)


#: The ``dataset_change`` parameter's template (the DAG's ``user_defined_filters`` has the filter).
DATASET_CHANGE = "{{ triggering_asset_events | dataset_change }}"

dataset = Asset(
    uri=DATASET_URI,
    name=f"trainflow-dataset-{MODEL_NAME}",
    group="trainflow-datasets",
    watchers=[AssetWatcher(name=f"trainflow-listing-{MODEL_NAME}",
                           trigger=DatasetChangeTrigger(uri=DATASET_URI, poll_interval_s=POLL_S))],
)
model = Asset(uri=f"{REGISTRY_URI.rstrip('/')}/{MODEL_NAME}", name=f"trainflow-model-{MODEL_NAME}",
              group="trainflow-models")

with DAG(
    dag_id="trainflow_retraining",
    description="Check new data for drift and retrain (trainflow retraining_pipeline) when the dataset changes",
    schedule=[dataset],
    catchup=False,
    max_active_runs=1,
    params={
        "retrain_policy": Param("on-drift", enum=["on-drift", "always"],
                                description="Retrain only when the drift check says so, or on every change."),
        # Training parameters: default, bounds and description from the training spec's rows.
        "promotion_threshold": _row_param("promotion_threshold", "number",
                                          note=" A new version must also beat the current one."),
        "epochs": _row_param("epochs", "integer"),
        "drift_alpha": Param(0.01, type="number", exclusiveMinimum=0, exclusiveMaximum=1,
                             description="Significance level of each drift test family."),
    },
    tags=["trainflow", "kubeflow", "retraining"],
    user_defined_filters={"dataset_change": dataset_change},
) as dag:
    KfpRunPipelineOperator(
        task_id="check_and_retrain",
        pipeline_package_path=PIPELINE_PACKAGE,
        parameters={
            "dataset_source": DATASET_URI,
            "registry_uri": REGISTRY_URI,
            "registered_model_name": MODEL_NAME,
            "retrain_policy": "{{ params['retrain_policy'] }}",
            "promotion_threshold": "{{ params['promotion_threshold'] }}",
            "epochs": "{{ params['epochs'] }}",
            "drift_alpha": "{{ params['drift_alpha'] }}",
            "dataset_change": DATASET_CHANGE,
        },
        run_name="trainflow_retraining {{ run_id }}",
        experiment_name="trainflow",
        deferrable=True,
        poll_interval_s=5.0,
        inlets=[dataset],
        outlets=[model],
    )
