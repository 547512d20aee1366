"""The example DAG's Trigger form, parsed by Airflow's DagBag from the real compiled pipeline.

* the form submits unchanged: every field holds the compiled default and validates, and an
  emptied field (null) is valid too and becomes the pipeline's default;
* every field has a description, a section (Training / Checkpointing / Advanced) and the bounds
  the pipeline enforces (``test_fraction`` in (0, 1), ...); the choice lists are the pipeline's;
* every pipeline parameter is either a form field or an ops/security setting, never both; the
  ops settings are not in the form and come from Airflow Variables (unset: the pipeline's
  default), the job key from the task instance; the documented switch puts them in the form;
* the rendered parameters convert to the pipeline's types (``epochs`` an integer);
* the DAG starts unpaused; with the compiled file missing it still parses (empty form).

The browser tests in test_airflow_form.py submit the same form through the real UI.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from airflow_bridge.operators.kfp import pipeline_arguments
from airflow_bridge.package import load_pipeline_package

EXAMPLE = Path(__file__).resolve().parents[2] / "airflow_bridge" / "example_dags" / "trainflow_training.py"
SECTIONS = ["Training", "Checkpointing", "Advanced"]


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: Path | None, *, ops_in_form: bool = False):
    from airflow.dag_processing.dagbag import DagBag

    text = EXAMPLE.read_text()
    if ops_in_form:  # what a DAG author does to turn the switch on
        assert "\nOPS_SETTINGS_IN_FORM = False\n" in text
        text = text.replace("\nOPS_SETTINGS_IN_FORM = False\n", "\nOPS_SETTINGS_IN_FORM = True\n")
    (tmp_path / EXAMPLE.name).write_text(text)
    monkeypatch.setenv("TRAINFLOW_TRAINING_PIPELINE", str(package or tmp_path / "missing.yaml"))
    bag = DagBag(str(tmp_path))
    assert bag.import_errors == {}
    return bag.dags["trainflow_training"]


def module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("trainflow_training_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def render(dag, conf: dict | None = None) -> dict:
    """The task's parameters as the worker renders them for a DAG run with ``conf``."""
    from airflow.sdk.execution_time.context import VariableAccessor

    task = dag.get_task("train")
    params = {name: dag.params[name] for name in dag.params}
    params.update(conf or {})
    context = {"params": params, "var": {"value": VariableAccessor(deserialize_json=False)}, "run_id": "r"}
    return task.render_template(task.parameters, context)


def test_the_form_submits_unchanged_with_every_field_described(
    tmp_path, monkeypatch, training_pipeline_package
) -> None:
    dag = load(tmp_path, monkeypatch, training_pipeline_package)
    declared = load_pipeline_package(training_pipeline_package).parameters
    params = dag.params
    assert dag.params.validate() is not None  # the defaults pass the form's own validation
    assert list(params.keys())[:4] == ["dataset_source", "test_fraction", "model_name", "task"]
    sections = []
    for name in params:
        param = params.get_param(name)
        assert param.description, f"{name} has no description"
        assert param.value == declared[name].default, name  # the compiled default, typed
        section = param.schema["section"]
        assert section in SECTIONS, name
        if section not in sections:
            sections.append(section)
        kind = param.schema["type"]
        if declared[name].parameter_type == "BOOLEAN" or "enum" in param.schema:
            assert kind == declared[name].json_schema_type
        else:  # may be emptied: null means the pipeline's default
            assert kind == ["null", declared[name].json_schema_type], name
            copy.deepcopy(param).resolve(None)  # resolve() keeps the value it validated
    assert sections == SECTIONS  # grouped, in this order
    assert isinstance(params["epochs"], int) and params.get_param("epochs").schema["minimum"] == 1
    assert params.get_param("adaptive_batch").value is False


@pytest.mark.parametrize(
    ("name", "bad", "good"),
    [
        ("test_fraction", 1.5, 0.3),
        ("test_fraction", 0, 0.99),
        ("epochs", 0, 1),
        ("learning_rate", 0, 1e-4),
        ("keep_last_k", 0, 1),
        ("fault_at_step", -1, 0),
        ("model_name", "vgg", "resnet18"),
        ("optimizer", "lion", "adamw"),
        ("checkpoint_interval_steps", -1, 0),
    ],
)
def test_the_bounds_are_the_pipelines(tmp_path, monkeypatch, training_pipeline_package, name, bad, good) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    param = load(tmp_path, monkeypatch, training_pipeline_package).params.get_param(name)
    with pytest.raises(ParamValidationError):
        param.resolve(bad)
    assert param.resolve(good) == good


def test_the_choice_lists_are_the_pipelines() -> None:
    from trainflow.common.training_spec import BACKENDS, MODELS, OptimConfig

    mod = module()
    assert tuple(mod.FORM["model_name"]["enum"]) == MODELS
    assert tuple(mod.OPS_SETTINGS["backend"]["enum"]) == tuple(BACKENDS)
    for optimizer in mod.FORM["optimizer"]["enum"]:
        OptimConfig(optimizer=optimizer)  # accepted by the runtime's validation


