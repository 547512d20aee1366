"""Pure parts of the runner: reading the operator's conditions, settings validation, output JSON, and
when a found job is reattached or replaced (over a fake of the few API calls that takes)."""

from __future__ import annotations

import json
from typing import Any

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
    [{"poll_interval_s": 0}, {"timeout_s": -1}, {"cleanup": "sometimes"}, {"max_consecutive_errors": -1},
     {"max_oom_kills": 0}, {"oom_window_s": 0}],
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


# -- reattaching a job whose rendezvous store belongs to an earlier launcher attempt -------------


def _api_error(code: int) -> Exception:
    import httpx
    from lightkube.core.exceptions import ApiError

    request = httpx.Request("GET", "https://apiserver.test/x")
    response = httpx.Response(code, request=request, json={
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": f"error {code}", "code": code})
    return ApiError(request=request, response=response)


class _FakeJobsApi:
    """The calls ``create_or_reattach`` makes, over one namespace of PyTorchJobs (pure logic only;
    the real API server's behaviour is covered in tests/integration/test_launcher_k8s.py)."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict] = {}
        self.deleted: list[str] = []
        self._uids = iter(f"uid-{i}" for i in range(1, 100))

    def add(self, manifest: dict, *, conditions: list[dict] | None = None) -> str:
        job = json.loads(json.dumps(manifest))
        job["metadata"]["uid"] = next(self._uids)
        job["status"] = {"conditions": conditions or [{"type": "Running", "status": "True"}]}
        self.jobs[job["metadata"]["name"]] = job
        return job["metadata"]["uid"]

    def get(self, resource: Any, name: str, *, namespace: str) -> Any:
        if name not in self.jobs:
            raise _api_error(404)
        return resource.from_dict(self.jobs[name])

    def list(self, resource: Any, **_: Any) -> list:
        return []  # no other jobs on the key, and the deleted job's workers are gone

    def delete(self, resource: Any, name: str, **_: Any) -> None:
        self.deleted.append(self.jobs.pop(name)["metadata"]["uid"])

    def create(self, obj: Any) -> Any:
        uid = self.add(dict(obj))
        return type(obj).from_dict(self.jobs[obj["metadata"]["name"]] | {"metadata": {
            **obj["metadata"], "uid": uid}})


def _job_spec(**rdzv: Any) -> Any:
    from components.launcher.pytorchjob import PyTorchJobSpec

    return PyTorchJobSpec(run_id="run-1", task_name="train", namespace="team-a", image="img", max_replicas=2,
                          **rdzv)


OLD = {"rdzv_host": "10.244.0.7", "rdzv_port": 29400, "rdzv_id": "tf-0123456789abcdef-aaaa"}
NEW = {"rdzv_host": "10.244.0.9", "rdzv_port": 29400, "rdzv_id": "tf-0123456789abcdef-bbbb"}


def test_a_running_job_on_an_earlier_launchers_store_is_replaced() -> None:
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner, stale_rendezvous

    api = _FakeJobsApi()
    old_uid = api.add(render_pytorchjob(_job_spec(**OLD)))
    manifest = render_pytorchjob(_job_spec(**NEW))
    assert stale_rendezvous(api.jobs[manifest["metadata"]["name"]], manifest) == (
        "runs against the rendezvous store 10.244.0.7:29400 (id tf-0123456789abcdef-aaaa) of an earlier launcher "
        "attempt, not this one's at 10.244.0.9:29400 (id tf-0123456789abcdef-bbbb)")
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec(**NEW))
    assert created and ref.uid != old_uid and api.deleted == [old_uid]
    assert api.jobs[ref.name]["spec"]["elasticPolicy"]["rdzvHost"] == "10.244.0.9"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (NEW, NEW),  # the same store (a second call of this launcher)
        ({}, NEW),  # worker 0 hosts the running job's store: still there
    ],
)
def test_a_job_on_a_live_store_is_reattached(old: dict, new: dict) -> None:
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner

    api = _FakeJobsApi()
    uid = api.add(render_pytorchjob(_job_spec(**old)))
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec(**new))
    assert (created, ref.uid, api.deleted) == (False, uid, [])


def test_a_job_that_left_the_launchers_store_for_worker_0s_is_replaced_too() -> None:
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner, stale_rendezvous

    api = _FakeJobsApi()
    old_uid = api.add(render_pytorchjob(_job_spec(**OLD)))
    manifest = render_pytorchjob(_job_spec())
    assert stale_rendezvous(api.jobs[manifest["metadata"]["name"]], manifest).endswith("not this one's")
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec())
    assert created and api.deleted == [old_uid] and "rdzvHost" not in api.jobs[ref.name]["spec"]["elasticPolicy"]


def test_a_succeeded_job_is_reported_whatever_its_store() -> None:
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner

    api = _FakeJobsApi()
    uid = api.add(render_pytorchjob(_job_spec(**OLD)), conditions=[{"type": "Succeeded", "status": "True"}])
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec(**NEW))
    assert (created, ref.uid, api.deleted) == (False, uid, [])


def test_a_failed_job_is_replaced_only_once_its_workers_are_gone_too() -> None:
    """Review 2026-11-30: the operator stops a Failed job's remaining workers (cleanPodPolicy Running),
    which save a SIGTERM checkpoint for up to their grace period; the replacement was created as soon
    as the job object was gone, so two jobs' workers could write one job key."""
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner

    class _Saving(_FakeJobsApi):
        def __init__(self) -> None:
            super().__init__()
            self.pod_lists = 0

        def list(self, resource: Any, **_: Any) -> list:
            if resource.__name__ != "Pod" or not self.deleted or self.pod_lists >= 2:
                return []
            self.pod_lists += 1  # the old worker still saves for two polls
            return [resource.from_dict({"metadata": {"name": "w0", "namespace": "team-a", "uid": "uid-w0"},
                                        "status": {"phase": "Running"}})]

        def create(self, obj: Any) -> Any:
            assert self.pod_lists == 2, "created while the failed job's worker still ran"
            return super().create(obj)

    api = _Saving()
    old_uid = api.add(render_pytorchjob(_job_spec()), conditions=[{"type": "Failed", "status": "True"}])
    runner = PyTorchJobRunner(api)
    runner._pause_deleting = lambda ref, s: None  # no real sleep
    ref, created = runner.create_or_reattach(_job_spec())
    assert created and api.deleted == [old_uid] and ref.uid != old_uid and api.pod_lists == 2


def test_a_job_being_deleted_under_the_name_is_awaited_then_created_anew() -> None:
    """Review 2026-11-30: a job with a deletionTimestamp (a user's delete, an earlier attempt's
    clean-up) was reattached, and the wait ended at once: "deleted while the launcher waited"."""
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner

    api = _FakeJobsApi()
    manifest = render_pytorchjob(_job_spec())
    manifest["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    old_uid = api.add(manifest)
    runner = PyTorchJobRunner(api)
    runner._pause_deleting = lambda ref, s: None
    ref, created = runner.create_or_reattach(_job_spec())
    assert created and ref.uid != old_uid and api.deleted == [old_uid]


def test_a_create_that_loses_a_race_decides_again_about_the_job_it_lost_to() -> None:
    """Review 2026-11-30: the 409 path reattached to whatever held the name, skipping the checks
    made for a job found first (here: a Failed job, which is replaced)."""
    from components.launcher.runner import PyTorchJobRunner

    class _Racing(_FakeJobsApi):
        raced = False

        def create(self, obj: Any) -> Any:
            if not self.raced:  # another attempt's job, already Failed, lands first
                self.raced = True
                self.failed_uid = self.add(dict(obj), conditions=[{"type": "Failed", "status": "True"}])
                raise _api_error(409)
            return super().create(obj)

    api = _Racing()
    runner = PyTorchJobRunner(api)
    runner._pause_deleting = lambda ref, s: None
    ref, created = runner.create_or_reattach(_job_spec())
    assert created and api.deleted == [api.failed_uid] and ref.uid != api.failed_uid


# -- whose job it is: the same run, task name and KFP task id (a dsl.ParallelFor iteration's) ------


def test_a_launcher_reattaches_to_its_own_iterations_job_and_another_iteration_creates_its_own() -> None:
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner

    api = _FakeJobsApi()
    uid = api.add(render_pytorchjob(_job_spec(task_id="101")))
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec(task_id="101"))  # a retry of it
    assert (created, ref.uid, api.deleted) == (False, uid, [])
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec(task_id="102"))  # the next iteration
    assert created and ref.uid != uid and api.deleted == [] and len(api.jobs) == 2


@pytest.mark.parametrize(("theirs", "found"), [("101", "101"), ("", "none")])
def test_a_job_of_another_iteration_under_the_name_is_refused(theirs: str, found: str) -> None:
    """Names differ per task id, so only a job made by hand (or a hash collision) gets here: it is
    never reattached to, deleted or replaced — whether it carries another task id or, from a launcher
    before task ids, none."""
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import LauncherError, PyTorchJobRunner

    api = _FakeJobsApi()
    mine = _job_spec(task_id="102")
    other = render_pytorchjob(_job_spec(task_id=theirs))
    other["metadata"]["name"] = mine.name
    api.add(other, conditions=[{"type": "Failed", "status": "True"}])  # a failed own job would be replaced
    with pytest.raises(LauncherError, match=(
            rf"PyTorchJob team-a/{mine.name} exists but belongs to another iteration of run 'run-1' task "
            rf"'train' \(task id {found}, not 102: a dsl.ParallelFor loop")):
        PyTorchJobRunner(api).create_or_reattach(mine)
    assert api.deleted == [] and list(api.jobs) == [mine.name]


def test_a_job_of_a_launcher_before_task_ids_is_reattached_by_a_spec_without_one() -> None:
    """A pipeline compiled before task ids passes none: its retried launcher finds the job it made
    before the upgrade (same name, no task-id annotation) and reattaches."""
    import hashlib

    from components.launcher.pytorchjob import TASK_ID_ANNOTATION, render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner

    old = render_pytorchjob(_job_spec())
    assert old["metadata"]["name"] == "train-" + hashlib.sha256(b"run-1/train").hexdigest()[:10]
    assert TASK_ID_ANNOTATION not in old["metadata"]["annotations"]
    api = _FakeJobsApi()
    uid = api.add(old)
    ref, created = PyTorchJobRunner(api).create_or_reattach(_job_spec())
    assert (created, ref.uid, api.deleted) == (False, uid, [])


# -- when workers that cannot start fail the launch (fail fast) ---------------------------------


class _FakeCluster:
    """What one poll's diagnosis reads: the namespace's Warning Events (none here)."""

    def list(self, resource: Any, **_: Any) -> list:
        return []


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _worker(phase: str, *, terminated: dict | None = None, unschedulable: str = "", uid: str = "uid-w0") -> dict:
    status: dict = {"phase": phase, "conditions": []}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "pytorch", "image": "img", "restartCount": 0, "ready": False,
                                        "state": {"terminated": terminated}}]
    if unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": unschedulable}]
    return {"metadata": {"name": "train-x-worker-0", "namespace": "team-a", "uid": uid}, "status": status}


