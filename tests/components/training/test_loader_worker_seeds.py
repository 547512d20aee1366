"""With ``--dataloader-num-workers`` > 0 a task's random collate (augmentation, masking) resumes
bit-exact (review finding: its draws restarted from the DataLoader workers' base seeds whenever a
resume built a new loader). In process, one rank; the draw rule itself is in test_data.py."""

from __future__ import annotations

import torch

from components.training.distributed import DistEnv
from components.training.trainer import Trainer
from tests.trainflow.example_tasks import Regression
from trainflow.common.training_spec import TrainConfig


class NoisyRegression(Regression):
    """Regression whose collate adds random noise to the inputs (an augmentation from torch's generator)."""

    def collate(self, samples):
        x, y = super().collate(samples)
        return x + 0.1 * torch.randn(x.shape), y


def _train(tmp_path, *, key: str, max_steps: int) -> Trainer:
    # 40 samples / 8: 5 steps an epoch; a constant schedule, so the longer plan of the resume moves no LR
    cfg = TrainConfig.from_flat({"checkpoint_uri": str(tmp_path / "ckpt"), "job_key": key, "threads_per_rank": 1,
                                 "task": f"{__name__}:NoisyRegression", "task_args": '{"num_samples": 40}',
                                 "global_batch_size": 8, "epochs": 1, "lr_schedule": "constant",
                                 "max_steps": max_steps, "dataloader_num_workers": 2})
    trainer = Trainer(cfg, DistEnv.from_env({}))
    trainer.train()
    return trainer


def test_a_random_collate_in_loader_workers_resumes_bit_exact(tmp_path, torch_globals) -> None:
    straight = _train(tmp_path, key="straight", max_steps=5)
    _train(tmp_path, key="resumed", max_steps=2)
    resumed = _train(tmp_path, key="resumed", max_steps=5)
    assert resumed.resumed_from == 2
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
