"""Pure pieces of the local KFP server: spec parsing and parameter coercion, filters, paging,
failure messages from kfp.local logs. No server, no kfp execution."""

from __future__ import annotations

import base64
import json
import time

import pytest

from trainflow.kfp_server import execute, spec
from trainflow.kfp_server.app import KfpServer
from trainflow.kfp_server.errors import ApiError, GrpcCode
from trainflow.kfp_server.filters import matches, parse_filter
from trainflow.kfp_server.runner import set_state
from trainflow.kfp_server.store import FILTER_KEYS, Store

SPEC = {
    "pipelineInfo": {"name": "p"},
    "root": {
        "inputDefinitions": {
            "parameters": {
                "n": {"parameterType": "NUMBER_INTEGER", "defaultValue": 1.0, "isOptional": True},
                "lr": {"parameterType": "NUMBER_DOUBLE"},
                "name": {"parameterType": "STRING", "defaultValue": "x"},
                "flag": {"parameterType": "BOOLEAN", "defaultValue": False},
                "items": {"parameterType": "LIST", "defaultValue": []},
            }
        }
    },
}


def test_coerce_converts_json_numbers_to_declared_types() -> None:
    out = spec.coerce_parameters(SPEC, {"n": 3.0, "lr": 1, "flag": "true", "items": "[1, 2]"})
    assert out == {"n": 3, "lr": 1.0, "flag": True, "items": [1, 2]}
    assert isinstance(out["n"], int) and isinstance(out["lr"], float)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"lr": 0.1, "nope": 1}, "unknown pipeline parameter(s) nope"),
        ({}, "missing required pipeline parameter(s): lr"),
        ({"lr": 0.1, "n": 2.5}, "parameter 'n' expects NUMBER_INTEGER, got 2.5"),
        ({"lr": "fast"}, "parameter 'lr' expects NUMBER_DOUBLE"),
        ({"lr": 0.1, "name": 5}, "parameter 'name' expects STRING"),
    ],
)
def test_coerce_rejects_bad_parameters_with_one_line(values: dict, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        spec.coerce_parameters(SPEC, values)
    assert info.value.code is GrpcCode.INVALID_ARGUMENT and info.value.http_status == 400
    assert fragment in info.value.message and "\n" not in info.value.message


def test_multi_document_yaml_splits_into_spec_and_platform() -> None:
    text = "pipelineInfo: {name: p}\nroot: {}\n---\nplatforms:\n  kubernetes: {deploymentSpec: {}}\n"
    pipeline, platform = spec.parse_package_text(text)
    assert pipeline["pipelineInfo"]["name"] == "p"
    assert platform == {"platforms": {"kubernetes": {"deploymentSpec": {}}}}
    assert spec.unwrap_run_spec({"pipeline_spec": pipeline, "platform_spec": platform}) == (
        pipeline,
        platform,
    )


def test_non_pipeline_yaml_is_refused() -> None:
    with pytest.raises(ApiError, match="no 'pipelineInfo'"):
        spec.parse_package_text("components: {}\n")


def test_filter_accepts_numeric_operations_and_camel_case() -> None:
    text = json.dumps({"predicates": [{"key": "display_name", "operation": 1, "stringValue": "a"}]})
    preds = parse_filter(text)
    assert [(p.key, p.operation, p.value) for p in preds] == [("display_name", "EQUALS", "a")]


def test_filter_operations_select_the_right_objects() -> None:
    runs = [
        {"display_name": "train [af-1]", "state": "RUNNING", "created_at": "2026-11-22T08:00:00Z"},
        {"display_name": "train [af-2]", "state": "FAILED", "created_at": "2026-11-22T09:00:00Z"},
    ]
    keys = FILTER_KEYS["runs"]

    def select(pred: dict) -> list[str]:
        preds = parse_filter(json.dumps({"predicates": [pred]}))
        return [r["display_name"] for r in runs if matches(r, preds, keys)]

    assert select({"key": "name", "operation": "IS_SUBSTRING", "string_value": "[af-2]"}) == ["train [af-2]"]
    assert select(
        {"key": "state", "operation": "IN", "string_values": {"values": ["RUNNING", "PENDING"]}}
    ) == ["train [af-1]"]
    assert select(
        {"key": "created_at", "operation": "GREATER_THAN", "timestamp_value": "2026-11-22T08:30:00Z"}
    ) == ["train [af-2]"]
    assert select({"key": "state", "operation": "NOT_EQUALS", "string_value": "RUNNING"}) == ["train [af-2]"]


def test_filter_on_unknown_key_is_an_invalid_argument() -> None:
    preds = parse_filter(
        json.dumps({"predicates": [{"key": "colour", "operation": "EQUALS", "string_value": "x"}]})
    )
    with pytest.raises(ApiError, match="cannot filter on 'colour'"):
        matches({}, preds, FILTER_KEYS["runs"])


def test_store_pages_sorts_and_persists(tmp_path) -> None:
    store = Store(tmp_path / "state.json")
    for i in range(5):
        store.put(
            "runs",
            f"r{i}",
            {"run_id": f"r{i}", "display_name": f"n{i}", "created_at": "2026-01-01T00:00:00Z"},
        )
    page1, total, token = store.list("runs", id_field="run_id", page_size=2, sort_by="created_at desc")
    page2, _, token2 = store.list(
        "runs", id_field="run_id", page_size=2, page_token=token, sort_by="created_at desc"
    )
    page3, _, token3 = store.list(
        "runs", id_field="run_id", page_size=2, page_token=token2, sort_by="created_at desc"
    )
    assert total == 5 and token3 == ""
    assert [r["run_id"] for r in page1 + page2 + page3] == ["r4", "r3", "r2", "r1", "r0"]
    reloaded = Store(tmp_path / "state.json")
    assert reloaded.get("runs", "r3", label="Run")["display_name"] == "n3"
    with pytest.raises(ApiError, match="invalid page_token"):
        store.list("runs", id_field="run_id", page_token="garbage!")



def _ids(page: list[dict]) -> list[str]:
    return [o["run_id"] for o in page]


def test_store_pages_neither_repeat_nor_skip_while_objects_come_and_go(tmp_path) -> None:
    """A page token is a keyset (KFP's list.go token: the last row's sort value and key), not an
    offset: objects created or deleted between two page reads shift nothing."""
    store = Store(tmp_path / "state.json")

    def put(i: int) -> None:
        store.put("runs", f"r{i}", {"run_id": f"r{i}", "created_at": "2026-01-01T00:00:00Z"})

    def page(token: str = "", sort_by: str = "created_at desc") -> tuple[list[str], str]:
        items, _, next_token = store.list("runs", id_field="run_id", page_size=2, sort_by=sort_by,
                                          page_token=token)
        return _ids(items), next_token

    for i in range(5):
        put(i)
    first, token = page()
    assert first == ["r4", "r3"]
    put(5)  # the newest: it belongs before the first page, not on the next one
    second, token = page(token)
    assert second == ["r2", "r1"]  # an offset gave ["r3", "r2"]: r3 twice
    store.delete("runs", "r4", label="Run")
    store.delete("runs", "r1", label="Run")  # the last object listed: the token does not need it
    third, token = page(token)
    assert (third, token) == (["r0"], "")

    ascending, token = page(sort_by="created_at")
    assert ascending == ["r0", "r2"]
    store.delete("runs", "r0", label="Run")
    put(6)  # last in this order: it turns up on a later page, once
    rest = []
    while token:
        items, token = page(token, sort_by="display_name desc")  # ignored: the token's order wins, as in KFP
        rest += items
    assert rest == ["r3", "r5", "r6"]  # an offset skipped r3


def test_page_size_is_capped_at_200_and_bad_page_tokens_are_refused(tmp_path) -> None:
    store = Store()
    for i in range(250):
        store.put("runs", f"r{i:03}", {"run_id": f"r{i:03}", "created_at": "2026-01-01T00:00:00Z"})
    first, total, token = store.list("runs", id_field="run_id", page_size=1000)
    assert (len(first), total) == (200, 250) and token
    second, _, token = store.list("runs", id_field="run_id", page_size=1000, page_token=token)
    assert _ids(second) == [f"r{i:03}" for i in range(200, 250)] and token == ""
    assert len(store.list("runs", id_field="run_id")[0]) == 20
    with pytest.raises(ApiError, match=r"The page size should be greater than 0\. Got -1"):
        store.list("runs", id_field="run_id", page_size=-1)
    encode = lambda obj: base64.urlsafe_b64encode(json.dumps(obj).encode()).decode()  # noqa: E731
    keyset = {"sort_by": "created_at", "desc": False, "value": "2026-01-01T00:00:00Z", "seq": 3, "id": "r003"}
    assert _ids(store.list("runs", id_field="run_id", page_size=1, page_token=encode(keyset))[0]) == ["r004"]
    for garbage in ("garbage!", encode({"offset": 20}), encode([1]), encode({**keyset, "sort_by": "secret"}),
                    encode({**keyset, "seq": "3"}), encode({**keyset, "value": 7})):
        with pytest.raises(ApiError, match="invalid page_token") as err:
            store.list("runs", id_field="run_id", page_token=garbage)
        assert err.value.code == GrpcCode.INVALID_ARGUMENT


def test_a_recurring_run_disabled_by_an_archive_while_firing_starts_no_run(tmp_path) -> None:
    """The scheduler picks the enabled recurring runs, then creates their runs: an archive of the
    experiment in between (it disables them) wins, as the check and the run's creation are one step."""
    server = KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    try:
        experiment = server.create_experiment({"display_name": "soon archived"})
        exp_id = experiment["experiment_id"]
        job = server.create_recurring_run({
            "display_name": "every second", "max_concurrency": "1", "mode": "ENABLE", "experiment_id": exp_id,
            "trigger": {"periodic_schedule": {"interval_second": "1"}},
            "pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}},
        })
        find, archived = server.store.find, []

        def archive_after_the_pick(kind, predicate):
            found = find(kind, predicate)
            if kind == "recurring_runs" and not archived:
                archived.append(server.archive_experiment(exp_id))
            return found

        server.store.find = archive_after_the_pick
        assert server.fire_due_recurring_runs(time.time() + 5) == [] and archived
        server.store.find = find
        assert server.store.find("runs", lambda r: r["experiment_id"] == exp_id) == []
        stored = server.store.get("recurring_runs", job["recurring_run_id"], label="RecurringRun")
        assert (stored["mode"], stored["status"]) == ("DISABLE", "DISABLED")
    finally:
        server.close()


LOG = """\
08:22:01.021 - INFO - Executing task \x1b[96m'boom'\x1b[0m
    Traceback (most recent call last):
      File "/x/executor_main.py", line 109, in <module>
        executor_main()
      File "/tmp/ephemeral_component.py", line 3, in boom
        raise ValueError(msg)
    ValueError: bad data in shard 7

08:22:03.810 - ERROR - Task \x1b[96m'boom'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m
"""


def test_failure_message_names_the_task_and_its_exception(tmp_path) -> None:
    events = tmp_path / "events.jsonl"
    with events.open("w") as ev, (tmp_path / "out.log").open("w") as out:
        tee = execute._TaskEventTee(out, ev)
        tee.write(LOG)
    assert tee.failed_task == "boom"
    message = execute.failure_message(
        "Pipeline \x1b[95m'p'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m. Inner task failed: "
        "\x1b[96m'boom'\x1b[0m.",
        tee.task_lines,
        tee.failed_task,
    )
    assert message == (
        "Pipeline 'p' finished with status FAILURE. Inner task failed: 'boom'. "
        "Task 'boom' failed with ValueError: bad data in shard 7"
    )
    states = [json.loads(line)["state"] for line in events.read_text().splitlines()]
    assert states == ["RUNNING", "FAILED"]


def test_last_exception_line_is_none_without_traceback() -> None:
    assert execute.last_exception_line(["all good", "ValueError-looking text"]) is None


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--data-dir", "/proc/no-such-dir"], "trainflow: cannot use --data-dir /proc/no-such-dir"),
        (["--data-dir", "{bad_state}"], "is not a kfp-server state file"),
        # valid JSON, but no object: an AttributeError traceback before (review 2026-11-30)
        (["--data-dir", "{list_state}"], "is not a kfp-server state file (a JSON list, not an object)"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args: list[str], expected: str) -> None:
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "state.json").write_text("{oops")
    (tmp_path / "listed").mkdir()
    (tmp_path / "listed" / "state.json").write_text("[]")
    args = [a.replace("{list_state}", str(tmp_path / "listed")) for a in args]
    argv = [a.replace("{bad_state}", str(tmp_path)) for a in args]
    cli = str(Path(sys.executable).with_name("trainflow"))
    done = subprocess.run(
        [cli, "kfp-server", "--port", "1", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert expected in done.stderr and "Traceback" not in done.stderr


def test_training_progress_reads_the_last_step_from_the_end_of_the_file(tmp_path) -> None:
    import json

    from trainflow.kfp_server.runner import training_progress

    path = tmp_path / "train-metrics.jsonl"
    assert training_progress(path) is None  # no file yet
    lines = [{"event": "start", "world_size": 2, "total_steps": 5000}]
    lines += [{"step": s, "epoch": s // 100, "loss": 1 / s, "samples_per_s": 900.0, "world_size": 2, "lr": 0.1}
              for s in range(1, 1001)]  # ~100 KB: the start event is outside the tail window
    lines.append({"event": "checkpoint", "step": 1000, "stall_s": 0.01})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 1001, "lo')  # torn last line
    assert path.stat().st_size > 64 * 1024
    assert training_progress(path) == {
        "step": 1000, "total_steps": 5000, "epoch": 10, "loss": 0.001, "samples_per_s": 900.0, "world_size": 2
    }
    path.write_text(json.dumps({"event": "start", "total_steps": 9}) + "\n")
    assert training_progress(path) is None  # started, no step yet


# -- recurring-run schedules (robfig/cron v1, as KFP's API server and controller read them) ----------


def _utc(*args: int):
    from datetime import UTC, datetime

    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cron", "fires", "quiet"),
    [
        ("*/15 * * * * *", _utc(2026, 1, 1, 0, 0, 45), _utc(2026, 1, 1, 0, 0, 44)),  # seconds first
        ("0 30 9 * * mon-fri", _utc(2026, 11, 27, 9, 30), _utc(2026, 11, 28, 9, 30)),  # a Friday, a Saturday
        ("0 0 12 * *", _utc(2026, 2, 3, 12), _utc(2026, 2, 3, 12, 1)),  # five fields: sec..month, any weekday
        ("0 0 0 1 JAN ?", _utc(2027, 1, 1), _utc(2027, 2, 1)),
        ("0 0 0 13 * 5", _utc(2026, 11, 27), _utc(2026, 11, 26)),  # dom and dow both set: either matches
        ("@hourly", _utc(2026, 1, 1, 7), _utc(2026, 1, 1, 7, 0, 1)),
    ],
)
def test_cron_fires_on_the_seconds_robfig_cron_would(cron: str, fires, quiet) -> None:
    from trainflow.kfp_server.schedule import parse_cron

    parsed = parse_cron(cron)
    assert parsed.matches(fires) and not parsed.matches(quiet)


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("", "Empty spec string"),
        ("* * * *", "Expected 5 to 6 fields, found 4"),
        ("61 * * * * *", "End of range (61) above maximum (59)"),
        ("*/0 * * * * *", "Step of range should be a positive number"),
        ("x * * * * *", "Failed to parse int from x"),
        ("@fortnightly", "Unrecognized descriptor"),
    ],
)
def test_a_bad_cron_is_invalid_argument_with_the_real_servers_words(cron: str, message: str) -> None:
    from trainflow.kfp_server.schedule import parse_trigger

    with pytest.raises(ApiError) as err:
        parse_trigger({"cron_schedule": {"cron": cron}})
    assert err.value.code == GrpcCode.INVALID_ARGUMENT
    assert "Schedule cron is not a supported format" in err.value.message and message in err.value.message


