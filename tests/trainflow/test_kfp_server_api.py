"""The local KFP API server against real clients: ``kfp.Client``, the ``kfp-server-api`` models, httpx.

Covers: run lifecycle (PENDING -> RUNNING -> SUCCEEDED/FAILED/CANCELED) with kfp.local executing
compiled pipelines; terminate stopping the run's processes; pipelines/versions upload and runs by
version reference; experiments; list filters, sorting and paging; multi-document (kfp-kubernetes)
YAML; bad input; bearer-token auth; restart after a crash; the concurrency limit. Every JSON body
is checked key-by-key against the ``kfp-server-api`` models (the real API's generated client).
Skips nothing; needs no network.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import kfp_server_api
import psutil
import pytest
import yaml

from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer, assert_shape, start_kfp_server

API = "/apis/v2beta1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"}

pytestmark = pytest.mark.slow


class _Response:
    def __init__(self, data: Any) -> None:
        self.data = json.dumps(data)


def deserialize(data: Any, type_name: str) -> Any:
    return kfp_server_api.ApiClient().deserialize(_Response(data), type_name)


def wait_state(client: httpx.Client, run_id: str, states: set[str], timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        run = client.get(f"{API}/runs/{run_id}").raise_for_status().json()
        if run["state"] in states:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run['state']} after {timeout_s} s"
        time.sleep(0.3)


@pytest.fixture()
def http(kfp_server: KfpServer) -> httpx.Client:
    with httpx.Client(base_url=kfp_server.url, timeout=30) as client:
        yield client


def spec_of(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_healthz_matches_the_model(http: httpx.Client) -> None:
    body = http.get(f"{API}/healthz").json()
    assert_shape(body, "V2beta1GetHealthzResponse")
    assert body["multi_user"] is False


def test_kfp_client_runs_a_compiled_pipeline_to_success(
    kfp_server: KfpServer, compiled_pipelines, http
) -> None:
    import kfp

    client = kfp.Client(host=kfp_server.url)
    result = client.create_run_from_pipeline_package(
        str(compiled_pipelines["tiny"]), arguments={"a": 5, "b": 7}, run_name="tiny by kfp.Client"
    )
    run = client.wait_for_run_completion(result.run_id, timeout=180, sleep_duration=1)
    assert run.state == "SUCCEEDED"
    assert run.error is None
    states = [h.state for h in run.state_history]
    assert states == ["PENDING", "RUNNING", "SUCCEEDED"]
    tasks = {t.display_name: t.state for t in run.run_details.task_details}
    assert tasks == {"add": "SUCCEEDED", "add-2": "SUCCEEDED"}
    raw = http.get(f"{API}/runs/{result.run_id}").json()
    assert_shape(raw, "V2beta1Run")
    assert raw["runtime_config"]["parameters"] == {"a": 5, "b": 7}
    # the pipeline's return value, as plugin output (the Airflow bridge puts it on asset events)
    assert raw["plugins_output"]["trainflow-outputs"]["entries"] == {"Output": {"value": 22}}
    assert raw["experiment_id"] == client.get_experiment(experiment_name="Default").experiment_id
    assert "adding 12 + 10" in http.get(f"/local/runs/{result.run_id}/log").text


def test_a_training_run_reports_the_trainers_last_step_as_plugin_output(
    http: httpx.Client, compiled_pipelines
) -> None:
    """The stand-in training pipeline writes per-step records where the real train step does
    (``$TRAINFLOW_LOG_DIR/train-metrics.jsonl``); GET run carries the last one as KFP plugin output."""
    body = {
        "display_name": "progress",
        "pipeline_spec": spec_of(compiled_pipelines["training_pipeline"]),
        "runtime_config": {"parameters": {"epochs": 3, "step_s": 0.2}},
    }
    run_id = http.post(f"{API}/runs", json=body).raise_for_status().json()["run_id"]
    done = wait_state(http, run_id, TERMINAL)
    assert done["state"] == "SUCCEEDED", done
    assert_shape(done, "V2beta1Run")
    deserialize(done, "V2beta1Run")
    plugin = done["plugins_output"]["trainflow"]
    assert plugin["state"] == "PLUGIN_SUCCEEDED"
    assert {k: v["value"] for k, v in plugin["entries"].items()} == {
        "step": 3, "total_steps": 3, "epoch": 2, "loss": pytest.approx(1 / 3), "samples_per_s": 100.0,
        "world_size": 1,
    }


def test_a_runs_local_pipeline_root_is_honoured_and_a_remote_one_refused(
        http: httpx.Client, compiled_pipelines, tmp_path: Path) -> None:
    """Review 2026-11-30: the server reported the client's runtime_config.pipeline_root on the run
    while kfp.local wrote every artifact into the run's own folder."""
    root = tmp_path / "artifacts"
    body = {"display_name": "rooted", "pipeline_spec": spec_of(compiled_pipelines["tiny"]),
            "runtime_config": {"parameters": {"a": 1, "b": 2}, "pipeline_root": str(root)}}
    created = http.post(f"{API}/runs", json=body).raise_for_status().json()
    assert created["runtime_config"]["pipeline_root"] == str(root)
    run = wait_state(http, created["run_id"], TERMINAL)
    assert run["state"] == "SUCCEEDED", run.get("error")
    assert any(p.is_file() for p in root.rglob("*")), "no artifact under the run's pipeline root"
    for remote in ("s3://bucket/root", "minio://mlpipeline/v2/artifacts", "relative/root"):
        refused = http.post(f"{API}/runs", json={**body, "runtime_config": {"pipeline_root": remote}})
        assert refused.status_code == 400 and refused.json()["code"] == 3, refused.text
        assert refused.json()["message"].startswith(f"Invalid input error: pipeline_root {remote!r}: this local KFP")


