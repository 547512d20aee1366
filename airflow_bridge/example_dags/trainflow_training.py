"""``trainflow_training``: train a model as a Kubeflow Pipelines run, triggered from the Airflow UI.

"Trigger" in the UI shows a form that submits as it opens: every field holds the compiled
pipeline's default, has a description and the pipeline's own bounds, and may be emptied (an
empty field means "the pipeline's default"). The fields are grouped in three sections:
*Training*, *Checkpointing* and *Advanced* (:data:`FORM`). The task submits the compiled
``training_pipeline`` with those values and waits in the triggerer, logging each KFP task's state
and the trainer's steps as they come.

Ops and security settings are not in the form (:data:`OPS_SETTINGS`): the image, the namespace
and the S3 Secret name, the checkpoint and model-registry roots, the backend, the registered
model's name and its promotion threshold. Anyone allowed to trigger the DAG could otherwise run
any image with any Secret of the namespace, or resume, prune or promote another job's work. They
come from Airflow Variables the DAG's author chooses (``trainflow_image``, ...; unset: the
pipeline's default), and the job key is derived from the task instance. A team that wants them in
the form sets :data:`OPS_SETTINGS_IN_FORM` to ``True``. That is a decision to let every user
who may trigger this DAG choose what runs and with which credentials.

Where the compiled pipeline comes from (first that is set):

1. ``$TRAINFLOW_TRAINING_PIPELINE`` -- path of the YAML (``trainflow compile --output FILE``);
2. ``training_pipeline.yaml`` next to this file.

Types and defaults are read from that file, so they cannot drift from the pipeline. If it is
missing when the DAG is parsed, the DAG still appears with an empty form, and a triggered run
fails at once with a one-line error naming the file. The KFP endpoint is the
``kubeflow_pipelines_default`` connection; the task fails with a one-line error when it is not
defined.
"""

from __future__ import annotations

import json
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

#: DAG-level switch: also show :data:`OPS_SETTINGS` in the Trigger form (section "Deployment").
#: Off by default: with it on, whoever may trigger the DAG chooses the image that runs, the
#: Secret it reads and the checkpoint and registry paths it writes.
OPS_SETTINGS_IN_FORM = False

TRAINING, CHECKPOINTING, ADVANCED, DEPLOYMENT = "Training", "Checkpointing", "Advanced", "Deployment"

#: The Trigger form, in order: pipeline parameter -> section, description and the bounds the
#: pipeline itself enforces (components/training/config.py, step.py, sources.py). Types and
#: defaults come from the compiled pipeline. The one list of the form's fields.
FORM: dict[str, dict[str, Any]] = {
    "dataset_source": {
        "section": TRAINING,
        "description": "mnist (5,000 real digits), digits (scikit-learn 8x8), synthetic-imagenet[:N], "
        "a folder in ImageFolder layout, or s3://bucket/prefix.",
        "minLength": 1,
    },
    "test_fraction": {
        "section": TRAINING,
        "description": "Share of the data held out for evaluation, stratified by class.",
        "exclusiveMinimum": 0,
        "exclusiveMaximum": 1,
    },
    "model_name": {
        "section": TRAINING,
        "description": "Architecture to train.",
        "enum": ["small_cnn", "resnet18", "wide_resnet101_2"],
    },
    "epochs": {"section": TRAINING, "description": "Passes over the training data.", "minimum": 1},
    "global_batch_size": {
        "section": TRAINING,
        "description": "Samples per step across all workers.",
        "minimum": 1,
    },
    "learning_rate": {"section": TRAINING, "description": "Peak learning rate.", "exclusiveMinimum": 0},
    "optimizer": {"section": TRAINING, "description": "Optimizer.", "enum": ["sgd", "adamw"]},
    "seed": {
        "section": TRAINING,
        "description": "Seed of the weights, the data split and order, and every random stream.",
        "minimum": 0,
    },
    "min_workers": {
        "section": TRAINING,
        "description": "Elastic lower bound on the number of workers (pods, or torchrun nodes locally).",
        "minimum": 1,
    },
    "max_workers": {
        "section": TRAINING,
        "description": "Elastic upper bound on the number of workers (>= min_workers).",
        "minimum": 1,
    },
    "nproc_per_node": {"section": TRAINING, "description": "Training processes per worker.", "minimum": 1},
    "gpus_per_worker": {
        "section": TRAINING,
        "description": "GPUs per worker pod (PyTorchJob backend; 0 = CPU).",
        "minimum": 0,
    },
    "worker_cpu": {
        "section": TRAINING,
        "description": "CPU request and limit of each worker pod (Kubernetes quantity, e.g. 2 or 500m).",
    },
    "worker_memory": {
        "section": TRAINING,
        "description": "Memory request and limit of each worker pod (Kubernetes quantity, e.g. 4Gi).",
    },
    "checkpoint_interval_steps": {
        "section": CHECKPOINTING,
        "description": "Checkpoint every N steps (0 = off).",
        "minimum": 0,
    },
    "checkpoint_interval_s": {
        "section": CHECKPOINTING,
        "description": "Checkpoint at least every N seconds (0 = off).",
        "minimum": 0,
    },
    "keep_last_k": {
        "section": CHECKPOINTING,
        "description": "Committed checkpoints kept; older ones are deleted.",
        "minimum": 1,
    },
    "adaptive_batch": {
        "section": ADVANCED,
        "description": "Opt-in: re-pick the global batch for goodput at every (re)start and epoch end, "
        "starting from global_batch_size (docs/training.md, Adaptive batch).",
    },
    "max_global_batch_size": {
        "section": ADVANCED,
        "description": "Adaptive batch: largest global batch (0 = 8x global_batch_size).",
        "minimum": 0,
    },
    "max_restarts": {
        "section": ADVANCED,
        "description": "torchrun restarts of the worker group before the step fails.",
        "minimum": 0,
    },
    "fault_at_step": {
        "section": ADVANCED,
        "description": "Kill a worker once after this step to test resume (-1 or 0 = never).",
        "minimum": -1,
    },
}

