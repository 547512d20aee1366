"""Pure parts of the train step's cluster backend (components/training/step.py)."""

from __future__ import annotations

import pytest

from components.training.step import PREEMPTION_GRACE_MARGIN_S, TrainStepError, worker_grace_period_s
from trainflow.common.training_spec import CheckpointConfig


def test_worker_grace_period_covers_the_sigterm_save() -> None:
    default_deadline = CheckpointConfig(uri="s3://b", job_key="k").preemption_save_deadline_s
    assert PREEMPTION_GRACE_MARGIN_S == 10
    assert worker_grace_period_s(None, default_deadline) == 30  # 20 s + 10 s: Kubernetes' default suffices
    assert worker_grace_period_s(None, 5) == 30  # never below Kubernetes' own default
    assert worker_grace_period_s(None, 45.2) == 56  # ceil(45.2) + 10
    assert worker_grace_period_s(120, 20) == 120  # the user's longer value stays
    assert worker_grace_period_s("soon", 20) == "soon"  # a wrong type is PyTorchJobSpec's to name


def test_a_grace_period_that_cuts_the_save_short_is_one_line() -> None:
    with pytest.raises(TrainStepError) as short:
        worker_grace_period_s(15, 20)
    assert str(short.value) == ("worker_pod_settings: termination_grace_period_s 15 is shorter than the SIGTERM "
                                "checkpoint needs: the save deadline (20 s) + 10 s = 30 s")
