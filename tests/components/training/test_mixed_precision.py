"""fp16 loss scaling: a step the grad scaler skips (inf/NaN gradients) leaves the LR schedule where
it is, so overflow steps do not eat the warmup (Hugging Face Accelerate's rule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from components.training.trainer import step_optimizer

REPO = Path(__file__).resolve().parents[3]

TASK_CODE = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

from trainflow.task import Task


class OverflowFirst(Task):
    """A linear fit whose first ``overflow_steps`` losses are infinite (an fp16 overflow)."""

    def __init__(self, overflow_steps=2):
        g = torch.Generator().manual_seed(0)
        x = 0.01 * torch.randn(64, 4, generator=g)  # small: no overflow but the forced ones
        self.data = TensorDataset(x, x.sum(1))
        self.overflow_steps, self.calls = overflow_steps, 0

    def build_model(self):
        return nn.Linear(4, 1)

    def train_dataset(self):
        return self.data

    def loss(self, model, batch):
        x, y = batch
        self.calls += 1
        mean = nn.functional.mse_loss(model(x).squeeze(1).float(), y)
        return mean * float("inf") if self.calls <= self.overflow_steps else mean
'''


def test_a_skipped_step_is_reported_and_changes_nothing() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before = [p.detach().clone() for p in model.parameters()]
    (scaler.scale(model(torch.ones(2, 3)).sum() * float("inf"))).backward()
    assert step_optimizer(scaler, optimizer) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**9  # backed off
    optimizer.zero_grad()
    scaler.scale(model(torch.ones(2, 3)).sum()).backward()
    assert step_optimizer(scaler, optimizer) is True
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    off = torch.amp.GradScaler("cpu", enabled=False)
    model(torch.ones(2, 3)).sum().backward()
    assert step_optimizer(off, optimizer) is True


@pytest.mark.slow
def test_overflow_steps_do_not_advance_the_warmup(tmp_path: Path) -> None:
    """A lone worker, ``--amp fp16``, warmup of 4 steps; the task's first two losses overflow. The LR
    each step used (the metrics record's ``lr``) stays at the first warmup value until a step is
    taken, then climbs; torch does not warn that the schedule stepped before the optimizer."""
    (tmp_path / "user" / "fp16_pkg").mkdir(parents=True)
    (tmp_path / "user" / "fp16_pkg" / "__init__.py").write_text(TASK_CODE)
    metrics = tmp_path / "metrics.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "user"), str(REPO)])}
    run = subprocess.run(
        [sys.executable, "-m", "components.training", "--task", "fp16_pkg:OverflowFirst", "--amp", "fp16",
         "--learning-rate", "0.4", "--warmup-steps", "4", "--lr-schedule", "constant", "--max-steps", "6",
         "--global-batch-size", "8", "--checkpoint-uri", str(tmp_path / "ckpt"), "--job-key", "fp16",
         "--metrics-path", str(metrics), "--log-every-steps", "1", "--threads-per-rank", "1",
         "--checkpoint-interval-steps", "100"],
        capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in steps if "lr" in r}
    assert [round(lrs[s], 6) for s in range(1, 7)] == [0.1, 0.1, 0.1, 0.2, 0.3, 0.4], lrs
    assert "lr_scheduler.step()` before `optimizer.step()`" not in run.stderr
