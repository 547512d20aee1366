"""An epoch's short last global batch over more ranks than it has pairs of samples, through real
torchrun agents (gloo on CPU): ResNet-18's BatchNorm on digits' 8x8 images (a 1x1 map in its last
stage) refuses a batch of one sample, which an even split handed to a rank and which crashed the
job at the same step after every restart (torchrun's restarts spent, exit 1)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

#: digits' 1,438 training samples in global batches of 287: six steps, the last of 3 samples, which
#: an even split over 2 ranks gave as 2 + 1.
GLOBAL_BATCH = 287


def test_a_last_batch_of_three_over_two_ranks_trains_with_batchnorm(digits_dataset, make_job) -> None:
    job = make_job(digits_dataset, "short-last", "--model-name", "resnet18", "--epochs", "1",
                   "--global-batch-size", str(GLOBAL_BATCH), "--checkpoint-interval-steps", "0")
    agent = job.agent({"max_restarts": 0})
    assert agent.wait(600) == 0, (job.root / "agent.log").read_text()[-3000:]
    steps = sorted({r["step"] for r in job.records() if "loss" in r})
    assert steps == [1, 2, 3, 4, 5, 6]