def test_periodic_and_every_schedules_fire_an_interval_after_the_last_run() -> None:
    from trainflow.kfp_server.schedule import due, parse_cron, parse_trigger

    periodic = parse_trigger({"periodic_schedule": {"interval_second": "10"}})
    assert not due(periodic, since=100, now=109, last_fired=None, created=100)
    assert due(periodic, since=109, now=110, last_fired=None, created=100)
    assert not due(periodic, since=110, now=115, last_fired=110, created=100)
    assert parse_cron("@every 1m30s").every_s == 90
    with pytest.raises(ApiError, match="least 1 second"):
        parse_trigger({"periodic_schedule": {"interval_second": "0"}})


def test_a_cron_fires_once_for_the_seconds_since_the_last_check_and_not_outside_its_window() -> None:
    from trainflow.kfp_server.schedule import due, parse_trigger

    at = _utc(2026, 1, 1, 0, 0, 30).timestamp()
    every_30 = parse_trigger({"cron_schedule": {"cron": "*/30 * * * * *"}})
    assert due(every_30, since=at - 1, now=at, last_fired=None, created=0)
    assert not due(every_30, since=at, now=at + 29, last_fired=None, created=0)
    ended = parse_trigger({"cron_schedule": {"cron": "*/30 * * * * *", "end_time": "2026-01-01T00:00:10Z"}})
    assert not due(ended, since=at - 1, now=at, last_fired=None, created=0)
    later = parse_trigger({"cron_schedule": {"cron": "*/30 * * * * *", "start_time": "2026-01-01T00:01:00Z"}})
    assert not due(later, since=at - 1, now=at, last_fired=None, created=0)


