"""The training spec (trainflow/common/training_spec.py): one table of the training parameters.

* TrainConfig: validation names the parameter in one line; the flat JSON and the flags round-trip;
  unknown names fail;
* the table: unique flat names, defaults that pass their own rows, the §3.3 defaults and the 0
  sentinels; TrainJobSpec.from_kwargs validates rows and cross-field rules;
* the Airflow form and ops settings are the P rows, split by ``ops``;
* docs/training-parameters.md is the generated table (kept current).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from components.training import config as flags
from trainflow.common import training_spec as ts

DOC = Path(__file__).resolve().parents[2] / "docs" / "training-parameters.md"


def _cfg(**kw) -> ts.TrainConfig:
    return ts.TrainConfig.from_flat({"dataset": "/d", "checkpoint_uri": "/c", "job_key": "k", **kw})


def test_json_round_trip_is_flat() -> None:
    cfg = _cfg(epochs=4, learning_rate=0.1, amp="bf16", checkpoint_uri="s3://b/p", job_key="a/b",
               checkpoint_interval_steps=5)
    flat = cfg.to_flat()
    assert set(flat) == set(ts.names("R"))  # one key per runtime row, no sections
    again = ts.TrainConfig.from_json(cfg.to_json())
    assert again == cfg and again.optim.learning_rate == 0.1 and again.checkpoint.interval_steps == 5
    assert again.checkpoint.uri == "s3://b/p" and flat["checkpoint_uri"] == "s3://b/p"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"epochs": 0}, "epochs must be >= 1, got 0"),
        ({"learning_rate": -1}, "learning_rate must be > 0, got -1.0"),
        ({"learning_rate": "fast"}, "learning_rate must be a number, got 'fast'"),
        ({"learning_rate": float("nan")}, "learning_rate must be a finite number, got nan"),
        ({"momentum": 1.5}, "momentum must be < 1, got 1.5"),
        ({"optimizer": "lion"}, "optimizer must be one of sgd, adamw, got 'lion'"),
        ({"model_name": "vgg"}, "model_name must be one of small_cnn, resnet18, wide_resnet101_2, got 'vgg'"),
        ({"global_batch_size": 0}, "global_batch_size must be >= 1, got 0"),
        ({"job_key": "../x"}, "job_key '../x' must be a relative key"),
        ({"keep_last_k": 0}, "keep_last_k must be >= 1, got 0"),
        ({"checkpoint_interval_s": -1}, "checkpoint_interval_s must be >= 0, got -1.0"),
        ({"fault_at_step": -1}, "fault_at_step must be >= 0, got -1"),
        ({"lr": 1}, "unknown training option(s) lr"),
        ({"epochs": 2.5}, "epochs must be an integer, got 2.5"),
        ({"deterministic": "maybe"}, "deterministic must be true or false, got 'maybe'"),
        ({"dataset": ""}, "dataset must not be empty (--dataset)"),
        ({"job_key": ""}, "job_key must not be empty (--job-key)"),
        ({"max_global_batch_size": 8}, "max_global_batch_size must be >= global_batch_size (64) or 0, got 8"),
    ],
)
def test_invalid_values_are_one_line_errors(override, message) -> None:
    with pytest.raises(ts.ConfigError) as info:
        _cfg(**override)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_section_built_directly_is_checked_like_flags() -> None:
    with pytest.raises(ts.ConfigError, match="learning_rate must be > 0"):
        ts.OptimConfig(learning_rate=0)
    assert ts.OptimConfig(learning_rate="0.5").learning_rate == 0.5  # coerced by the row


def test_flags_override_config_file(tmp_path) -> None:
    f = tmp_path / "c.json"
    f.write_text(_cfg(epochs=9).to_json())
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    cfg = flags.from_args(parser.parse_args(["--config", str(f), "--learning-rate", "0.2",
                                             "--checkpoint-interval-steps", "7", "--deterministic", "false",
                                             "--dataloader-num-workers", "2"]))
    assert (cfg.epochs, cfg.optim.learning_rate, cfg.checkpoint.interval_steps, cfg.deterministic,
            cfg.data.dataloader_num_workers) == (9, 0.2, 7, False, 2)


def test_every_runtime_row_is_a_flag() -> None:
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    options = {a for action in parser._actions for a in action.option_strings}
    assert {row.flag for row in ts.rows("R")} <= options


def test_missing_required_runtime_value() -> None:
    with pytest.raises(ts.ConfigError, match=r"checkpoint_uri must not be empty \(--checkpoint-uri\)"):
        ts.TrainConfig.from_flat({"dataset": "/d"})


def test_model_names_have_one_home() -> None:
    from components.training.model import MODEL_NAMES

    assert ts.MODELS == MODEL_NAMES


def test_the_table() -> None:
    assert len({row.name for row in ts.SPEC}) == len(ts.SPEC)
    for row in ts.SPEC:
        assert row.type in (bool, int, float, str), row.name
        assert row.surfaces and row.surfaces <= ts.SURFACES, row.name
        assert row.help, row.name
        if row.default is not None and row.name not in ("dataset",):
            assert row.check(row.default) == row.default, row.name  # every default passes its own row
        if row.on("P"):
            assert bool(row.section) != row.ops, f"{row.name}: a P row is a form field or an ops setting"


def test_the_settled_defaults_and_sentinels() -> None:
    """design-task-api.md §3.3: one default per parameter; 0 = off for optional counts."""
    defaults = {row.name: row.default for row in ts.SPEC}
    assert defaults["epochs"] == 8
    assert defaults["checkpoint_interval_steps"] == 20 and defaults["checkpoint_interval_s"] == 30.0
    assert defaults["fault_at_step"] == 0 and defaults["max_global_batch_size"] == 0
    for name in ("grad_clip_norm", "max_steps", "threads_per_rank", "max_local_batch_size"):
        assert defaults[name] == 0, name
    assert defaults["namespace"] == "" and defaults["learning_rate"] == 0.05 and defaults["max_workers"] == 1
    renamed = {"lr", "loader_workers", "workers", "batch_size", "min_accuracy_to_promote", "dataset_path"}
    assert not renamed & set(defaults)


def test_train_job_spec_validates_rows_and_cross_field_rules() -> None:
    spec = ts.TrainJobSpec.from_kwargs({"epochs": "3", "backend": "pytorchjob"}, dataset_path="/data")
    assert spec.epochs == 3 and spec.launch.backend == "pytorchjob" and spec.dataset_path == "/data"
    assert set(spec.values) == set(ts.names("S"))
    cfg = spec.train_config(dataset="/w", job_key="k", checkpoint_uri="/c")
    assert (cfg.epochs, cfg.data.path, cfg.checkpoint.interval_steps) == (3, "/w", 20)
    for kwargs, message in [({"min_workers": 3, "max_workers": 2}, "need min_workers <= max_workers, got 3..2"),
                            ({"backend": "slurm"}, "backend must be one of local, pytorchjob"),
                            ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
                            ({"adaptive_batch": True, "max_global_batch_size": 32},
                             "max_global_batch_size must be >= global_batch_size"),
                            ({"dataset_source": "mnist"}, "unknown training parameter(s) dataset_source")]:
        with pytest.raises(ts.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            ts.TrainJobSpec.from_kwargs(kwargs)


def test_runtime_rows_reach_the_workers_config_under_the_steps_own_paths() -> None:
    spec = ts.TrainJobSpec.build(epochs=2, runtime={"sample_log_dir": "s3://b/audit", "throttle_step_s": 0.1,
                                                    "checkpoint_uri": "/ignored"})
    cfg = spec.train_config(dataset="/w", job_key="k", checkpoint_uri="s3://b/ckpt")
    assert (cfg.sample_log_dir, cfg.throttle_step_s, cfg.checkpoint.uri) == ("s3://b/audit", 0.1, "s3://b/ckpt")
    assert spec.replace(epochs=3).runtime == spec.runtime
    with pytest.raises(ts.ConfigError, match=r"unknown training option\(s\) no_such_row"):
        ts.TrainJobSpec.build(runtime={"no_such_row": 1})
    with pytest.raises(ts.ConfigError, match="throttle_step_s must be >= 0"):
        ts.TrainJobSpec.build(runtime={"throttle_step_s": -1})


def test_form_and_ops_settings_are_the_pipeline_rows() -> None:
    form, ops = ts.form_fields(), ts.ops_settings()
    assert set(form) | set(ops) == set(ts.names("P")) and not set(form) & set(ops)
    assert [spec["section"] for spec in form.values()] == sorted(
        (spec["section"] for spec in form.values()), key=ts.FORM_SECTIONS.index)
    assert form["test_fraction"]["exclusiveMinimum"] == 0 and form["test_fraction"]["exclusiveMaximum"] == 1
    assert form["model_name"]["enum"] == list(ts.MODELS)
    assert form["fault_at_step"]["minimum"] == 0
    assert ops["backend"]["enum"] == list(ts.BACKENDS) and ops["job_key"]["variable"] is None
    assert all(spec["description"] for spec in (*form.values(), *ops.values()))


def test_the_parameters_doc_is_current() -> None:
    text = DOC.read_text()
    assert ts.markdown_table() in text, (
        "docs/training-parameters.md is stale: regenerate it with "
        "`.venv/bin/python -m trainflow.common.training_spec > docs/training-parameters.md`")


def test_worker_pod_settings_with_the_local_backend_are_refused_not_ignored() -> None:
    """Review (2026-11-29): a KFP run with gpus_per_worker=1 and the default backend (local) trained
    on the step pod's CPU with no word; worker_cpu/worker_memory/worker_pod_settings did nothing."""
    from trainflow.common.training_spec import ROWS, WORKER_POD_ROWS, ConfigError, TrainJobSpec

    with pytest.raises(ConfigError, match=r"^gpus_per_worker=1: it shapes the PyTorchJob's worker pods, but backend "
                                          r"'local' trains in this step's own process .*: set backend 'pytorchjob', "
                                          r"or leave it at the default$"):
        TrainJobSpec.from_kwargs({"gpus_per_worker": 1})
    with pytest.raises(ConfigError, match=r"^worker_cpu='4', worker_memory='16Gi': they shape"):
        TrainJobSpec.from_kwargs({"worker_cpu": "4", "worker_memory": "16Gi"})
    TrainJobSpec.from_kwargs({name: ROWS[name].default for name in WORKER_POD_ROWS})  # defaults: fine
    TrainJobSpec.from_kwargs({"worker_pod_settings": " {} ", "worker_cpu": " 1 "})  # asks for nothing either
    spec = TrainJobSpec.from_kwargs({"backend": "pytorchjob", "gpus_per_worker": 1, "image": "registry/trainflow:1",
                                     "checkpoint_uri": "s3://bucket/ckpt"})
    assert spec.gpus_per_worker == 1


def test_a_registered_model_name_the_registry_refuses_is_refused_before_any_run() -> None:
    """Review 2026-11-30: any non-empty name passed the row, and the registry refused it in the register
    step, after training. The pattern is the registry's own (one home) and reaches the Airflow form."""
    from components.registry.store import RegistryError, _validate_name

    row = ts.ROWS["registered_model_name"]
    with pytest.raises(ts.ConfigError, match=r"^registered_model_name must match .*got 'MNIST Classifier'$"):
        row.check("MNIST Classifier")
    with pytest.raises(RegistryError):
        _validate_name("MNIST Classifier")
    assert row.check("mnist-classifier") == "mnist-classifier"
    assert row.json_schema()["pattern"] == ts.MODEL_NAME_PATTERN