def _stuck_after(runner: Any, clock: _Clock, pods: list[dict], *, seconds: float) -> Any:
    """Poll the diagnosis over ``seconds`` (every 5 s); return the LaunchStuck raised, or None."""
    from components.launcher.runner import JobRef, LaunchStuck

    ref, spec, job_ = JobRef("team-a", "train-x", "uid-job"), _job_spec(), {"status": {"conditions": []}}
    end = clock.now + seconds
    while True:
        problems = runner._problems(ref, job_, pods, spec)
        try:
            runner._fail_if_stuck(ref, job_, pods, problems, spec, start=0.0)
        except LaunchStuck as stuck:
            return stuck
        if clock.now >= end:
            return None
        clock.now += 5.0


def test_a_failed_worker_whose_command_cannot_start_fails_the_launch_at_once() -> None:
    """ExitCode makes the pod restartPolicy Never, so exit 128 leaves it Failed (training-operator v1.9
    ``pkg/core/pod.go``); the operator recreates it forever (``train_util.IsRetryableExitCode``)."""
    from components.launcher.runner import PyTorchJobRunner

    clock = _Clock()
    runner = PyTorchJobRunner(_FakeCluster(), RunnerSettings(), clock=clock)
    start_error = {"exitCode": 128, "reason": "StartError",
                   "message": 'exec: "python": executable file not found in $PATH: unknown'}
    stuck = _stuck_after(runner, clock, [_worker("Failed", terminated=start_error)], seconds=0)
    assert stuck is not None and "cannot start the container (StartError)" in str(stuck) and '"python"' in str(stuck)
    oom = {"exitCode": 137, "reason": "OOMKilled"}  # the operator's to retry: not a launch problem
    assert _stuck_after(runner, clock, [_worker("Failed", terminated=oom)], seconds=600) is None


