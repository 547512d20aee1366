"""The trainer with a task other than the built-in one, in process (one rank): the task and
task_args parameters, what a checkpoint and an exported model record, and the one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch

from components.training.distributed import DistEnv
from components.training.evaluation import evaluate_task, task_of
from components.training.step import TrainStepError, preflight
from components.training.trainer import Trainer
from trainflow.common.training_spec import ConfigError, TrainConfig

REGRESSION = "tests.trainflow.example_tasks:Regression"


def _cfg(tmp_path, **flat) -> TrainConfig:
    return TrainConfig.from_flat({"checkpoint_uri": str(tmp_path / "ckpt"), "job_key": "j", "threads_per_rank": 1,
                                  "global_batch_size": 8, "epochs": 2, **flat})


@pytest.mark.parametrize(("flat", "message"), [
    ({"task": REGRESSION, "task_args": "[1]"}, "task_args must be a JSON object, got list"),
    ({"task": REGRESSION, "task_args": "{"}, "task_args is not valid JSON"),
    ({"dataset": "digits", "task_args": '{"dataset": "mnist"}'},
     "task_args: the image_classification task takes dataset from the --dataset parameter, not task_args"),
    ({"task": ""}, "task must not be empty"),
    ({}, "dataset must not be empty (--dataset)"),
])
def test_bad_task_parameters_are_one_line(tmp_path, flat, message) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, **flat)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_builtin_task_args_come_from_dataset_and_model_name(tmp_path) -> None:
    cfg = _cfg(tmp_path, dataset="digits", model_name="resnet18", task_args='{"eval_split": "train"}')
    assert cfg.task_kwargs() == {"dataset": "digits", "model_name": "resnet18", "eval_split": "train"}
    user = _cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 40}')  # no dataset needed
    assert user.task_kwargs() == {"num_samples": 40}


def test_a_user_task_trains_checkpoints_and_exports(tmp_path, torch_globals) -> None:
    cfg = _cfg(tmp_path, task="tests.trainflow.example_tasks:Counting", task_args='{"num_samples": 36}',
               model_output=str(tmp_path / "model"), metrics_path=str(tmp_path / "m.jsonl"))
    trainer = Trainer(cfg, DistEnv.from_env({}))
    result = trainer.train()
    assert result.steps == 10 and result.epochs_completed == 2  # 36 samples / 8: 5 steps per epoch
    assert trainer.task.calls == 0  # Counting's counter is its own; the trainer only saves it
    loaded = trainer.ckpt.load_latest()
    assert loaded is not None and loaded.state["task_state"] == {"calls": 0}
    assert (loaded.manifest["task"], loaded.manifest["num_samples"]) == (cfg.model.task, 36)
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["task_args"] == {"num_samples": 36} and "model" not in meta
    assert task_of(tmp_path / "model") == (cfg.model.task, {"num_samples": 36})
    assert evaluate_task(tmp_path / "model") == {}  # Regression has no eval_dataset
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 10 and losses[-1] < losses[0]


def test_another_data_size_under_the_same_job_key_is_refused(tmp_path, torch_globals) -> None:
    first = Trainer(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 16}'), DistEnv.from_env({}))
    first.train()
    again = Trainer(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 24}', epochs=4), DistEnv.from_env({}))
    with pytest.raises(ConfigError, match=r"written for another training set of 16 \(this run: 24\)"):
        again.train()
    again.ckpt.close()


def test_a_task_schedule_with_adaptive_batch_is_refused(tmp_path, torch_globals) -> None:
    with pytest.raises(ConfigError, match="brings its own learning-rate schedule") as info:
        Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:WithSchedule", adaptive_batch=True),
                DistEnv.from_env({}))
    assert "\n" not in str(info.value)
    trainer = Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:WithSchedule"), DistEnv.from_env({}))
    assert isinstance(trainer.scheduler, torch.optim.lr_scheduler.StepLR)  # without adaptive batch: the task's
    trainer.ckpt.close()


def test_a_loss_that_is_not_a_scalar_is_refused(tmp_path, torch_globals) -> None:
    trainer = Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:VectorLoss"), DistEnv.from_env({}))
    with pytest.raises(ConfigError, match=r"loss must return a scalar tensor \(the batch mean\), got Tensor of shape \(8,\)"):
        trainer.train()
    trainer.ckpt.close()


def test_preflight_builds_the_task_first(tmp_path) -> None:
    with pytest.raises(TrainStepError, match=r"cannot import module 'no_such_pkg\.tasks'"):
        preflight(_cfg(tmp_path, task="no_such_pkg.tasks:X"))
    with pytest.raises(TrainStepError, match="global_batch_size 8 exceeds the 4 training samples of task"):
        preflight(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 4}'))
    assert preflight(_cfg(tmp_path, task=REGRESSION)) is None
