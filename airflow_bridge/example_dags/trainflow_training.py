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
from trainflow.common.training_spec import form_fields, ops_settings

PIPELINE_PACKAGE = os.environ.get("TRAINFLOW_TRAINING_PIPELINE") or str(
    Path(__file__).with_name("training_pipeline.yaml")
)

#: DAG-level switch: also show :data:`OPS_SETTINGS` in the Trigger form (section "Deployment").
#: Off by default: with it on, whoever may trigger the DAG chooses the image that runs, the
#: Secret it reads and the checkpoint and registry paths it writes.
OPS_SETTINGS_IN_FORM = False

DEPLOYMENT = "Deployment"

#: The Trigger form, in order: pipeline parameter -> section, description and the bounds the
#: pipeline itself enforces — the training spec's P rows that are not ops settings
#: (trainflow/common/training_spec.py, the one table of the training parameters). Types and
#: defaults come from the compiled pipeline.
FORM: dict[str, dict[str, Any]] = form_fields()

#: Ops and security settings: pipeline parameter -> the Airflow Variable that sets it (unset: the
#: pipeline's default) and its description — the P rows the table marks as ops settings.
#: ``job_key`` has no Variable: the operator derives it from the task instance, so a retry
#: resumes the same checkpoints.
OPS_SETTINGS: dict[str, dict[str, Any]] = ops_settings()


def _pipeline_parameters() -> dict[str, PipelineParameter]:
    """The compiled pipeline's parameters by name (empty when the file is missing or unreadable)."""
    try:
        return load_pipeline_package(PIPELINE_PACKAGE).parameters
    except KfpPackageError:
        return {}


def _literal(value: Any) -> str:
    """``value`` as a Jinja literal. JSON scalars are Jinja literals, but JSON's ``null`` is not
    (Jinja knows ``none``; an unknown name fails the render with UndefinedError). A missing default
    (``None``) renders as an empty string: the operator then passes ``""``, or names the parameter
    in a one-line error when its type is not a string. A list or dict default becomes its JSON text
    (a Jinja string), which the operator parses back (nested ``None`` included)."""
    if value is None:
        return '""'
    if isinstance(value, list | dict):
        return json.dumps(json.dumps(value))
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