def test_failed_run_carries_the_component_error(http: httpx.Client, compiled_pipelines) -> None:
    body = {"display_name": "failing", "pipeline_spec": spec_of(compiled_pipelines["failing"])}
    created = http.post(f"{API}/runs", json=body).raise_for_status().json()
    assert_shape(created, "V2beta1Run")
    assert created["state"] == "PENDING"
    run = wait_state(http, created["run_id"], TERMINAL)
    assert run["state"] == "FAILED"
    assert_shape(run, "V2beta1Run")
    assert f"ValueError: {FAILURE_MESSAGE}" in run["error"]["message"]
    assert "Inner task failed: 'fail-with'" in run["error"]["message"]
    assert [t["state"] for t in run["run_details"]["task_details"]] == ["FAILED"]
    deserialize(run, "V2beta1Run")


def test_terminate_stops_every_process_of_the_run(http: httpx.Client, compiled_pipelines) -> None:
    run_id, m = _start_and_read_log(http, compiled_pipelines["slow"], r"sleeper pid (\d+) pgid (\d+)")
    sleeper_pid, pgid = int(m.group(1)), int(m.group(2))
    assert psutil.pid_exists(sleeper_pid)
    assert http.get(f"{API}/runs/{run_id}").json()["state"] == "RUNNING"

    assert http.post(f"{API}/runs/{run_id}:terminate").raise_for_status().json() == {}
    run = wait_state(http, run_id, TERMINAL, timeout_s=30)
    assert run["state"] == "CANCELED"
    assert [h["state"] for h in run["state_history"]][-2:] == ["CANCELING", "CANCELED"]
    assert not _alive_in_group(pgid), "processes of the run survived terminate"
    assert not _alive(sleeper_pid)
    # a finished run cannot be terminated: INVALID_ARGUMENT, as KFP 2.14 answers ("Row not found")
    again = http.post(f"{API}/runs/{run_id}:terminate")
    assert again.status_code == 400 and again.json()["code"] == 3, again.text