INSUFFICIENT_GPU = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
                    "3 No preemption victims found for incoming pod.")
NO_MATCH = ("0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes "
            "are available: 3 Preemption is not helpful for scheduling.")


def test_workers_waiting_for_gpus_queue_while_a_mismatch_fails_after_a_minute() -> None:
    from components.launcher.runner import PyTorchJobRunner

    clock = _Clock()
    runner = PyTorchJobRunner(_FakeCluster(), RunnerSettings(), clock=clock)
    queued = [_worker("Pending", unschedulable=INSUFFICIENT_GPU)]
    assert _stuck_after(runner, clock, queued, seconds=6 * 3600) is None  # a node pool scaling up, a busy cluster
    stuck = _stuck_after(runner, clock, [_worker("Pending", unschedulable=NO_MATCH)], seconds=600)
    assert stuck is not None and "no node can run it (Unschedulable)" in str(stuck)
    assert stuck.problem.grace_s == 60 and clock.now - 6 * 3600 - 1000 == 60


def test_capacity_grace_s_bounds_the_wait_for_capacity() -> None:
    from components.launcher.runner import PyTorchJobRunner

    clock = _Clock()
    runner = PyTorchJobRunner(_FakeCluster(), RunnerSettings(capacity_grace_s=1800, max_grace_s=10), clock=clock)
    t0 = clock.now
    stuck = _stuck_after(runner, clock, [_worker("Pending", unschedulable=INSUFFICIENT_GPU)], seconds=7200)
    assert stuck is not None and clock.now - t0 == 1800  # max_grace_s caps the faults' graces, not this
    assert "waiting for capacity, no node has room for it now (Unschedulable): 0/3 nodes" in str(stuck)
    with pytest.raises(ValueError, match="capacity_grace_s"):
        RunnerSettings(capacity_grace_s=-1)


