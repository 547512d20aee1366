"""events: run-state vocabulary, the one trigger payload and the progress lines of the task log (pure)."""

from __future__ import annotations

import json

import pytest

from airflow_bridge.events import (
    ACTIVE_STATES,
    OUTPUTS_PLUGIN,
    PROGRESS_PLUGIN,
    TERMINAL_STATES,
    EventStatus,
    RunProgress,
    RunState,
    asset_event_extra,
    parse_payload,
    payload_for_problem,
    payload_for_run,
    progress_lines,
    run_outputs,
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


@pytest.mark.parametrize(
    ("run", "canceling_seen", "status"),
    [
        # KFP 2.14 reports a terminated run FAILED; a read of it said CANCELING
        ({"state": "FAILED"}, True, "canceled"),
        # ... or the persistence agent reported the Workflow while it was terminating
        ({"state": "FAILED", "state_history": [{"state": "RUNNING"}, {"state": "CANCELING"}, {"state": "FAILED"}]},
         False, "canceled"),
        # ... or Argo's message for a stopped Workflow
        ({"state": "FAILED", "error": {"message": "Stopped with strategy 'Terminate'"}}, False, "canceled"),
        ({"state": "FAILED", "run_details": {"task_details": [
            {"display_name": "train", "error": {"message": "Stopped with strategy 'Stop'"}}]}}, False, "canceled"),
        # a real failure, and a step's own deadline (reads like KFP's terminate, but is a timeout)
        ({"state": "FAILED", "error": {"message": "Task 'train' failed with ValueError: boom"}}, False, "failed"),
        ({"state": "FAILED", "error": {"message": "Step exceeded its deadline"}}, False, "failed"),
        ({"state": "SUCCEEDED"}, True, "success"),  # the terminate raced with the run's end
        ({"state": "CANCELED"}, False, "canceled"),
    ],
)
def test_a_failed_run_that_was_terminated_is_canceled(run: dict, canceling_seen: bool, status: str) -> None:
    payload = payload_for_run({"run_id": "r1", **run}, url="u", canceling_seen=canceling_seen)
    assert payload["status"] == status
    assert payload["state"] == run["state"]  # the state stays as KFP reports it
    if status == "canceled" and run["state"] == "FAILED":
        assert payload["message"].startswith("KFP run r1 was terminated (KFP reports a terminated run FAILED)")


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


def _run(state: str, tasks: dict[str, str], training: dict | None = None) -> dict:
    run = {
        "run_id": "r1",
        "state": state,
        "run_details": {"task_details": [{"display_name": n, "state": s} for n, s in tasks.items()]},
    }
    if training is not None:
        entries = {k: {"value": v} for k, v in training.items()}
        run["plugins_output"] = {PROGRESS_PLUGIN: {"entries": entries, "state": "PLUGIN_RUNNING"}}
    return run


def test_progress_lines_report_what_changed() -> None:
    first = RunProgress.of(_run("RUNNING", {"prepare-dataset": "RUNNING"}))
    assert progress_lines("r1", None, first) == ["KFP run r1 is RUNNING", "KFP task prepare-dataset: RUNNING"]
    assert progress_lines("r1", first, first) == []  # nothing new, nothing logged
    second = RunProgress.of(
        _run(
            "RUNNING",
            {"prepare-dataset": "SUCCEEDED", "train": "RUNNING"},
            {"step": 120, "total_steps": 500, "epoch": 1, "loss": 0.53125, "samples_per_s": 812.4, "world_size": 2},
        )
    )
    assert progress_lines("r1", first, second) == [
        "KFP task prepare-dataset: SUCCEEDED",
        "KFP task train: RUNNING",
        "training: step 120/500, epoch 1, loss 0.5312, 812 samples/s, world size 2",
    ]
    done = RunProgress.of(_run("SUCCEEDED", {"prepare-dataset": "SUCCEEDED", "train": "SUCCEEDED"},
                               {"step": 500, "total_steps": 500, "loss": 0.1}))
    assert progress_lines("r1", second, done) == [
        "KFP run r1 is SUCCEEDED",
        "KFP task train: SUCCEEDED",
        "training: step 500/500, loss 0.1000",
    ]


def test_the_read_where_the_run_ends_names_the_tasks_kfp_still_lists_unfinished() -> None:
    """Real KFP can report a run SUCCEEDED while a task still reads RUNNING (docs/airflow.md, "task
    states lag the run's end"): the log says so once, instead of leaving RUNNING as the last word."""
    running = RunProgress.of(_run("RUNNING", {"prepare": "SUCCEEDED", "add": "RUNNING"}))
    ended = RunProgress.of(_run("SUCCEEDED", {"prepare": "SUCCEEDED", "add": "RUNNING", "skip": "PENDING"}))
    assert progress_lines("r1", running, ended) == [
        "KFP run r1 is SUCCEEDED",
        "KFP task skip: PENDING",
        "KFP run r1 ended SUCCEEDED while KFP still lists these tasks as unfinished (its task states can "
        "lag the run's): add (RUNNING), skip (PENDING)",
    ]
    assert progress_lines("r1", ended, ended) == []  # said once
    assert progress_lines("r1", None, ended)[-1].startswith("KFP run r1 ended SUCCEEDED")
    settled = RunProgress.of(_run("SUCCEEDED", {"prepare": "SUCCEEDED", "add": "SUCCEEDED"}))
    assert progress_lines("r1", running, settled) == ["KFP run r1 is SUCCEEDED", "KFP task add: SUCCEEDED"]


def test_a_run_without_details_or_plugin_has_only_its_state() -> None:
    progress = RunProgress.of({"run_id": "r", "state": "PENDING"})
    assert progress == RunProgress(RunState.PENDING)
    assert progress_lines("r", None, progress) == ["KFP run r is PENDING"]


def test_asset_event_extra_carries_the_run_and_its_pipeline_outputs() -> None:
    verdict = {"uri": "file:///r/verdict", "metadata": {"decision": "drift", "listing_fingerprint": "ab12"}}
    run = {
        "run_id": "r1",
        "display_name": "retrain [af-1]",
        "state": "SUCCEEDED",
        "plugins_output": {
            PROGRESS_PLUGIN: {"entries": {"step": {"value": 9}}},
            OUTPUTS_PLUGIN: {
                "entries": {"model_version": {"value": 2}, "test_accuracy": {"value": 0.91},
                            "verdict": {"value": verdict}, "torn": {"no": "value"}},
                "state": "PLUGIN_SUCCEEDED",
            },
        },
    }
    assert run_outputs(run) == {"model_version": 2, "test_accuracy": 0.91, "verdict": verdict}
    assert asset_event_extra(run, url="http://kfp/#/runs/details/r1") == {
        "kfp_run_id": "r1",
        "kfp_run_url": "http://kfp/#/runs/details/r1",
        "kfp_run_state": "SUCCEEDED",
        "kfp_run_name": "retrain [af-1]",
        "outputs": {"model_version": 2, "test_accuracy": 0.91, "verdict": verdict},
    }
    json.dumps(asset_event_extra(run, url="u"))  # Airflow stores extra as JSON
    bare = asset_event_extra({"run_id": "r2", "state": "SUCCEEDED"}, url="u")  # a KFP without the plugin
    assert bare["outputs"] == {} and bare["kfp_run_id"] == "r2" and bare["kfp_run_name"] == ""


def test_plugin_names_match_the_local_server() -> None:
    from trainflow.kfp_server import app

    assert (PROGRESS_PLUGIN, OUTPUTS_PLUGIN) == (app.PROGRESS_PLUGIN, app.OUTPUTS_PLUGIN)
