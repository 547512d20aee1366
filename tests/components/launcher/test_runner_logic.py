"""Pure parts of the runner: reading the operator's conditions, settings validation, output JSON."""

from __future__ import annotations

import json

import pytest

from components.launcher.runner import JobOutcome, JobRef, RunnerSettings, terminal_condition


def job(*conditions: tuple[str, str, str]) -> dict:
    return {
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": f"PyTorchJob{t}", "message": f"{t} message"}
                for t, s, _ in conditions
            ]
        }
    }


def test_running_job_has_no_terminal_condition() -> None:
    assert terminal_condition({}) is None
    assert terminal_condition(job(("Created", "True", ""), ("Running", "True", ""))) is None


def test_succeeded_and_failed_are_terminal_with_reason_and_message() -> None:
    done = job(("Created", "True", ""), ("Running", "False", ""), ("Succeeded", "True", ""))
    assert terminal_condition(done) == ("Succeeded", "PyTorchJobSucceeded", "Succeeded message")
    failed = job(("Running", "False", ""), ("Failed", "True", ""))
    assert terminal_condition(failed) == ("Failed", "PyTorchJobFailed", "Failed message")


def test_a_false_terminal_condition_does_not_count() -> None:
    assert terminal_condition(job(("Failed", "False", ""), ("Restarting", "True", ""))) is None


@pytest.mark.parametrize(
    "kwargs",
    [{"poll_interval_s": 0}, {"timeout_s": -1}, {"cleanup": "sometimes"}, {"max_consecutive_errors": -1}],
)
def test_bad_settings_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RunnerSettings(**kwargs)


def test_outcome_json_names_the_resource() -> None:
    outcome = JobOutcome(JobRef("ns", "train-abc", "uid-1"), "Succeeded", "PyTorchJobSucceeded", "ok", True)
    data = json.loads(outcome.to_json())
    assert (data["namespace"], data["name"], data["uid"], data["state"]) == (
        "ns",
        "train-abc",
        "uid-1",
        "Succeeded",
    )
    assert str(outcome.ref) == "ns/train-abc"
