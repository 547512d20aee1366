"""Resuming under another LR plan (more ``--epochs``/``--max-steps``, another warmup or schedule, or
another ``--learning-rate``) is allowed and said: the checkpoint's base learning rate is kept (its LR
schedule state carries it) and the schedule's new shape moves the learning rate at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.training.trainer import lr_plan_change

PLAN = {"learning_rate": 0.1, "total_steps": 100, "warmup_steps": 0, "lr_schedule": "cosine"}


def test_the_same_plan_or_none_stored_says_nothing() -> None:
    assert lr_plan_change(PLAN, dict(PLAN), 40) is None
    assert lr_plan_change(None, PLAN, 40) is None  # written before plans were stored


def test_more_steps_say_how_the_learning_rate_moves() -> None:
    said = lr_plan_change(PLAN, {**PLAN, "total_steps": 200}, 100)
    # the old plan ended at step 100 (cosine at 0); over 200 steps, step 100 is half way (0.05)
    assert said == "the LR schedule changed (total steps 100 -> 200): the learning rate goes from 0 to 0.05 at once"


def test_another_learning_rate_is_said_not_to_apply() -> None:
    said = lr_plan_change(PLAN, {**PLAN, "learning_rate": 0.2, "lr_schedule": "constant"}, 50)
    assert said == ("the LR schedule changed (schedule cosine -> constant): the learning rate goes from 0.05 to 0.1 "
                    "at once; --learning-rate 0.2 does not apply: the checkpoint's 0.1 is kept (its LR schedule "
                    "state carries it; start afresh under another --job-key to change it)")


@pytest.mark.slow
def test_a_resume_with_more_steps_warns_and_follows_the_new_schedule(digits_dataset, tmp_path: Path) -> None:
    """A lone worker trains 4 steps of a 4-step cosine plan, then resumes with ``--max-steps 8``."""
    metrics = tmp_path / "metrics.jsonl"

    def train(max_steps: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "components.training", "--dataset", str(digits_dataset), "--checkpoint-uri",
             str(tmp_path / "ckpt"), "--job-key", "plan", "--epochs", "1", "--global-batch-size", "32",
             "--threads-per-rank", "1", "--learning-rate", "0.1", "--lr-schedule", "cosine",
             "--max-steps", str(max_steps), "--metrics-path", str(metrics), "--log-every-steps", "1"],
            capture_output=True, text=True, timeout=240)

    first = train(4)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "LR schedule changed" not in first.stderr
    more = train(8)
    assert more.returncode == 0, more.stderr[-2000:]
    assert ("resuming step 4: the LR schedule changed (total steps 4 -> 8): the learning rate goes from 0 to 0.05 "
            "at once") in more.stderr
    lrs = {r["step"]: r["lr"] for r in map(json.loads, metrics.read_text().splitlines()) if "lr" in r}
    assert round(lrs[5], 6) == 0.05  # step 5 trains at the new plan's step-4 value, cos(pi/2)



@pytest.mark.slow
def test_the_rate_in_use_is_what_a_later_resume_compares_with(digits_dataset, tmp_path: Path) -> None:
    """Review finding: a checkpoint stored the command line's rate; after a resume with another rate
    (not applied), the next resume with the original rate was told its rate did not apply."""

    def train(rate: str, max_steps: int) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "components.training", "--dataset", str(digits_dataset), "--checkpoint-uri",
             str(tmp_path / "ckpt"), "--job-key", "rate", "--epochs", "1", "--global-batch-size", "32",
             "--threads-per-rank", "1", "--learning-rate", rate, "--lr-schedule", "constant",
             "--max-steps", str(max_steps)], capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stderr

    train("0.1", 2)
    assert "--learning-rate 0.2 does not apply: the checkpoint's 0.1 is kept" in train("0.2", 4)
    assert "does not apply" not in train("0.1", 6)