def test_the_progress_line_says_a_worker_restarted_in_place_was_oom_killed() -> None:
    from components.launcher.runner import summarize_workers

    oom = {"metadata": {"name": "train-x-worker-1"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "pytorch", "restartCount": 3, "state": {"running": {}},
         "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    fresh = {"metadata": {"name": "train-x-worker-0"}, "status": {"phase": "Running", "containerStatuses": [
        {"name": "pytorch", "restartCount": 0, "state": {"running": {}}, "lastState": {}}]}}
    assert summarize_workers([fresh, oom]) == "workers: 2 Running; train-x-worker-1 restarted 3x, last OOMKilled exit 137"
    assert summarize_workers([fresh]) == "workers: 1 Running"


def test_a_job_with_no_pod_says_when_its_events_cannot_be_read() -> None:
    """Without ``events list`` (an identity with less than the pipeline-runner role) the operator's
    FailedCreatePod event is invisible; the launcher's guess (no operator?) then says so."""
    from lightkube.core.exceptions import ApiError

    from components.launcher.runner import JobRef, LauncherError, PyTorchJobRunner

    class _NoEvents:
        def list(self, resource: Any, **_: Any) -> list:
            raise ApiError(response=_Response(403, 'events is forbidden: User "system:serviceaccount:team-a:step" '
                                                   'cannot list resource "events" in API group ""'))

    clock = _Clock()
    ref, spec, job_ = JobRef("team-a", "train-x", "uid-job"), _job_spec(), {"status": {"conditions": []}}
    for client, says in ((_NoEvents(), True), (_FakeCluster(), False)):
        runner = PyTorchJobRunner(client, RunnerSettings(), clock=clock)
        problems = runner._problems(ref, job_, [], spec)
        with pytest.raises(LauncherError, match="created no pod within") as failed:
            runner._fail_if_stuck(ref, job_, [], problems, spec, start=clock.now - 3600)
        assert ("its events, which would say why, cannot be read: events is forbidden" in str(failed.value)) is says


class _Response:
    """The httpx response ``lightkube.ApiError`` reads its Status from."""

    def __init__(self, code: int, message: str) -> None:
        self.status_code = code
        self._status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "reason": "Forbidden", "code": code}

    def json(self) -> dict:
        return self._status


# -- the end of a launch: clean-up and the log followers (review 2026-11-30) -------------------------