#: Ops and security settings: pipeline parameter -> the Airflow Variable that sets it (unset: the
#: pipeline's default) and its description. ``job_key`` has no Variable: the operator derives it
#: from the task instance, so a retry resumes the same checkpoints.
OPS_SETTINGS: dict[str, dict[str, Any]] = {
    "backend": {
        "variable": "trainflow_backend",
        "description": "Where training runs: local (torchrun in the KFP step) or pytorchjob (a "
        "PyTorchJob on the cluster).",
        "enum": ["local", "pytorchjob"],
    },
    "image": {"variable": "trainflow_image", "description": "Container image of the PyTorchJob's workers."},
    "namespace": {
        "variable": "trainflow_namespace",
        "description": "Kubernetes namespace of the PyTorchJob.",
    },
    "s3_secret_name": {
        "variable": "trainflow_s3_secret_name",
        "description": "Kubernetes Secret with the S3 credentials the workers get as environment.",
    },
    "checkpoint_uri": {
        "variable": "trainflow_checkpoint_uri",
        "description": "Checkpoint root (folder or s3://bucket/prefix; empty = under the pipeline root).",
    },
    "registry_uri": {
        "variable": "trainflow_registry_uri",
        "description": "Model registry root (empty = next to the checkpoints).",
    },
    "registered_model_name": {
        "variable": "trainflow_registered_model_name",
        "description": "Name the model is registered under.",
    },
    "min_accuracy_to_promote": {
        "variable": "trainflow_min_accuracy_to_promote",
        "description": "Make the new version CURRENT only at or above this test accuracy.",
        "minimum": 0,
        "maximum": 1,
    },
    "worker_pod_settings": {
        "variable": "trainflow_worker_pod_settings",
        "description": "JSON object for the worker pods: tolerations, node selector, service account, "
        "priority class, grace period, more resources (docs/launcher.md).",
    },
    "s3_endpoint_url": {
        "variable": "trainflow_s3_endpoint_url",
        "description": "S3 endpoint for every step and worker (empty = the Secret's or the SDK's default).",
    },
    "keep_failed_job": {
        "variable": "trainflow_keep_failed_job",
        "description": "Keep a failed PyTorchJob and its pods for inspection instead of deleting them.",
    },
    "job_key": {
        "variable": None,
        "description": "Checkpoint identity; empty = derived from the Airflow task instance (a retry "
        "resumes the same checkpoints).",
    },
}


def _pipeline_parameters() -> dict[str, PipelineParameter]:
    """The compiled pipeline's parameters by name (empty when the file is missing or unreadable)."""
    try:
        return load_pipeline_package(PIPELINE_PACKAGE).parameters
    except KfpPackageError:
        return {}


def _literal(value: Any) -> str:
    """``value`` as a Jinja literal (JSON literals are Jinja literals)."""
    return json.dumps(value)


def _param(p: PipelineParameter, section: str, spec: dict[str, Any]) -> Param:
    """A form field: the declared type, nullable unless it is a choice or a switch (an emptied
    field means the pipeline's default), the compiled default, description and bounds."""
    extra = {k: v for k, v in spec.items() if k not in ("section", "variable")}
    kind = p.json_schema_type
    nullable = kind != "boolean" and "enum" not in extra
    return Param(p.default, type=["null", kind] if nullable else kind, title=p.name, section=section, **extra)


def _from_form(p: PipelineParameter) -> str:
    """The field's value, or the pipeline's default when it was emptied."""
    return f"{{{{ params[{p.name!r}] if params[{p.name!r}] is not none else {_literal(p.default)} }}}}"


def _from_variable(p: PipelineParameter, variable: str) -> str:
    """The Airflow Variable's value, or the pipeline's default when it is not set."""
    return f"{{{{ var.value.get({variable!r}, {_literal(p.default)}) }}}}"


PARAMETERS = _pipeline_parameters()
_FORM = {name: spec for name, spec in FORM.items() if name in PARAMETERS}
_OPS = {name: spec for name, spec in OPS_SETTINGS.items() if name in PARAMETERS}
if OPS_SETTINGS_IN_FORM:
    _FORM.update({name: {**spec, "section": DEPLOYMENT} for name, spec in _OPS.items()})
    _OPS = {}

with DAG(
    dag_id="trainflow_training",
    description="Train a model as a Kubeflow Pipelines run (trainflow training_pipeline)",
    doc_md=__doc__,
    schedule=None,
    catchup=False,
    is_paused_upon_creation=False,  # triggered by hand only (schedule=None): usable right away
    params={name: _param(PARAMETERS[name], spec["section"], spec) for name, spec in _FORM.items()},
    tags=["trainflow", "kubeflow"],
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30)},
) as dag:
    train = KfpRunPipelineOperator(
        task_id="train",
        pipeline_package_path=PIPELINE_PACKAGE,
        parameters={
            **{name: _from_form(PARAMETERS[name]) for name in _FORM},
            **{
                name: _from_variable(PARAMETERS[name], spec["variable"])
                for name, spec in _OPS.items()
                if spec["variable"]
            },
        },
        run_name="trainflow_training {{ run_id }}",
        experiment_name="trainflow",
        deferrable=True,
        poll_interval_s=5.0,
    )
