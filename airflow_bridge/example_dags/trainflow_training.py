"""``trainflow_training``: train a model as a Kubeflow Pipelines run, triggered from the Airflow UI.

"Trigger DAG" in the UI shows a form built from the DAG's ``Param``s: one per parameter of the
compiled ``training_pipeline`` (names, types, defaults and descriptions are read from the compiled
YAML), with bounds for the knobs people set by hand (epochs, worker counts, checkpoint intervals,
fault injection, the opt-in adaptive batch). The task submits the pipeline with those values
(converted back to the declared types) and waits in the triggerer.

Where the compiled pipeline comes from (first that is set):

1. ``$TRAINFLOW_TRAINING_PIPELINE`` -- path of the YAML (``trainflow compile --output FILE``);
2. ``training_pipeline.yaml`` next to this file.

If the file is missing when the DAG is parsed, the form falls back to the documented parameter
list and the task fails with a one-line error naming the missing file.

The KFP endpoint is the ``kubeflow_pipelines_default`` connection; without one, the local server
(``trainflow kfp-server``, http://127.0.0.1:8888) is used.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param

from airflow_bridge.exceptions import KfpPackageError
from airflow_bridge.operators.kfp import KfpRunPipelineOperator
from airflow_bridge.package import PipelineParameter, load_pipeline_package

PIPELINE_PACKAGE = os.environ.get("TRAINFLOW_TRAINING_PIPELINE") or str(
    Path(__file__).with_name("training_pipeline.yaml")
)

#: The training pipeline's main parameters (pipelines/training.py): the form order, and the form
#: itself when the compiled YAML is not there yet.
FALLBACK_PARAMETERS = [
    PipelineParameter(name="dataset_source", parameter_type="STRING", default="mnist"),
    PipelineParameter(name="model_name", parameter_type="STRING", default="small_cnn"),
    PipelineParameter(name="epochs", parameter_type="NUMBER_INTEGER", default=8),
    PipelineParameter(name="global_batch_size", parameter_type="NUMBER_INTEGER", default=64),
    PipelineParameter(name="adaptive_batch", parameter_type="BOOLEAN", default=False),
    PipelineParameter(name="max_global_batch_size", parameter_type="NUMBER_INTEGER", default=0),
    PipelineParameter(name="learning_rate", parameter_type="NUMBER_DOUBLE", default=0.05),
    PipelineParameter(name="min_workers", parameter_type="NUMBER_INTEGER", default=1),
    PipelineParameter(name="max_workers", parameter_type="NUMBER_INTEGER", default=1),
    PipelineParameter(name="checkpoint_interval_steps", parameter_type="NUMBER_INTEGER", default=50),
    PipelineParameter(name="checkpoint_interval_s", parameter_type="NUMBER_DOUBLE", default=30.0),
    PipelineParameter(name="fault_at_step", parameter_type="NUMBER_INTEGER", default=-1),
    PipelineParameter(name="job_key", parameter_type="STRING", default=""),
    PipelineParameter(name="backend", parameter_type="STRING", default="local"),
]

#: Extra JSON-schema keywords for the form, by parameter name.
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "epochs": {"minimum": 1, "description": "Passes over the training data."},
    "global_batch_size": {"minimum": 1, "description": "Samples per step across all workers."},
    "adaptive_batch": {
        "description": "Opt-in: re-pick the global batch for goodput at every (re)start and epoch "
        "end, starting from global_batch_size (docs/training.md, Adaptive batch).",
    },
    "max_global_batch_size": {
        "minimum": 0,
        "description": "Adaptive batch: largest global batch (0 = 8x global_batch_size).",
    },
    "learning_rate": {"exclusiveMinimum": 0, "description": "Optimizer learning rate."},
    "min_workers": {"minimum": 1, "description": "Elastic lower bound on the number of workers."},
    "max_workers": {"minimum": 1, "description": "Elastic upper bound on the number of workers."},
    "checkpoint_interval_steps": {"minimum": 0, "description": "Checkpoint every N steps (0 = off)."},
    "checkpoint_interval_s": {"minimum": 0, "description": "Checkpoint at least every N seconds (0 = off)."},
    "fault_at_step": {
        "minimum": -1,
        "description": "Kill a worker at this step to test resume (-1 = never).",
    },
    "job_key": {"description": "Checkpoint identity; empty = derived from the Airflow task instance."},
    "nproc_per_node": {"minimum": 1, "description": "Training processes per worker."},
    "max_restarts": {"minimum": 0, "description": "torchrun restarts of the worker group."},
    "keep_last_k": {"minimum": 1, "description": "Committed checkpoints kept."},
    "test_fraction": {
        "exclusiveMinimum": 0,
        "exclusiveMaximum": 1,
        "description": "Held-out share of the data.",
    },
    "gpus_per_worker": {"minimum": 0, "description": "GPUs per worker (PyTorchJob backend)."},
    "min_accuracy_to_promote": {
        "minimum": 0,
        "maximum": 1,
        "description": "Register only above this accuracy.",
    },
}


def _pipeline_parameters() -> list[PipelineParameter]:
    """The compiled pipeline's parameters, in the documented order first (kfp sorts them by name)."""
    try:
        params = list(load_pipeline_package(PIPELINE_PACKAGE).parameters.values())
    except KfpPackageError:
        return FALLBACK_PARAMETERS
    order = {p.name: i for i, p in enumerate(FALLBACK_PARAMETERS)}
    return sorted(params, key=lambda p: (order.get(p.name, len(order)), p.name))


def _param(p: PipelineParameter) -> Param:
    schema: dict[str, Any] = {"type": p.json_schema_type, "title": p.name}
    if p.description:
        schema["description"] = p.description
    schema.update(CONSTRAINTS.get(p.name, {}))
    default = p.default
    if default is None:
        default = {"string": "", "integer": 0, "number": 0.0, "boolean": False}.get(p.json_schema_type)
    return Param(default, **schema)


PARAMETERS = _pipeline_parameters()

with DAG(
    dag_id="trainflow_training",
    description="Train a model as a Kubeflow Pipelines run (trainflow training_pipeline)",
    schedule=None,
    catchup=False,
    params={p.name: _param(p) for p in PARAMETERS},
    tags=["trainflow", "kubeflow"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
) as dag:
    train = KfpRunPipelineOperator(
        task_id="train",
        pipeline_package_path=PIPELINE_PACKAGE,
        parameters={p.name: "{{ params['" + p.name + "'] }}" for p in PARAMETERS},
        run_name="trainflow_training {{ run_id }}",
        experiment_name="trainflow",
        deferrable=True,
        poll_interval_s=5.0,
    )