def test_a_clean_up_that_fails_leaves_a_succeeded_jobs_outcome_standing(tmp_path, caplog) -> None:
    """A 503 (or 403: RBAC without ``delete``) on the clean-up of a Succeeded job used to fail the step
    (exit 3) and leave its outcome file saying Running."""
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import PyTorchJobRunner, RunnerSettings

    class _NoDelete(_FakeJobsApi):
        def delete(self, resource: Any, name: str, **_: Any) -> None:
            raise _api_error(503)

    api = _NoDelete()
    uid = api.add(render_pytorchjob(_job_spec()), conditions=[{"type": "Succeeded", "status": "True",
                                                               "reason": "PyTorchJobSucceeded", "message": "ok"}])
    runner = PyTorchJobRunner(api, RunnerSettings(cleanup="on-success", max_oom_kills=None))
    out = tmp_path / "outcome.json"
    with caplog.at_level("WARNING", logger="components.launcher.runner"):
        outcome = runner.run(_job_spec(), output_path=out)
    assert (outcome.state, outcome.ref.uid, outcome.deleted) == ("Succeeded", uid, False)
    assert json.loads(out.read_text())["state"] == "Succeeded"
    assert "deleting PyTorchJob team-a/" in caplog.text and "is left in place" in caplog.text


def test_the_log_followers_get_one_drain_budget_however_many_workers_run(monkeypatch) -> None:
    """After SIGTERM the job must be deleted within the launcher pod's grace period; each follower of a
    running container (whose stream never ends) used to get its own 2 s, so 15 workers took 30 s.
    The joins the wait's end makes are recorded: together they stay within one LOG_DRAIN_S."""
    import threading

    from components.launcher import logs as logs_mod
    from components.launcher.pytorchjob import render_pytorchjob
    from components.launcher.runner import (
        LOG_DRAIN_S,
        JobRef,
        LaunchTerminated,
        PyTorchJobRunner,
        RunnerSettings,
    )

    released, following, joins = threading.Event(), [], []

    class _Follower(threading.Thread):
        def join(self, timeout: float | None = None) -> None:
            joins.append(timeout)
            super().join(timeout)

    monkeypatch.setattr(logs_mod.threading, "Thread", _Follower)

    class _RunningWorkers(_FakeJobsApi):
        def list(self, resource: Any, **_: Any) -> list:
            return [resource.from_dict({
                "metadata": {"name": f"w{i}", "namespace": "team-a", "uid": f"uid-w{i}"},
                "status": {"phase": "Running", "containerStatuses": [{
                    "name": "pytorch", "image": "img", "imageID": "", "restartCount": 0, "ready": True,
                    "state": {"running": {"startedAt": "2026-11-30T00:00:00Z"}}}]}}) for i in range(8)]

        def log(self, *_: Any, **__: Any) -> Any:
            following.append(1)
            released.wait(30)  # a running container's stream: no line, no end
            return iter(())

    api = _RunningWorkers()
    uid = api.add(render_pytorchjob(_job_spec()))
    name = next(iter(api.jobs))
    runner = PyTorchJobRunner(api, RunnerSettings(stream_logs=True, max_oom_kills=None))
    runner.stop_requested.set()  # SIGTERM arrived: the first pause ends the wait
    try:
        with pytest.raises(LaunchTerminated):
            runner.wait(JobRef("team-a", name, uid), created=True)
    finally:
        released.set()
    assert len(following) == 8 and len(joins) == 8
    assert sum(joins) <= LOG_DRAIN_S, joins  # 8 x 2 s before


def test_pods_a_replaced_job_left_under_the_name_are_not_this_jobs() -> None:
    """Review 2026-11-30: pods were matched by the job-name label only, so a replaced job's pods (the
    garbage collector deletes them a while later) put their exit codes, and a stale "permanent:" line,
    into this job's failure text."""
    from components.launcher.runner import JobRef, PyTorchJobRunner

    def worker(name: str, owner: str | None, code: int) -> dict:
        refs = [] if owner is None else [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train-x",
                                          "uid": owner, "controller": True}]
        return {"metadata": {"name": name, "namespace": "team-a", "uid": f"pod-{name}", "ownerReferences": refs},
                "status": {"phase": "Failed", "containerStatuses": [{
                    "name": "pytorch", "image": "img", "imageID": "", "restartCount": 0, "ready": False,
                    "state": {"terminated": {"exitCode": code, "reason": "Error"}}}]}}

    class _Pods(_FakeJobsApi):
        def list(self, resource: Any, **_: Any) -> list:
            return [resource.from_dict(p) for p in (worker("old-0", "uid-old", 2), worker("w-0", "uid-job", 1),
                                                    worker("bare-0", None, 3))]

    runner = PyTorchJobRunner(_Pods())
    ref = JobRef("team-a", "train-x", "uid-job")
    assert runner.pod_failures(ref) == "bare-0=exit 3 (Error); w-0=exit 1 (Error)"
    assert [p["metadata"]["name"] for p in runner._worker_pods(ref)] == ["w-0", "bare-0"]