def test_a_terminate_racing_with_the_runs_end_never_overwrites_it(tmp_path) -> None:
    """KFP's TerminateRun is one conditional UPDATE (run_store.go): a run that finishes between the
    request and the write stays finished, and the terminate is refused as for any finished run."""
    server = KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    try:
        experiment = server.default_experiment("")
        server.store.put("runs", "r1", {"run_id": "r1", "experiment_id": experiment["experiment_id"],
                                        "display_name": "x", "state": "RUNNING", "state_history": [],
                                        "created_at": "2026-01-01T00:00:00Z"})
        update = server.store.update

        def finishing_first(kind, object_id, change, **kwargs):
            if kind == "runs":  # the run's supervisor writes its end just before the terminate's write
                update(kind, object_id, lambda r: set_state(r, "SUCCEEDED"), **kwargs)
            return update(kind, object_id, change, **kwargs)

        server.store.update = finishing_first
        with pytest.raises(ApiError, match="it is SUCCEEDED, not PENDING, RUNNING or PAUSED"):
            server.terminate_run("r1")
        server.terminate_run("r1", strict=False)  # quietly nothing
        server.store.update = update
        run = server.store.get("runs", "r1", label="Run")
        assert run["state"] == "SUCCEEDED" and [h["state"] for h in run["state_history"]] == ["SUCCEEDED"]
    finally:
        server.close()


