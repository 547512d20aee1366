"""A resume under another ``--seed`` keeps the checkpoint's seed, and says so (review finding): the
epoch's sample order is ``epoch_permutation(N, seed, epoch)`` with a global position in it, so a run
stopped mid-epoch under seed A and resumed under seed B trained ``permB[pos:]`` after ``permA[:pos]``,
some samples twice and as many not at all in that epoch, silently. In process, one rank."""

from __future__ import annotations

import logging

import torch

from components.training.data import epoch_permutation
from components.training.distributed import DistEnv
from components.training.metrics import read_jsonl
from components.training.trainer import Trainer
from trainflow.common.training_spec import TrainConfig

REGRESSION = "tests.trainflow.example_tasks:Regression"


def _train(tmp_path, *, key: str, seed: int, max_steps: int, log_dir: str) -> Trainer:
    # 40 samples / 8: 5 steps an epoch; a constant schedule, so that the longer plan of the resume
    # moves no learning rate and the resumed run can equal the uninterrupted one bit for bit
    cfg = TrainConfig.from_flat({"checkpoint_uri": str(tmp_path / "ckpt"), "job_key": key, "threads_per_rank": 1,
                                 "task": REGRESSION, "task_args": '{"num_samples": 40}', "global_batch_size": 8,
                                 "epochs": 1, "lr_schedule": "constant", "seed": seed, "max_steps": max_steps,
                                 "sample_log_dir": str(tmp_path / log_dir)})
    trainer = Trainer(cfg, DistEnv.from_env({}))
    trainer.train()
    return trainer


def _ids_by_step(folder) -> dict[int, list[int]]:
    return {r["step"]: r["ids"] for path in sorted(folder.iterdir()) for r in read_jsonl(path)}


def test_a_resume_under_another_seed_keeps_the_checkpoints_data_order(tmp_path, torch_globals, caplog) -> None:
    _train(tmp_path, key="edited", seed=1, max_steps=2, log_dir="first")  # saved at step 2 of 5: mid-epoch
    with caplog.at_level(logging.WARNING, logger="trainflow.trainer"):
        resumed = _train(tmp_path, key="edited", seed=2, max_steps=5, log_dir="resumed")
    assert resumed.resumed_from == 2
    ids = {**_ids_by_step(tmp_path / "first"), **_ids_by_step(tmp_path / "resumed")}
    assert sorted(ids) == [1, 2, 3, 4, 5]
    trained = [i for step in sorted(ids) for i in ids[step]]
    assert trained == epoch_permutation(40, 1, 0).tolist()  # seed 1's order, every sample once
    assert ("resuming step 2: --seed 2 does not apply: the checkpoint's seed 1 is kept (its data order and random "
            "streams follow it; start afresh under another --job-key to change it)") in caplog.messages
    latest = resumed.ckpt.load_latest()
    assert latest is not None and latest.state["train_state"]["seed"] == 1  # and a later resume keeps it too

    straight = _train(tmp_path, key="straight", seed=1, max_steps=5, log_dir="straight")
    for name, value in straight.model.state_dict().items():  # the uninterrupted seed-1 run, bit for bit
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_the_same_seed_resumes_without_a_word(tmp_path, torch_globals, caplog) -> None:
    _train(tmp_path, key="same", seed=3, max_steps=2, log_dir="first")
    with caplog.at_level(logging.WARNING, logger="trainflow.trainer"):
        resumed = _train(tmp_path, key="same", seed=3, max_steps=4, log_dir="resumed")
    assert resumed.resumed_from == 2 and resumed.seed == 3
    assert not [m for m in caplog.messages if "--seed" in m]