def test_terminate_stops_processes_of_the_run_in_sessions_of_their_own(http: httpx.Client, compiled_pipelines) -> None:
    """torchrun starts its agent and workers in sessions of their own, outside the run's process
    group: terminating the run stops them too (they are its process tree when it is terminated)."""
    run_id, m = _start_and_read_log(http, compiled_pipelines["detached"],
                                    r"session child pid (\d+) sid (\d+); step pgid (\d+)")
    child_pid, sid, pgid = (int(g) for g in m.groups())
    assert sid == child_pid and os.getpgid(child_pid) != pgid and _alive(child_pid)  # outside the run's group
    assert http.post(f"{API}/runs/{run_id}:terminate").raise_for_status().json() == {}
    run = wait_state(http, run_id, TERMINAL, timeout_s=60)
    assert run["state"] == "CANCELED"
    assert not _alive(child_pid), "a process of the run in a session of its own survived terminate"


def _start_and_read_log(http: httpx.Client, package, pattern: str) -> tuple[str, re.Match]:
    """Start a run of ``package`` (its ``seconds`` parameter 300) and wait up to 120 s for ``pattern``
    in its log; return the run id and the match."""
    body = {"display_name": package.stem, "pipeline_spec": spec_of(package),
            "runtime_config": {"parameters": {"seconds": 300}}}
    run_id = http.post(f"{API}/runs", json=body).raise_for_status().json()["run_id"]
    deadline = time.monotonic() + 120
    while not (m := re.search(pattern, http.get(f"/local/runs/{run_id}/log").text)):
        assert time.monotonic() < deadline, f"{pattern!r} never appeared in the run's log"
        time.sleep(0.3)
    return run_id, m