def test_every_pipeline_parameter_is_a_form_field_or_an_ops_setting(training_pipeline_package) -> None:
    mod = module()
    declared = set(load_pipeline_package(training_pipeline_package).parameters)
    assert not set(mod.FORM) & set(mod.OPS_SETTINGS)
    assert set(mod.FORM) | set(mod.OPS_SETTINGS) == declared
    assert {"image", "namespace", "s3_secret_name", "checkpoint_uri", "registry_uri", "job_key"} <= set(
        mod.OPS_SETTINGS
    )
    assert all(spec.get("description") for spec in mod.OPS_SETTINGS.values())


def test_ops_settings_come_from_variables_and_the_form_values_convert(
    tmp_path, monkeypatch, training_pipeline_package
) -> None:
    dag = load(tmp_path, monkeypatch, training_pipeline_package)
    package = load_pipeline_package(training_pipeline_package)
    declared = package.parameters
    ops = set(module().OPS_SETTINGS)
    assert not ops & set(dag.params.keys())  # not in the form

    monkeypatch.setenv("AIRFLOW_VAR_TRAINFLOW_IMAGE", "registry.example.com/trainflow:1.2")
    monkeypatch.setenv("AIRFLOW_VAR_TRAINFLOW_NAMESPACE", "team-ml")
    rendered = render(dag, {"epochs": 3, "test_fraction": None, "seed": None})  # two fields emptied
    assert "job_key" not in rendered  # derived from the task instance by the operator
    args = pipeline_arguments(rendered, package, job_key_parameter="job_key", job_key="af-0123")
    assert args["epochs"] == 3 and isinstance(args["epochs"], int)
    assert args["test_fraction"] == declared["test_fraction"].default  # emptied: the pipeline's default
    assert args["seed"] == declared["seed"].default
    assert args["image"] == "registry.example.com/trainflow:1.2" and args["namespace"] == "team-ml"
    assert args["s3_secret_name"] == declared["s3_secret_name"].default  # Variable unset
    assert args["promotion_threshold"] == declared["promotion_threshold"].default
    assert args["adaptive_batch"] is False and args["job_key"] == "af-0123"
    monkeypatch.delenv("AIRFLOW_VAR_TRAINFLOW_IMAGE")
    monkeypatch.delenv("AIRFLOW_VAR_TRAINFLOW_NAMESPACE")
    unchanged = pipeline_arguments(render(dag), package, job_key_parameter="job_key", job_key="af-1")
    assert {k: v for k, v in unchanged.items() if k != "job_key"} == {
        k: p.default for k, p in declared.items() if k != "job_key"
    }
    # the same keys in a hand-written conf (the form's raw JSON, POST /dagRuns) change nothing
    sneaked = {"image": "evil/image:1", "namespace": "kube-system", "s3_secret_name": "admin-creds",
               "checkpoint_uri": "s3://other-team/ckpt", "job_key": "someone-elses-job"}
    args = pipeline_arguments(render(dag, sneaked), package, job_key_parameter="job_key", job_key="af-2")
    assert args == unchanged | {"job_key": "af-2"}


def test_the_documented_switch_puts_the_ops_settings_in_the_form(
    tmp_path, monkeypatch, training_pipeline_package
) -> None:
    dag = load(tmp_path, monkeypatch, training_pipeline_package, ops_in_form=True)
    declared = load_pipeline_package(training_pipeline_package).parameters
    for name in module().OPS_SETTINGS:
        param = dag.params.get_param(name)
        assert param.schema["section"] == "Deployment" and param.description
        assert param.value == declared[name].default
    assert dag.params.validate() is not None
    rendered = render(dag, {"image": "my/image:2", "job_key": None})
    assert rendered["image"] == "my/image:2" and rendered["job_key"] == ""


def test_the_dag_starts_unpaused_and_parses_without_the_compiled_pipeline(tmp_path, monkeypatch) -> None:
    dag = load(tmp_path, monkeypatch, None)
    assert dict(dag.params) == {}
    assert dag.is_paused_upon_creation is False
    assert "training_pipeline" in dag.doc_md
    shutil.rmtree(tmp_path / "__pycache__", ignore_errors=True)


def test_a_parameter_without_a_default_renders_instead_of_failing(tmp_path, monkeypatch) -> None:
    """``None`` (no compiled default) used to become JSON ``null`` in the template, a name Jinja does
    not know: the render failed with UndefinedError. Lists and dicts render as JSON the operator parses."""
    from airflow.sdk.execution_time.context import VariableAccessor

    from airflow_bridge.package import PipelineParameter, convert_argument

    dag = load(tmp_path, monkeypatch, None)
    task = dag.get_task("train")
    mod = module()
    no_default = PipelineParameter(name="note", parameter_type="STRING", default=None)
    listed = PipelineParameter(name="sizes", parameter_type="LIST", default=["a", None, 2])
    context = {"params": {"note": None, "sizes": None}, "var": {"value": VariableAccessor(deserialize_json=False)}}
    monkeypatch.delenv("AIRFLOW_VAR_TRAINFLOW_NOTE", raising=False)
    for template in (mod._from_form(no_default), mod._from_variable(no_default, "trainflow_note")):
        assert task.render_template(template, context) == ""
    for template in (mod._from_form(listed), mod._from_variable(listed, "trainflow_sizes")):
        assert convert_argument(listed, task.render_template(template, context)) == ["a", None, 2]