def test_a_terminate_between_a_runs_creation_and_its_start_stops_it(tmp_path) -> None:
    """Review 2026-11-30: create_run stores the run, then submits it. A terminate in between (the run
    id is already listed) found no run in the executor and was lost: the run went CANCELING, then
    RUNNING again and ran to its end. Now it stops as it is submitted, and never goes RUNNING."""
    server = KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    try:
        submit = server.executor.submit

        def terminated_first(run_id, spec, params, **kw):
            server.terminate_run(run_id)
            submit(run_id, spec, params, **kw)

        server.executor.submit = terminated_first
        run = server.create_run({"display_name": "x", "pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}}})
        server.executor.wait(run["run_id"], 30)
        stored = server.store.get("runs", run["run_id"], label="Run")
        assert stored["state"] == "CANCELED", stored
        assert "RUNNING" not in [h["state"] for h in stored["state_history"]], stored["state_history"]
    finally:
        server.close()


def test_a_run_the_executor_cannot_start_fails_instead_of_staying_pending(tmp_path) -> None:
    server = KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    try:
        def unwritable(run_id, spec, params, **kw):
            raise OSError(28, "No space left on device")

        server.executor.submit = unwritable
        with pytest.raises(ApiError) as failed:
            server.create_run({"display_name": "x", "pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}}})
        assert failed.value.http_status == 500
        assert str(failed.value) == "kfp-server could not start the run: [Errno 28] No space left on device"
        (stored,) = server.store.find("runs", lambda r: True)
        assert (stored["state"], stored["error"]["message"]) == (
            "FAILED", "kfp-server could not start the run: [Errno 28] No space left on device")
    finally:
        server.close()


def test_a_finished_run_is_never_moved_back() -> None:
    run = {"run_id": "r", "state": "RUNNING"}
    set_state(run, "FAILED", error_message="boom")
    set_state(run, "CANCELED")  # e.g. the executor's cleanup after a terminate that came too late
    assert run["state"] == "FAILED" and [h["state"] for h in run["state_history"]] == ["FAILED"]


def test_a_periodic_recurring_run_does_not_fire_again_because_the_server_restarted(tmp_path) -> None:
    """The last firing survives a restart (the newest run of the recurring run), so a daily retraining
    that ran an hour ago is not launched once more by every restart."""
    now_s = 1_900_000_000.0
    stamp = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    store = Store(tmp_path / "state.json")
    store.put("recurring_runs", "daily", {
        "recurring_run_id": "daily", "display_name": "retrain", "status": "ENABLED", "max_concurrency": "1",
        "trigger": {"periodic_schedule": {"interval_second": "86400"}}, "created_at": stamp(now_s - 3 * 86400),
    })
    store.put("runs", "r-old", {"run_id": "r-old", "recurring_run_id": "daily", "state": "SUCCEEDED",
                                "created_at": stamp(now_s - 3600)})
    server = KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    fired: list[dict] = []
    server.create_run = lambda body, recurring_run_id=None: fired.append(body) or {"run_id": f"r{len(fired)}"}
    try:
        assert server.fire_due_recurring_runs(now_s) == [] and not fired  # ran an hour ago
        assert server.fire_due_recurring_runs(now_s + 86400 - 3600) == ["r1"]  # a day after that run
    finally:
        server.close()


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path) -> None:
    """It would fail the first one's live runs as orphans and overwrite its state file."""
    first = KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    try:
        with pytest.raises(ValueError, match=rf"^--data-dir {tmp_path} is in use by another kfp-server \(pid \d+\)"):
            KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1)
    finally:
        first.close()
    KfpServer(tmp_path, max_concurrent_runs=1, auth_token=None, terminate_grace_s=1).close()  # free again
