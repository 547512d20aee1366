"""events: run-state vocabulary and the one trigger payload (pure)."""

from __future__ import annotations

import pytest

from airflow_bridge.events import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    EventStatus,
    RunState,
    parse_payload,
    payload_for_problem,
    payload_for_run,
)


def test_every_api_state_is_either_terminal_or_active() -> None:
    assert set(RunState) == TERMINAL_STATES | ACTIVE_STATES
    assert not TERMINAL_STATES & ACTIVE_STATES
    assert RunState.CANCELED.is_terminal and not RunState.CANCELING.is_terminal  # kubeflow/pipelines#14473
    assert not RunState.PAUSED.is_terminal


def test_unknown_state_values_parse_as_unspecified() -> None:
    assert RunState.parse("succeeded") is RunState.SUCCEEDED
    assert RunState.parse(None) is RunState.RUNTIME_STATE_UNSPECIFIED
    assert RunState.parse("EXPLODED") is RunState.RUNTIME_STATE_UNSPECIFIED


@pytest.mark.parametrize(
    ("state", "status"),
    [("SUCCEEDED", "success"), ("FAILED", "failed"), ("CANCELED", "canceled"), ("SKIPPED", "skipped")],
)
def test_terminal_runs_map_to_one_status_each(state: str, status: str) -> None:
    run = {"run_id": "r1", "state": state, "error": {"message": "boom"} if state == "FAILED" else None}
    payload = payload_for_run(run, url="http://ui/#/runs/details/r1")
    assert payload["status"] == status and payload["state"] == state and payload["run_id"] == "r1"
    assert parse_payload(dict(payload)) == payload
    if state == "FAILED":
        assert payload["message"] == "boom"


def test_failed_run_without_error_gets_a_sentence() -> None:
    payload = payload_for_run({"run_id": "r2", "state": "CANCELED"}, url="u")
    assert payload["message"] == "KFP run r2 ended in state CANCELED"


def test_non_terminal_run_has_no_payload() -> None:
    with pytest.raises(ValueError, match="not in a terminal state"):
        payload_for_run({"run_id": "r", "state": "RUNNING"}, url="u")


def test_problem_payloads_and_validation() -> None:
    timeout = payload_for_problem(
        EventStatus.TIMEOUT, run_id="r", message="late", url="u", state=RunState.RUNNING
    )
    assert timeout == {"status": "timeout", "run_id": "r", "state": "RUNNING", "message": "late", "url": "u"}
    with pytest.raises(ValueError, match="timeout or error"):
        payload_for_problem(EventStatus.SUCCESS, run_id="r", message="", url="u")
    with pytest.raises(ValueError, match="lacks"):
        parse_payload({"status": "success"})
    with pytest.raises(ValueError, match="unknown status 'great'"):
        parse_payload({"status": "great", "run_id": "r", "state": None, "message": "", "url": ""})
