"""The KFP REST API contract (v2beta1) that trainflow's users rely on, against both servers.

Issue 10, 3e. Every test runs on the ``kfp_api`` fixture's two servers:

* ``local``: trainflow's own ``trainflow kfp-server`` (always; part of ``make test``);
* ``real``: KFP 2.14.3's backend on the test bed's real node (``kfp_backend``,
  tests/support/kfp_backend.py), in the real-KFP tier (``TRAINFLOW_REALKFP=1``, which ``make test``
  sets; alone: ``make test-realkfp``), the same gate as tests/integration/test_realkfp.py.

The contract is what the Airflow bridge's hook and ``kfp.Client`` use: healthz; pipelines and
versions (upload, list, by name); experiments (create, conflict, get, list); runs (create from a
version or an inline spec, poll to SUCCEEDED, get, list with filter, sort and page tokens,
terminate); ``google.rpc.Status`` error bodies; recurring runs (create, get, list, fire on a
cron, disable, enable, delete). Where the two servers differ on purpose, the expected value per
server comes from :data:`DIFFERENCES`, whose keys are the rows of the table "Local server vs real
KFP" in docs/airflow.md; anything else that differs fails the test.

Each server's answers are also written to ``build/test-artifacts/kfp-api-contract/<server>.json``
(``$TRAINFLOW_TEST_ARTIFACTS``), to compare the two by hand.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from kfp_server_api.exceptions import ApiException

from tests.support.kfp_backend import requires_realkfp
from tests.support.kfp_server import assert_shape, start_kfp_server

API = "/apis/v2beta1"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"}

pytestmark = pytest.mark.slow

#: The marks of the ``real`` side: test_realkfp.py's gate and markers, plus ``realnode`` (runs
#: execute on the bed's real node, so the session's bed must have one). ``realkfp`` also puts it in
#: the real-KFP tier's xdist group (tests/support/parallel.py), which the fixtures cannot show: the
#: fixture asks for ``kfp_backend`` lazily.
REAL_MARKS = [
    pytest.mark.realkfp,
    pytest.mark.k8s,
    pytest.mark.s3,
    pytest.mark.realnode,
    requires_realkfp,
]

#: Documented differences (docs/airflow.md, "Local server vs real KFP"; the key is the row's first
#: column): the value each server gives. A test that meets one reads it from here.
DIFFERENCES: dict[str, dict[str, Any]] = {
    # KFP 2.14.3 terminates by patching the Argo Workflow (activeDeadlineSeconds: 0); Argo fails
    # it and the persistence agent reports FAILED. The local server stops the process group.
    "terminated run's state": {"local": "CANCELED", "real": "FAILED"},
    # healthz's pipeline_store; the real one also sends commit_sha and tag_name ("unknown" in the
    # test bed's build), fields the kfp-server-api 2.17 model no longer has
    "healthz": {"local": "local", "real": "database"},
    # KFP 2.14 wraps the validation error of a nameless experiment in an InternalServerError
    "create without a name": {"local": (400, 3), "real": (500, 13)},
    # seconds a finished run's task details may still show a task RUNNING: the local server writes
    # them with the run's state; KFP 2.14's persistence agent can report the Workflow's phase before
    # its nodes' (seen: a SUCCEEDED run whose "add" task was still RUNNING, 2026-11-27)
    "task states lag the run's end": {"local": 0.0, "real": 60.0},
}

#: How long a run of the one-step contract pipeline may take (the real backend starts a driver and
#: a launcher pod per step on a busy 2-core machine).
RUN_TIMEOUT_S = {"local": 120.0, "real": 420.0}


@dataclass
class KfpApi:
    """One server under test: its REST base, ``kfp.Client``, the contract pipelines compiled for it."""

    name: str
    url: str
    http: httpx.Client
    client: Any
    packages: dict[str, Path]
    answers: dict[str, Any] = field(default_factory=dict)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    def note(self, key: str, value: Any) -> Any:
        """Keep ``value`` for the artifact file (the server's answer, as JSON); return it."""
        self.answers[key] = value
        return value

    def call(self, method: str, path: str, key: str | None = None, **kwargs: Any) -> httpx.Response:
        """One REST call under ``/apis/v2beta1``; its status and body are noted under ``key``."""
        response = self.http.request(method, f"{API}{path}", **kwargs)
        if key:
            try:
                body: Any = response.json()
            except ValueError:
                body = response.text
            self.note(key, {"status": response.status_code, "body": body})
        return response

    def expected(self, difference: str) -> Any:
        return DIFFERENCES[difference][self.name]

    def poll_run(self, run_id: str, done: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict[str, Any]:
        """GET the run each second until ``done(run)`` or ``timeout_s`` (at least one read); the last read."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.call("GET", f"/runs/{run_id}").raise_for_status().json()
            if done(run) or time.monotonic() >= deadline:
                return run
            time.sleep(1)

    def wait_run(self, run_id: str, states: set[str], timeout_s: float | None = None) -> dict[str, Any]:
        # a run just created may have no state yet: proto3 JSON omits RUNTIME_STATE_UNSPECIFIED
        run = self.poll_run(run_id, lambda r: r.get("state") in states, timeout_s or RUN_TIMEOUT_S[self.name])
        assert run.get("state") in states, f"run {run_id} still {run.get('state')}: {json.dumps(run)[:2000]}"
        return run


def _compile(image: str, out_dir: Path) -> dict[str, Path]:
    from kfp import compiler

    from tests.support.kfp_pipelines import define_contract_pipelines

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, func in define_contract_pipelines(image).items():
        paths[name] = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(func, str(paths[name]))
    return paths


@pytest.fixture(scope="module", params=["local", pytest.param("real", marks=REAL_MARKS)])
def kfp_api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KfpApi]:
    """The server named by the param, with the contract pipelines compiled for it."""
    import kfp

    from tests.support.airflow import artifacts_dir

    root = tmp_path_factory.mktemp(f"contract-{request.param}")
    server = None
    if request.param == "local":
        server = start_kfp_server(root, max_concurrent_runs=4, name="kfp-contract")
        url, image = server.url, "python:3.11"  # kfp.local runs the step in this venv: the image is unused
    else:
        backend = request.getfixturevalue("kfp_backend")
        assert backend.node is not None and backend.node.images is not None, "the bed has no real node"
        url, image = backend.api_url, backend.node.images.ref  # the trainflow image, already on the node
    started = time.monotonic()
    answers: dict[str, Any] = {}
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            yield KfpApi(request.param, url, http, kfp.Client(host=url), _compile(image, root / "pipelines"), answers)
    finally:
        if server is not None:
            server.process.stop()
        answers["module_s"] = round(time.monotonic() - started, 1)
        out = artifacts_dir(f"kfp-api-contract/{request.param}") / "answers.json"
        out.write_text(json.dumps(answers, indent=1, default=str))


def _eq(key: str, value: str) -> str:
    """A v2beta1 filter: ``key`` EQUALS ``value``."""
    return json.dumps({"predicates": [{"key": key, "operation": "EQUALS", "string_value": value}]})


def _upload(api: KfpApi, package: Path, name: str, key: str) -> httpx.Response:
    with package.open("rb") as f:
        return api.call("POST", "/pipelines/upload", key, params={"name": name},
                        files={"uploadfile": (package.name, f, "application/x-yaml")})


def _is_status(body: Any, code: int) -> None:
    """``body`` is a google.rpc.Status (grpc-gateway's JSON error) with gRPC ``code``."""
    assert isinstance(body, dict), body
    assert body.get("code") == code, body
    assert isinstance(body.get("message"), str) and body["message"], body
    assert isinstance(body.get("details", []), list), body


# -- health ---------------------------------------------------------------------------------------


def test_healthz_answers_as_a_single_user_server(kfp_api: KfpApi) -> None:
    response = kfp_api.call("GET", "/healthz", "healthz")
    assert response.status_code == 200
    body = response.json()
    assert_shape({k: v for k, v in body.items() if k not in ("commit_sha", "tag_name")}, "V2beta1GetHealthzResponse")
    assert body.get("multi_user", False) is False
    assert body["pipeline_store"] == kfp_api.expected("healthz")


# -- pipelines ------------------------------------------------------------------------------------


def test_pipelines_and_versions_upload_list_and_conflict(kfp_api: KfpApi) -> None:
    api, client = kfp_api, kfp_api.client
    name = api.unique("contract-pipeline")
    pipeline = client.upload_pipeline(str(api.packages["add"]), pipeline_name=name, description="the contract")
    assert pipeline.display_name == name and pipeline.pipeline_id
    second = client.upload_pipeline_version(
        str(api.packages["add"]), pipeline_version_name=f"{name}-v2", pipeline_id=pipeline.pipeline_id
    )
    assert second.pipeline_id == pipeline.pipeline_id
    assert client.get_pipeline_id(name) == pipeline.pipeline_id

    raw = api.call("GET", f"/pipelines/{pipeline.pipeline_id}", "get_pipeline").json()
    assert_shape(raw, "V2beta1Pipeline")
    assert (raw["display_name"], raw["description"]) == (name, "the contract")
    versions = api.call("GET", f"/pipelines/{pipeline.pipeline_id}/versions", "list_versions").json()
    assert_shape(versions, "V2beta1ListPipelineVersionsResponse")
    assert int(versions["total_size"]) == 2
    # the upload's first version is named after the pipeline
    assert {v["display_name"] for v in versions["pipeline_versions"]} == {name, f"{name}-v2"}
    version = api.call(
        "GET", f"/pipelines/{pipeline.pipeline_id}/versions/{second.pipeline_version_id}", "get_version"
    ).json()
    assert_shape(version, "V2beta1PipelineVersion")
    spec = version["pipeline_spec"]
    spec = spec.get("pipeline_spec", spec)  # with a platform spec: {"pipeline_spec", "platform_spec"}
    assert set(spec["root"]["dag"]["tasks"]) == {"add"}
    assert spec["pipelineInfo"]["name"] == "contract-add"

    listed = api.call("GET", "/pipelines", "list_pipelines_filtered", params={"filter": _eq("display_name", name)})
    assert [p["pipeline_id"] for p in listed.json()["pipelines"]] == [pipeline.pipeline_id]

    # the upload routes are KFP's plain HTTP handler: their errors are {"error_message", "error_details"}
    again = _upload(api, api.packages["add"], name, "upload_duplicate_name")
    assert again.status_code == 409, again.text
    assert set(again.json()) == {"error_message", "error_details"}, again.text
    assert name in again.json()["error_message"] and "already exist" in again.json()["error_message"]


# -- experiments ----------------------------------------------------------------------------------


def test_experiments_create_get_conflict_and_list(kfp_api: KfpApi) -> None:
    api, client = kfp_api, kfp_api.client
    name = api.unique("contract-experiment")
    created = api.call("POST", "/experiments", "create_experiment", json={"display_name": name, "description": "d"})
    assert created.status_code == 200, created.text
    experiment = created.json()
    assert_shape(experiment, "V2beta1Experiment")
    assert (experiment["display_name"], experiment["description"]) == (name, "d")
    assert experiment["storage_state"] == "AVAILABLE"

    got = api.call("GET", f"/experiments/{experiment['experiment_id']}", "get_experiment").json()
    assert got["experiment_id"] == experiment["experiment_id"] and got["display_name"] == name
    assert client.get_experiment(experiment_name=name).experiment_id == experiment["experiment_id"]

    duplicate = api.call("POST", "/experiments", "create_experiment_duplicate", json={"display_name": name})
    assert duplicate.status_code == 409, duplicate.text
    _is_status(duplicate.json(), 6)  # ALREADY_EXISTS

    listed = api.call("GET", "/experiments", "list_experiments_filtered", params={"filter": _eq("display_name", name)})
    assert [e["experiment_id"] for e in listed.json()["experiments"]] == [experiment["experiment_id"]]


# -- runs -----------------------------------------------------------------------------------------


def test_runs_succeed_and_list_with_filter_sort_and_page_tokens(kfp_api: KfpApi) -> None:
    """One run from an uploaded version, one from an inline spec (kfp.Client's two ways); both
    SUCCEED; GET run has the parameters, the source and the step's task; the experiment's runs
    list sorted by name, one per page, and filtered by name."""
    api, client = kfp_api, kfp_api.client
    name = api.unique("contract-runs")
    experiment = client.create_experiment(name=name)
    pipeline = client.upload_pipeline(str(api.packages["add"]), pipeline_name=name)
    (version,) = client.list_pipeline_versions(pipeline.pipeline_id).pipeline_versions
    by_version = client.run_pipeline(
        experiment_id=experiment.experiment_id, job_name=f"{name}-a", pipeline_id=pipeline.pipeline_id,
        version_id=version.pipeline_version_id, params={"a": 5, "b": 7},
    )
    inline = client.run_pipeline(
        experiment_id=experiment.experiment_id, job_name=f"{name}-b", pipeline_package_path=str(api.packages["add"]),
        params={"a": 1, "b": 1},
    )
    started = time.monotonic()
    runs = {r.run_id: api.wait_run(r.run_id, TERMINAL) for r in (by_version, inline)}
    api.note("runs_to_terminal_s", round(time.monotonic() - started, 1))
    api.note("run_by_version", runs[by_version.run_id])
    api.note("run_inline", runs[inline.run_id])
    for run in runs.values():
        assert run["state"] == "SUCCEEDED", json.dumps(run)[:3000]
        assert_shape(run, "V2beta1Run")
        assert run["experiment_id"] == experiment.experiment_id
        assert run["state_history"][-1]["state"] == "SUCCEEDED"
        assert {h["state"] for h in run["state_history"]} <= {"PENDING", "RUNNING", "SUCCEEDED"}
        assert run["finished_at"] >= run["created_at"]
        assert "error" not in run or not run["error"].get("code"), run.get("error")
    a, b = runs[by_version.run_id], runs[inline.run_id]
    assert a["runtime_config"]["parameters"] == {"a": 5, "b": 7}
    assert b["runtime_config"]["parameters"] == {"a": 1, "b": 1}
    assert a["pipeline_version_reference"] == {
        "pipeline_id": pipeline.pipeline_id, "pipeline_version_id": version.pipeline_version_id
    }
    assert "pipeline_spec" in b and not b.get("pipeline_version_reference")

    def page(**params: Any) -> dict[str, Any]:
        response = api.call("GET", "/runs", None, params={"experiment_id": experiment.experiment_id, **params})
        assert response.status_code == 200, response.text
        return response.json()

    first = api.note("list_runs_page_1", page(page_size=1, sort_by="display_name desc"))
    assert_shape(first, "V2beta1ListRunsResponse")
    assert [r["run_id"] for r in first["runs"]] == [inline.run_id]  # "-b" before "-a"
    assert int(first["total_size"]) == 2 and first["next_page_token"]
    second = api.note("list_runs_page_2", page(page_size=1, sort_by="display_name desc",
                                               page_token=first["next_page_token"]))
    assert [r["run_id"] for r in second["runs"]] == [by_version.run_id]
    assert not second.get("next_page_token")
    ascending = page(sort_by="display_name")
    assert [r["run_id"] for r in ascending["runs"]] == [by_version.run_id, inline.run_id]
    filtered = api.note("list_runs_filtered", page(filter=_eq("display_name", f"{name}-a")))
    assert [r["run_id"] for r in filtered["runs"]] == [by_version.run_id]
    assert int(filtered["total_size"]) == 1
    succeeded = page(filter=_eq("state", "SUCCEEDED"))
    assert {r["run_id"] for r in succeeded["runs"]} == set(runs)
    # kfp.Client reads the same lists
    listed = client.list_runs(experiment_id=experiment.experiment_id, sort_by="display_name desc", page_size=10)
    assert [r.run_id for r in listed.runs] == [inline.run_id, by_version.run_id]
    # the step's state, as the Airflow bridge logs it (run_details.task_details)
    def task_states(run: dict[str, Any]) -> dict[str, Any]:
        return {t.get("display_name"): t.get("state") for t in run.get("run_details", {}).get("task_details", [])}

    lag_s, waited_s = api.expected("task states lag the run's end"), api.note("task_states_waited_s", {})
    for run_id in runs:
        started = time.monotonic()
        run = api.poll_run(run_id, lambda r: task_states(r).get("add") == "SUCCEEDED", lag_s)
        waited_s[run_id] = round(time.monotonic() - started, 1)
        assert task_states(run).get("add") == "SUCCEEDED", task_states(run)


def test_terminate_stops_a_running_run(kfp_api: KfpApi) -> None:
    api, client = kfp_api, kfp_api.client
    name = api.unique("contract-terminate")
    run = client.create_run_from_pipeline_package(
        str(api.packages["sleep"]), arguments={"seconds": 600.0}, run_name=name, experiment_name=name
    )
    api.wait_run(run.run_id, {"RUNNING"} | TERMINAL)
    # the step itself should be running, not just the run (on the real backend: its pod started)
    deadline = time.monotonic() + min(RUN_TIMEOUT_S[api.name], 150)
    while True:
        current = api.call("GET", f"/runs/{run.run_id}").json()
        tasks = {t.get("display_name"): t.get("state") for t in current.get("run_details", {}).get("task_details", [])}
        step_running = tasks.get("sleep-for") == "RUNNING"
        if step_running or current.get("state") in TERMINAL or time.monotonic() > deadline:
            break
        time.sleep(1)
    api.note("run_before_terminate", current)
    assert current.get("state") == "RUNNING", current
    response = api.call("POST", f"/runs/{run.run_id}:terminate", "terminate")
    assert response.status_code == 200 and response.json() == {}, response.text
    terminated = time.monotonic()
    final = api.note("terminated_run", api.wait_run(run.run_id, TERMINAL, timeout_s=180))
    api.note("terminate_to_terminal_s", round(time.monotonic() - terminated, 1))
    assert final["state"] == api.expected("terminated run's state"), final
    assert final["finished_at"] >= final["created_at"]
    # a finished run cannot be terminated (KFP 2.14: "Row not found"); the Airflow hook takes that as done
    again = api.call("POST", f"/runs/{run.run_id}:terminate", "terminate_finished_run")
    assert again.status_code == 400, again.text
    _is_status(again.json(), 3)
    assert step_running, f"the step never showed RUNNING in task_details before terminate: {tasks}"


# -- errors ---------------------------------------------------------------------------------------


def test_errors_are_google_rpc_status_bodies(kfp_api: KfpApi) -> None:
    """Bad requests get grpc-gateway's HTTP status and a google.rpc.Status body (code, message,
    details), which the Airflow hook reads (``airflow_bridge.hooks``)."""
    api = kfp_api
    missing = str(uuid.uuid4())
    for key, method, path, kwargs, http_status, code in (
        ("run_not_found", "GET", f"/runs/{missing}", {}, 404, 5),
        ("experiment_not_found", "GET", f"/experiments/{missing}", {}, 404, 5),
        ("pipeline_not_found", "GET", f"/pipelines/{missing}", {}, 404, 5),
        ("experiment_without_name", "POST", "/experiments", {"json": {"description": "no name"}},
         *api.expected("create without a name")),
        # the real server's JSON parser refuses fields its message lacks (protojson, DiscardUnknown: false)
        ("experiment_unknown_field", "POST", "/experiments",
         {"json": {"display_name": api.unique("contract-unknown"), "no_such_field": 1}}, 400, 3),
        ("runs_bad_filter", "GET", "/runs", {"params": {"filter": "not json"}}, 400, 3),
        ("runs_bad_sort", "GET", "/runs", {"params": {"sort_by": "no_such_field desc"}}, 400, 3),
    ):
        response = api.call(method, path, f"error_{key}", **kwargs)
        assert response.status_code == http_status, (key, response.status_code, response.text)
        _is_status(response.json(), code)


# -- recurring runs -------------------------------------------------------------------------------


def test_recurring_run_fires_on_its_cron_and_is_disabled_enabled_and_deleted(kfp_api: KfpApi) -> None:
    """``kfp.Client.create_recurring_run`` with KFP's six-field cron (seconds first): the
    recurring run is ENABLED, lists under its experiment, starts a run that names it within a
    minute, and disable / enable / delete answer as the real API does."""
    api, client = kfp_api, kfp_api.client
    name = api.unique("contract-recurring")
    experiment = client.create_experiment(name=name)
    bad = api.call("POST", "/recurringruns", "recurring_run_bad_cron", json={
        "display_name": name, "experiment_id": experiment.experiment_id, "max_concurrency": "1", "mode": "ENABLE",
        "trigger": {"cron_schedule": {"cron": "61 * * * * *"}},
        "pipeline_spec": json.loads(json.dumps(_spec(api.packages["add"]))),
    })
    assert bad.status_code == 400, bad.text
    _is_status(bad.json(), 3)

    recurring = client.create_recurring_run(
        experiment_id=experiment.experiment_id, job_name=name, pipeline_package_path=str(api.packages["add"]),
        cron_expression="*/15 * * * * *", max_concurrency=1, no_catchup=True, params={"a": 2, "b": 3},
    )
    rid = recurring.recurring_run_id
    try:
        raw = api.call("GET", f"/recurringruns/{rid}", "get_recurring_run").json()
        assert_shape(raw, "V2beta1RecurringRun")
        assert (raw["display_name"], raw["status"], raw["mode"]) == (name, "ENABLED", "ENABLE")
        assert raw["trigger"]["cron_schedule"]["cron"] == "*/15 * * * * *"
        assert str(raw["max_concurrency"]) == "1" and raw["no_catchup"] is True
        assert raw["experiment_id"] == experiment.experiment_id
        assert raw["runtime_config"]["parameters"] == {"a": 2, "b": 3}
        listed = api.call("GET", "/recurringruns", "list_recurring_runs",
                          params={"experiment_id": experiment.experiment_id}).json()
        assert_shape(listed, "V2beta1ListRecurringRunsResponse")
        assert [r["recurring_run_id"] for r in listed["recurringRuns"]] == [rid]
        assert [r.recurring_run_id for r in client.list_recurring_runs(experiment_id=experiment.experiment_id)
                .recurring_runs] == [rid]

        started = time.monotonic()
        fired: list[dict[str, Any]] = []
        while not fired:
            assert time.monotonic() - started < 120, f"recurring run {rid} started no run in 120 s"
            fired = api.call("GET", "/runs", params={"experiment_id": experiment.experiment_id}).json().get("runs") or []
            time.sleep(1)
        api.note("recurring_first_run_after_s", round(time.monotonic() - started, 1))
        api.note("recurring_fired_run", fired[0])
        assert {r.get("recurring_run_id") for r in fired} == {rid}

        assert api.call("POST", f"/recurringruns/{rid}:disable", "disable_recurring_run").json() == {}
        assert client.get_recurring_run(rid).status == "DISABLED"
        assert api.call("POST", f"/recurringruns/{rid}:enable", "enable_recurring_run").json() == {}
        assert client.get_recurring_run(rid).status == "ENABLED"
    finally:
        client.disable_recurring_run(rid)
        for run in client.list_runs(experiment_id=experiment.experiment_id).runs or []:
            # Only runs still going: both servers answer 400 to terminating a finished run (it
            # raised here when a fired run had ended before the clean-up, 1 of 3 runs under load).
            if run.state not in ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELED"):
                with contextlib.suppress(ApiException):  # it may end between the list and this call
                    client.terminate_run(run.run_id)
    deleted = api.call("DELETE", f"/recurringruns/{rid}", "delete_recurring_run")
    assert deleted.status_code == 200 and deleted.json() == {}, deleted.text
    gone = api.call("GET", f"/recurringruns/{rid}", "get_deleted_recurring_run")
    assert gone.status_code == 404, gone.text
    _is_status(gone.json(), 5)
    # the fired run got the recurring run's parameters
    assert fired[0]["runtime_config"]["parameters"] == {"a": 2, "b": 3}, fired[0].get("runtime_config")


def _spec(package: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(package.read_text())


def test_every_documented_difference_is_a_row_of_the_docs_table() -> None:
    """Pure: each key of :data:`DIFFERENCES` begins a row of docs/airflow.md's "Local server vs real KFP"."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "airflow.md").read_text()
    table = docs.split("### Local server vs real KFP", 1)[1].split("\n## ", 1)[0]
    first_columns = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")]
    missing = [key for key in DIFFERENCES if not any(col.startswith(key) for col in first_columns)]
    assert not missing, f"DIFFERENCES keys with no row in docs/airflow.md: {missing}"