def _alive(pid: int) -> bool:
    """True for a running process (a zombie waiting to be reaped has already stopped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive_in_group(pgid: int) -> list[int]:
    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and _alive(proc.pid):
                alive.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return alive


def test_upload_pipeline_and_version_then_run_by_reference(
    kfp_server: KfpServer, compiled_pipelines, http
) -> None:
    config = kfp_server_api.Configuration(host=kfp_server.url)
    client = kfp_server_api.ApiClient(config)
    uploads = kfp_server_api.PipelineUploadServiceApi(client)
    pipeline = uploads.upload_pipeline(str(compiled_pipelines["tiny"]), name="tiny-uploaded", description="d")
    version = uploads.upload_pipeline_version(
        str(compiled_pipelines["tiny"]), name="v2", pipelineid=pipeline.pipeline_id
    )
    assert version.pipeline_id == pipeline.pipeline_id

    pipelines_api = kfp_server_api.PipelineServiceApi(client)
    listed = pipelines_api.pipeline_service_list_pipeline_versions(pipeline.pipeline_id)
    assert sorted(v.name for v in listed.pipeline_versions) == ["tiny-uploaded", "v2"]
    assert (
        pipelines_api.pipeline_service_get_pipeline_by_name("tiny-uploaded").pipeline_id
        == pipeline.pipeline_id
    )
    raw_version = http.get(
        f"{API}/pipelines/{pipeline.pipeline_id}/versions/{version.pipeline_version_id}"
    ).json()
    assert_shape(raw_version, "V2beta1PipelineVersion")
    assert raw_version["pipeline_spec"]["pipelineInfo"]["name"] == "tiny"

    runs_api = kfp_server_api.RunServiceApi(client)
    run = runs_api.run_service_create_run(
        kfp_server_api.V2beta1Run(
            display_name="by reference",
            pipeline_version_reference=kfp_server_api.V2beta1PipelineVersionReference(
                pipeline_id=pipeline.pipeline_id, pipeline_version_id=version.pipeline_version_id
            ),
            runtime_config=kfp_server_api.V2beta1RuntimeConfig(parameters={"a": 1}),
        )
    )
    assert run.pipeline_version_reference.pipeline_version_id == version.pipeline_version_id
    assert wait_state(http, run.run_id, TERMINAL)["state"] == "SUCCEEDED"
    # a second upload under the same name is a conflict, as in the real API
    response = http.post(
        f"{API}/pipelines/upload",
        params={"name": "tiny-uploaded"},
        files={"uploadfile": ("tiny.yaml", compiled_pipelines["tiny"].read_bytes())},
    )
    assert response.status_code == 409
    # KFP's upload routes answer errors as v1beta1's Error, not google.rpc.Status
    assert set(response.json()) == {"error_message", "error_details"}
    assert "tiny-uploaded already exists" in response.json()["error_message"]


def test_multi_document_platform_yaml_runs(http: httpx.Client, compiled_pipelines) -> None:
    text = compiled_pipelines["platform"].read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert len(docs) == 2, "kfp-kubernetes should have written a platform document"
    body = {
        "display_name": "platform",
        "pipeline_spec": {"pipeline_spec": docs[0], "platform_spec": docs[1]},
        "runtime_config": {"parameters": {"a": 41}},
    }
    run = http.post(f"{API}/runs", json=body).raise_for_status().json()
    assert "platform_spec" in run["pipeline_spec"]
    assert wait_state(http, run["run_id"], TERMINAL)["state"] == "SUCCEEDED"


def test_experiments_create_conflict_filter_and_namespace(http: httpx.Client) -> None:
    created = http.post(f"{API}/experiments", json={"display_name": "exp-a", "namespace": "team-a"}).json()
    assert_shape(created, "V2beta1Experiment")
    again = http.post(f"{API}/experiments", json={"display_name": "exp-a", "namespace": "team-a"})
    assert again.status_code == 409 and "already exists" in again.json()["message"]
    http.post(f"{API}/experiments", json={"display_name": "exp-a", "namespace": "team-b"}).raise_for_status()
    flt = json.dumps(
        {"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": "exp-a"}]}
    )
    listed = http.get(f"{API}/experiments", params={"filter": flt, "namespace": "team-a"}).json()
    assert_shape(listed, "V2beta1ListExperimentsResponse")
    assert [e["experiment_id"] for e in listed["experiments"]] == [created["experiment_id"]]


def test_list_runs_filters_sorts_and_pages(http: httpx.Client, compiled_pipelines) -> None:
    spec = spec_of(compiled_pipelines["tiny"])
    ids = [
        http.post(f"{API}/runs", json={"display_name": f"paging {i} [af-page]", "pipeline_spec": spec})
        .raise_for_status()
        .json()["run_id"]
        for i in range(3)
    ]
    flt = json.dumps(
        {"predicates": [{"key": "display_name", "operation": "IS_SUBSTRING", "string_value": "[af-page]"}]}
    )
    first = http.get(
        f"{API}/runs", params={"filter": flt, "page_size": 2, "sort_by": "created_at desc"}
    ).json()
    assert_shape(first, "V2beta1ListRunsResponse")
    assert first["total_size"] == 3 and first["next_page_token"]
    second = http.get(
        f"{API}/runs",
        params={
            "filter": flt,
            "page_size": 2,
            "sort_by": "created_at desc",
            "page_token": first["next_page_token"],
        },
    ).json()
    assert [r["run_id"] for r in first["runs"] + second["runs"]] == ids[::-1]
    assert second["next_page_token"] == ""
    for run_id in ids:
        wait_state(http, run_id, TERMINAL)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"display_name": "x"}, 400, "needs pipeline_spec or pipeline_version_reference"),
        ({"pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}}}, 400, "display_name is empty"),
        ({"display_name": "x", "pipeline_spec": {"components": {}}}, 400, "no 'pipelineInfo'"),
        (
            {"display_name": "x", "pipeline_version_reference": {"pipeline_version_id": "nope"}},
            404,
            "nope not found",
        ),
        (
            {
                "display_name": "x",
                "experiment_id": "missing",
                "pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}},
            },
            404,
            "Experiment missing not found",
        ),
    ],
)
def test_bad_run_requests_get_a_google_rpc_status(
    http: httpx.Client, body: dict, status: int, fragment: str
) -> None:
    response = http.post(f"{API}/runs", json=body)
    assert response.status_code == status
    assert_shape({k: v for k, v in response.json().items() if k != "error"}, "GoogleRpcStatus")
    assert fragment in response.json()["message"]


def test_unknown_parameter_and_bad_filter_are_refused(http: httpx.Client, compiled_pipelines) -> None:
    body = {
        "display_name": "x",
        "pipeline_spec": spec_of(compiled_pipelines["tiny"]),
        "runtime_config": {"parameters": {"c": 1}},
    }
    response = http.post(f"{API}/runs", json=body)
    assert response.status_code == 400
    assert response.json()["message"] == (
        "Invalid input error: unknown pipeline parameter(s) c; the pipeline declares: a, b"
    )
    assert http.get(f"{API}/runs", params={"filter": "{not json"}).status_code == 400
    assert http.get(f"{API}/runs/does-not-exist").status_code == 404


def test_every_error_has_the_real_servers_shape(http: httpx.Client) -> None:
    """Review 2026-11-30: FastAPI's own 404/405 ({"detail": ...}) and plain-text 500s (a string
    cron_schedule, a long_value that is no number) reached clients that read KFP's
    {code, message, details}. Routing errors as grpc-gateway v2 maps them."""
    answers = [
        (http.get(f"{API}/no-such-collection"), 404, 5, "Not Found"),
        (http.put(f"{API}/healthz"), 501, 12, "Method Not Allowed"),
        (http.get(f"{API}/runs", params={"filter": json.dumps({"predicates": [
            {"key": "created_at", "operation": "GREATER_THAN", "long_value": "soon"}]})}), 400, 3,
         "filter predicate's long_value is not an integer"),
        (http.post(f"{API}/recurringruns", json={
            "display_name": "x", "mode": "ENABLE", "max_concurrency": "1", "trigger": {"cron_schedule": "0 0 * * * *"},
            "pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}}}), 400, 3,
         "trigger.cron_schedule must be an object with a cron field, got '0 0 * * * *'"),
        (http.post(f"{API}/recurringruns", json={
            "display_name": "x", "mode": "ENABLE", "max_concurrency": "1", "trigger": {"periodic_schedule": 60},
            "pipeline_spec": {"pipelineInfo": {"name": "p"}, "root": {}}}), 400, 3,
         "trigger.periodic_schedule must be an object with interval_second, got 60"),
    ]
    for response, status, code, fragment in answers:
        assert response.status_code == status, response.text
        body = response.json()
        assert body["code"] == code and fragment in body["message"] and body["details"] == [], body
        assert_shape({k: v for k, v in body.items() if k != "error"}, "GoogleRpcStatus")


def test_bearer_token_is_required_when_configured(tmp_path: Path) -> None:
    server = start_kfp_server(tmp_path, token="s3cret", name="kfp-auth")
    try:
        url = f"{server.url}{API}/healthz"
        missing = httpx.get(url)
        assert missing.status_code == 401 and missing.json()["code"] == 16
        wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403 and wrong.json()["code"] == 7
        assert httpx.get(url, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    finally:
        server.process.stop()


def test_runs_die_with_a_killed_server_and_are_failed_on_restart(tmp_path: Path, compiled_pipelines) -> None:
    server = start_kfp_server(tmp_path, name="kfp-crash")
    body = {
        "display_name": "orphan",
        "pipeline_spec": spec_of(compiled_pipelines["slow"]),
        "runtime_config": {"parameters": {"seconds": 300}},
    }
    run_id = httpx.post(f"{server.url}{API}/runs", json=body).raise_for_status().json()["run_id"]
    log_path = server.data_dir / "runs" / run_id / "run.log"
    deadline = time.monotonic() + 120
    while not (m := re.search(r"sleeper pid (\d+)", log_path.read_text() if log_path.exists() else "")):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    sleeper = int(m.group(1))
    server.process.signal(signal.SIGKILL)
    server.process.proc.wait(10)
    deadline = time.monotonic() + 15
    while _alive(sleeper):
        assert time.monotonic() < deadline, "the run outlived its server"
        time.sleep(0.2)

    restarted = start_kfp_server(tmp_path, name="kfp-crash")  # same data dir
    try:
        run = httpx.get(f"{restarted.url}{API}/runs/{run_id}").json()
        assert run["state"] == "FAILED"
        assert run["error"]["message"] == "kfp-server restarted while the run was active"
    finally:
        restarted.process.stop()


def test_runs_beyond_the_limit_wait_in_pending(tmp_path: Path, compiled_pipelines) -> None:
    server = start_kfp_server(tmp_path, max_concurrent_runs=1, name="kfp-one")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            body = {
                "display_name": "hog",
                "pipeline_spec": spec_of(compiled_pipelines["slow"]),
                "runtime_config": {"parameters": {"seconds": 300}},
            }
            first = http.post(f"{API}/runs", json=body).json()["run_id"]
            second = http.post(f"{API}/runs", json={**body, "display_name": "queued"}).json()["run_id"]
            wait_state(http, first, {"RUNNING"})
            time.sleep(2)
            assert http.get(f"{API}/runs/{second}").json()["state"] == "PENDING"
            http.post(f"{API}/runs/{second}:terminate")
            assert wait_state(http, second, TERMINAL, timeout_s=30)["state"] == "CANCELED"
            http.post(f"{API}/runs/{first}:terminate")
            assert wait_state(http, first, TERMINAL, timeout_s=30)["state"] == "CANCELED"
    finally:
        server.process.stop()


def test_a_recurring_run_keeps_max_concurrency_and_survives_a_restart(tmp_path: Path, compiled_pipelines) -> None:
    """A periodic recurring run (every second) of a 300 s pipeline with ``max_concurrency`` 1 has
    exactly one run active: the other firing times are skipped, not queued. After a restart the
    recurring run is still there, DISABLED as it was left (its active run was stopped with the server)."""
    server = start_kfp_server(tmp_path, name="kfp-recurring")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            body = {
                "display_name": "every second", "max_concurrency": "1", "mode": "ENABLE",
                "trigger": {"periodic_schedule": {"interval_second": "1"}},
                "pipeline_spec": spec_of(compiled_pipelines["slow"]), "runtime_config": {"parameters": {"seconds": 300}},
            }
            job = http.post(f"{API}/recurringruns", json=body).raise_for_status().json()
            assert_shape(job, "V2beta1RecurringRun")
            assert (job["max_concurrency"], job["trigger"]["periodic_schedule"]["interval_second"]) == ("1", "1")
            time.sleep(6)
            runs = http.get(f"{API}/runs", params={"experiment_id": job["experiment_id"]}).json()["runs"]
            assert len(runs) == 1 and runs[0]["recurring_run_id"] == job["recurring_run_id"], runs
            assert runs[0]["display_name"].startswith("every second-")
            http.post(f"{API}/recurringruns/{job['recurring_run_id']}:disable").raise_for_status()
    finally:
        server.process.stop()
    server = start_kfp_server(tmp_path, name="kfp-recurring")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            again = http.get(f"{API}/recurringruns/{job['recurring_run_id']}").raise_for_status().json()
            assert again["status"] == "DISABLED" and again["display_name"] == "every second"
            assert http.get(f"{API}/runs/{runs[0]['run_id']}").json()["state"] == "CANCELED"  # stopped with the server
            http.delete(f"{API}/recurringruns/{job['recurring_run_id']}").raise_for_status()
            assert http.get(f"{API}/recurringruns/{job['recurring_run_id']}").status_code == 404
    finally:
        server.process.stop()


def test_archiving_an_experiment_archives_its_runs_and_disables_its_recurring_runs(
    http: httpx.Client, compiled_pipelines
) -> None:
    """KFP's ArchiveExperiment is one transaction: the experiment, all its runs (ARCHIVED) and its
    recurring runs (disabled); no run is fired afterwards. Unarchiving the experiment restores
    nothing else."""
    exp_id = http.post(f"{API}/experiments", json={"display_name": "to archive"}).raise_for_status().json()[
        "experiment_id"
    ]
    spec = spec_of(compiled_pipelines["tiny"])
    http.post(
        f"{API}/runs", json={"display_name": "before the archive", "pipeline_spec": spec, "experiment_id": exp_id}
    ).raise_for_status()
    job = http.post(f"{API}/recurringruns", json={
        "display_name": "every second", "max_concurrency": "1", "mode": "ENABLE", "experiment_id": exp_id,
        "trigger": {"periodic_schedule": {"interval_second": "1"}}, "pipeline_spec": spec,
    }).raise_for_status().json()

    def runs() -> list[dict[str, Any]]:
        listed = http.get(f"{API}/runs", params={"experiment_id": exp_id, "page_size": 200}).json()
        return listed.get("runs", [])

    deadline = time.monotonic() + 60
    while not any(r.get("recurring_run_id") for r in runs()):
        assert time.monotonic() < deadline, "the recurring run never fired"
        time.sleep(0.3)

    assert http.post(f"{API}/experiments/{exp_id}:archive").raise_for_status().json() == {}
    archived = runs()
    assert {r["storage_state"] for r in archived} == {"ARCHIVED"} and len(archived) >= 2
    stored_job = http.get(f"{API}/recurringruns/{job['recurring_run_id']}").json()
    assert (stored_job["mode"], stored_job["status"]) == ("DISABLE", "DISABLED")
    time.sleep(3)  # three firing times of an enabled recurring run
    assert sorted(r["run_id"] for r in runs()) == sorted(r["run_id"] for r in archived)

    http.post(f"{API}/experiments/{exp_id}:unarchive").raise_for_status()  # restores the experiment only
    assert {r["storage_state"] for r in runs()} == {"ARCHIVED"}
    assert http.get(f"{API}/recurringruns/{job['recurring_run_id']}").json()["status"] == "DISABLED"
    for run in archived:
        wait_state(http, run["run_id"], TERMINAL)


def test_a_run_cannot_be_unarchived_while_its_experiment_is_archived(http: httpx.Client, compiled_pipelines) -> None:
    """KFP's UnarchiveRun: FAILED_PRECONDITION until the experiment is unarchived."""
    exp_id = http.post(f"{API}/experiments", json={"display_name": "archived with its run"}).json()["experiment_id"]
    run_id = http.post(f"{API}/runs", json={
        "display_name": "archived run", "pipeline_spec": spec_of(compiled_pipelines["tiny"]), "experiment_id": exp_id,
    }).raise_for_status().json()["run_id"]
    http.post(f"{API}/experiments/{exp_id}:archive").raise_for_status()
    refused = http.post(f"{API}/runs/{run_id}:unarchive")
    assert refused.status_code == 400 and refused.json()["code"] == 9, refused.text
    assert refused.json()["message"] == (
        f"Failed to unarchive run {run_id} as experiment {exp_id} must be un-archived first"
    )
    http.post(f"{API}/experiments/{exp_id}:unarchive").raise_for_status()
    assert http.post(f"{API}/runs/{run_id}:unarchive").raise_for_status().json() == {}
    assert http.get(f"{API}/runs/{run_id}").json()["storage_state"] == "AVAILABLE"
    wait_state(http, run_id, TERMINAL)


def test_the_default_experiment_cannot_be_deleted(http: httpx.Client) -> None:
    flt = json.dumps({"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": "Default"}]})
    found = http.get(f"{API}/experiments", params={"filter": flt, "namespace": ""}).json().get("experiments")
    default = found[0] if found else http.post(f"{API}/experiments", json={"display_name": "Default"}).json()
    refused = http.delete(f"{API}/experiments/{default['experiment_id']}")
    assert refused.status_code == 409 and refused.json()["code"] == 10, refused.text  # KFP's BadRequestError: ABORTED
    assert refused.json()["message"] == (
        f"Failed to delete experiment {default['experiment_id']}. The default experiment cannot be deleted"
    )
    assert http.get(f"{API}/experiments/{default['experiment_id']}").status_code == 200
    other = http.post(f"{API}/experiments", json={"display_name": "deletable"}).raise_for_status().json()
    assert http.delete(f"{API}/experiments/{other['experiment_id']}").raise_for_status().json() == {}
    assert http.get(f"{API}/experiments/{other['experiment_id']}").status_code == 404
