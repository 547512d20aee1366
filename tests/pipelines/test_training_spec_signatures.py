"""The literal KFP signatures equal the training spec (design-task-api.md §3.5).

KFP needs literal function signatures, so the ``train`` component and the pipelines keep theirs;
these tests pin them to the one table (trainflow/common/training_spec.py): names, types, defaults,
and that the compiled pipeline wires every ``train`` input from the pipeline parameter of the same
name. Failures name the file and the parameter. Also pinned: ``trainflow run``'s options and
``RunOptions`` (generated from the table: every C row, same default), the Airflow example DAG's
form (the P rows) and the kfp.local stand-in pipeline the Airflow tests submit.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import yaml

from trainflow.common import training_spec as ts

PLUMBING = {"dataset", "model", "metrics", "kfp_run_id", "kfp_task_name", "kfp_task_id", "pipeline_root"}
#: The stand-in pipeline's fast demo overrides (tests/support/kfp_pipelines.py).
FAST_DEFAULTS = {"epochs", "learning_rate", "max_workers", "checkpoint_interval_steps", "checkpoint_interval_s"}


def _signature(func, where: str, *, skip=frozenset()) -> dict[str, tuple[type, object]]:
    out = {}
    for name, p in inspect.signature(func).parameters.items():
        if name in skip:
            continue
        assert p.annotation is not inspect.Parameter.empty, f"{where}: parameter {name!r} has no type"
        out[name] = (p.annotation, p.default)
    return out


def _mismatches(where: str, declared: dict[str, tuple[type, object]], rows: tuple[ts.Row, ...], *,
                exact: bool = True, default_exempt=frozenset(), overrides=None) -> list[str]:
    problems = []
    want = {row.name: row for row in rows}
    if exact:
        problems += [f"{where}: parameter {name!r} missing (row in trainflow/common/training_spec.py)"
                     for name in want if name not in declared]
    for name, (annotation, default) in declared.items():
        row = ts.ROWS.get(name)
        if row is None or (exact and name not in want):
            problems.append(f"{where}: parameter {name!r} is not a row of the training spec for this surface")
            continue
        if annotation not in (row.type, row.type.__name__):
            problems.append(f"{where}: {name!r} is {annotation}, the table says {row.type.__name__}")
        expected = (overrides or {}).get(name, row.default)
        if name not in default_exempt and (default != expected or type(default) is not type(expected)):
            problems.append(f"{where}: {name!r} default {default!r}, the table says {expected!r}")
    return problems


def test_the_train_component_signature_is_the_s_rows() -> None:
    from components.specs import train

    declared = _signature(train.python_func, "components/specs/train.py", skip=PLUMBING)
    assert not _mismatches("components/specs/train.py", declared, ts.rows("S"))
    assert list(declared) == list(ts.names("S"))  # and in table order


def test_the_training_pipeline_signature_is_the_p_rows() -> None:
    from pipelines.platform import PlatformSettings
    from pipelines.training import build_pipeline

    for platform in (PlatformSettings(), PlatformSettings(s3_secret="creds")):
        func = build_pipeline(platform).pipeline_func
        declared = _signature(func, "pipelines/training.py")
        assert not _mismatches("pipelines/training.py", declared, ts.rows("P"),
                               overrides={"s3_secret_name": platform.s3_secret})  # compile-time default


def test_the_retraining_pipeline_takes_rows_with_the_tables_defaults() -> None:
    from pipelines.platform import PlatformSettings
    from pipelines.retraining import build_retraining_pipeline

    func = build_retraining_pipeline(PlatformSettings()).pipeline_func
    own = {"retrain_policy", "dataset_change", "drift_alpha", "max_accuracy_drop", "image_size", "channels"}
    declared = _signature(func, "pipelines/retraining.py", skip=own)
    # dataset_source and registry_uri are required there (the DAG always passes them).
    assert not _mismatches("pipelines/retraining.py", declared, ts.rows("P"), exact=False,
                           default_exempt={"dataset_source", "registry_uri"})


def _compiled(func, tmp_path) -> dict:
    from kfp import compiler

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(func, str(out))
    return next(iter(yaml.safe_load_all(out.read_text())))


def _train_task_inputs(spec: dict) -> dict[str, dict]:
    def walk(dag: dict):
        for name, task in dag.get("tasks", {}).items():
            if name.startswith("train"):
                yield task
            sub = spec["components"].get(task["componentRef"]["name"], {}).get("dag")
            if sub:
                yield from walk(sub)

    (task,) = list(walk(spec["root"]["dag"]))
    return task["inputs"]["parameters"]


def test_every_train_input_is_wired_from_the_parameter_of_its_name(tmp_path) -> None:
    from pipelines.platform import PlatformSettings
    from pipelines.retraining import build_retraining_pipeline
    from pipelines.training import build_pipeline

    platform = PlatformSettings()
    spec = _compiled(build_pipeline(platform), tmp_path)
    wired = _train_task_inputs(spec)
    for row in ts.rows("S"):
        if row.on("P"):
            assert wired.get(row.name) == {"componentInputParameter": row.name}, (
                f"pipelines/training.py: train input {row.name!r} is not wired from the pipeline parameter")
    assert wired["s3_access_key_key"]["runtimeValue"]["constant"] == platform.s3_access_key_key
    assert wired["s3_endpoint_key"]["runtimeValue"]["constant"] == platform.s3_endpoint_key

    retraining = build_retraining_pipeline(platform)
    spec = _compiled(retraining, tmp_path)
    wired = _train_task_inputs(spec)
    params = inspect.signature(retraining.pipeline_func).parameters
    for row in ts.rows("S"):
        if row.name in params:  # inside the dsl.If, a pipeline input arrives as pipelinechannel--<name>
            assert wired.get(row.name, {}).get("componentInputParameter") in (
                row.name, f"pipelinechannel--{row.name}"), f"pipelines/retraining.py: {row.name!r} not wired"


def test_the_train_inputs_that_are_not_parameters_are_the_compile_time_secret_keys(tmp_path) -> None:
    """The S rows that are not pipeline parameters are exactly the Secret's key names of
    ``PlatformSettings`` (same defaults), and both pipelines pass the compiled ones to ``train`` (which
    puts them in the workers' secretKeyRefs): a key name the task pods read but the workers do not
    would point the workers at another endpoint or at no credentials."""
    import dataclasses

    from pipelines.platform import PlatformSettings
    from pipelines.retraining import build_retraining_pipeline
    from pipelines.training import build_pipeline

    keys = [f for f in dataclasses.fields(PlatformSettings) if f.name.endswith("_key")]
    compile_time = [row for row in ts.rows("S") if not row.on("P")]
    assert [row.name for row in compile_time] == [f.name for f in keys]
    assert [row.default for row in compile_time] == [f.default for f in keys]

    platform = PlatformSettings(s3_secret="minio-creds", **{f.name: f"k-{f.name}" for f in keys})
    for where, build in (("pipelines/training.py", build_pipeline),
                         ("pipelines/retraining.py", build_retraining_pipeline)):
        wired = _train_task_inputs(_compiled(build(platform), tmp_path))
        for row in compile_time:
            assert wired.get(row.name) == {"runtimeValue": {"constant": getattr(platform, row.name)}}, (
                f"{where}: train input {row.name!r} is not the compile-time setting")


def test_run_options_and_the_cli_are_the_c_rows() -> None:
    import dataclasses

    from trainflow.local_run import RunOptions

    fields = {f.name: f for f in dataclasses.fields(RunOptions)}
    assert list(fields) == ["output_dir", *ts.names("C")]
    for row in ts.rows("C"):
        assert fields[row.name].default == row.default and fields[row.name].type is row.type, row.name
    out = subprocess.run([sys.executable, "-m", "trainflow.cli", "run", "--help"], capture_output=True,
                         text=True, timeout=120, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"}, check=True).stdout
    missing = [row.flag for row in ts.rows("C") if row.flag not in out]
    assert not missing, f"trainflow run --help lacks {missing}"


def test_run_options_send_every_pipeline_parameter(tmp_path) -> None:
    from trainflow.local_run import CLUSTER_ONLY, RunOptions

    cluster = RunOptions(backend="pytorchjob").pipeline_arguments(tmp_path)
    assert set(cluster) == set(ts.names("P"))
    local = RunOptions().pipeline_arguments(tmp_path)
    assert set(local) == set(ts.names("P")) - set(CLUSTER_ONLY) and local["max_workers"] == 1
    assert "s3_endpoint_url" in local  # the local steps and workers use it too
    assert local["checkpoint_uri"] == str(tmp_path / "checkpoints")


def test_the_stand_in_pipeline_of_the_airflow_tests_matches_the_form_rows() -> None:
    # It is defined inside a factory function: read its signature from the source.
    declared = _signature(_stand_in(), "tests/support/kfp_pipelines.py", skip={"step_s"})
    assert not _mismatches("tests/support/kfp_pipelines.py", declared, ts.rows("P"), exact=False,
                           default_exempt=FAST_DEFAULTS)


def _stand_in():
    import ast
    import pathlib

    import tests.support.kfp_pipelines as mod

    tree = ast.parse(pathlib.Path(mod.__file__).read_text())
    (node,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "training_pipeline"]
    params = [inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=ast.literal_eval(d),
                                annotation=ast.unparse(a.annotation))
              for a, d in zip(node.args.args, node.args.defaults, strict=True)]

    def func():
        pass

    func.__signature__ = inspect.Signature(params)
    return func
