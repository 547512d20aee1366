"""The runner and an API server that does not answer (review 2026-11-30): an outage of the
Kubernetes API while the job trains (a managed control-plane upgrade) is ridden out for
``outage_tolerance_s``; refusals (401/403/404) fail at once; transport errors anywhere are one line;
the wait for a replaced job's workers lasts at least their grace period.

A fake clock drives every wait: ``stop_requested.wait`` (the runner's pause between reads) and the
pauses of the deletion wait advance it instead of sleeping."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from components.launcher.pytorchjob import PyTorchJobSpec, render_pytorchjob
from components.launcher.runner import JobRef, LauncherError, PyTorchJobRunner, RunnerSettings

REF = JobRef("team-a", "train-x", "uid-job")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Stop:
    """``PyTorchJobRunner.stop_requested`` whose waits move the fake clock (no SIGTERM comes)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.waits = clock, []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.clock.now += timeout or 0.0
        return False

    def is_set(self) -> bool:
        return False

    def set(self) -> None:  # pragma: no cover - no signal in these tests
        raise AssertionError("unexpected stop")


def _connect_error(module: Any = httpx) -> Exception:
    return module.ConnectError("[Errno 111] Connection refused",
                               request=module.Request("GET", "https://10.96.0.1:443/apis/kubeflow.org/v1/x"))


def _status_error(code: int, message: str) -> Exception:
    """What lightkube raises for an HTTP error with a Kubernetes ``Status`` body."""
    from lightkube.core.exceptions import ApiError

    request = httpx.Request("GET", "https://10.96.0.1:443/apis/kubeflow.org/v1/x")
    response = httpx.Response(code, request=request, json={
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code})
    return ApiError(request=request, response=response)


class _FlakyApi:
    """The job reads of :meth:`PyTorchJobRunner.wait`: ``error`` is raised while ``failing(now)``;
    then the job reads as ``state`` (Running until the outage ends, then Succeeded)."""

    def __init__(self, clock: _Clock, failing: Any, error: Any) -> None:
        self.clock, self.failing, self.error = clock, failing, error
        self.reads: list[float] = []

    def get(self, resource: Any, name: str, *, namespace: str) -> Any:
        self.reads.append(self.clock.now)
        if self.failing(self.clock.now):
            raise self.error()
        return resource.from_dict({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                   "metadata": {"name": name, "namespace": namespace, "uid": REF.uid},
                                   "status": {"conditions": [{"type": "Succeeded", "status": "True",
                                                              "reason": "PyTorchJobSucceeded", "message": "done"}]}})

    def list(self, resource: Any, **_: Any) -> list:
        if self.failing(self.clock.now):
            raise self.error()
        return []


def _runner(api: Any, clock: _Clock, **settings: Any) -> tuple[PyTorchJobRunner, _Stop]:
    runner = PyTorchJobRunner(api, RunnerSettings(poll_interval_s=5.0, **settings), clock=clock)
    runner.stop_requested = _Stop(clock)  # type: ignore[assignment]
    return runner, runner.stop_requested  # type: ignore[return-value]


@pytest.mark.parametrize("module", ["httpx", "httpx2"])
def test_a_minute_without_the_api_server_does_not_end_a_job_that_trains_on(
    module: str, caplog: pytest.LogCaptureFixture
) -> None:
    """lightkube >= 1.0 raises httpx2's errors (the image's lightkube), older ones httpx's."""
    transport = pytest.importorskip(module)
    clock = _Clock()
    t0 = clock.now
    api = _FlakyApi(clock, lambda now: now < t0 + 60, lambda: _connect_error(transport))
    runner, _ = _runner(api, clock)
    with caplog.at_level(logging.INFO, logger="components.launcher.runner"):
        outcome = runner.wait(REF)
    assert (outcome.state, outcome.reason) == ("Succeeded", "PyTorchJobSucceeded")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 2, said  # once when it starts, once when it ends
    assert said[0].startswith("PyTorchJob team-a/train-x: the API server at https://10.96.0.1 does not answer "
                              "(ConnectError: [Errno 111] Connection refused); reading again for up to 600 s")
    assert said[1].startswith("PyTorchJob team-a/train-x: the API server answers again after ")


def test_the_reads_back_off_during_an_outage_and_the_last_one_is_at_the_limit() -> None:
    clock = _Clock()
    t0 = clock.now
    api = _FlakyApi(clock, lambda now: True, _connect_error)
    runner, stop = _runner(api, clock, outage_tolerance_s=120)
    with pytest.raises(LauncherError):
        runner.wait(REF)
    assert [t - t0 for t in api.reads] == [0, 5, 15, 35, 65, 95, 120]  # 5 s doubling to 30 s, then the limit
    assert stop.waits == [5, 10, 20, 30, 30, 25]


def test_an_outage_longer_than_the_tolerance_is_one_line_naming_its_length() -> None:
    clock = _Clock()
    api = _FlakyApi(clock, lambda now: True, _connect_error)
    runner, _ = _runner(api, clock)  # the default tolerance: 10 minutes
    with pytest.raises(LauncherError) as failed:
        runner.wait(REF)
    message = str(failed.value)
    assert message == ("PyTorchJob team-a/train-x: the API server at https://10.96.0.1 did not answer for 600 s "
                       "(outage_tolerance_s 600 s; 23 reads failed): ConnectError: [Errno 111] Connection refused")
    assert "\n" not in message


@pytest.mark.parametrize(("code", "says"), [
    (503, None), (500, None), (429, None), (504, None),
    (401, "was refused (401 Unauthorized)"), (403, "was refused (403 Forbidden)"),
])
def test_server_errors_are_an_outage_and_refusals_fail_at_once(code: int, says: str | None) -> None:
    clock = _Clock()
    t0 = clock.now
    api = _FlakyApi(clock, lambda now: now < t0 + 90, lambda: _status_error(code, f"error {code}"))
    runner, _ = _runner(api, clock)
    if says is None:
        assert runner.wait(REF).state == "Succeeded"
        return
    with pytest.raises(LauncherError) as refused:
        runner.wait(REF)
    assert says in str(refused.value) and str(refused.value).startswith("reading PyTorchJob team-a/train-x ")
    assert len(api.reads) == 1  # no retry: waiting does not grant rights


def test_a_server_error_page_that_is_not_a_status_is_an_outage_too() -> None:
    """A load balancer in front of the API server answers 502 with HTML: lightkube then raises the
    HTTP library's HTTPStatusError, not an ApiError."""
    clock = _Clock()
    t0 = clock.now

    def bad_gateway() -> Exception:
        request = httpx.Request("GET", "https://10.96.0.1:443/apis/kubeflow.org/v1/x")
        response = httpx.Response(502, request=request, text="<html>Bad Gateway</html>",
                                  headers={"Content-Type": "text/html"})
        return httpx.HTTPStatusError("Server error '502 Bad Gateway'", request=request, response=response)

    api = _FlakyApi(clock, lambda now: now < t0 + 90, bad_gateway)
    runner, _ = _runner(api, clock)
    assert runner.wait(REF).state == "Succeeded"


def test_outage_tolerance_is_checked() -> None:
    with pytest.raises(ValueError, match="outage_tolerance_s"):
        RunnerSettings(outage_tolerance_s=-1)


# -- transport errors outside the wait: one line, not a traceback ---------------------------------


def _job_spec(**more: Any) -> PyTorchJobSpec:
    return PyTorchJobSpec(run_id="run-1", task_name="train", namespace="team-a", image="img", max_replicas=2, **more)


class _Unreachable:
    def get(self, *_: Any, **__: Any) -> Any:
        raise _connect_error()

    def list(self, *_: Any, **__: Any) -> Any:
        raise _connect_error()


def test_create_or_reattach_against_an_unreachable_api_server_is_one_line() -> None:
    with pytest.raises(LauncherError) as failed:
        PyTorchJobRunner(_Unreachable()).create_or_reattach(_job_spec())
    assert str(failed.value) == ("reading PyTorchJob team-a/train-7c362eb76b failed: the API server at "
                                 "https://10.96.0.1 did not answer (ConnectError: [Errno 111] Connection refused)")
    with pytest.raises(LauncherError, match=r"^listing the PyTorchJobs of job key 'k' in team-a failed: the API server "):
        PyTorchJobRunner(_Unreachable()).create_or_reattach(_job_spec(job_key="k"))


def test_a_real_lightkube_client_with_no_server_is_one_line_too() -> None:
    """The errors lightkube really raises (httpx2's in lightkube 1.x), from a port nothing listens on."""
    import socket

    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = KubeConfig.from_dict({
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}], "current-context": "x"})
    runner = PyTorchJobRunner(Client(config, timeout=5), RunnerSettings(poll_interval_s=0.01, outage_tolerance_s=0.05))
    with pytest.raises(LauncherError) as failed:
        runner.create_or_reattach(_job_spec())
    assert str(failed.value).startswith(f"reading PyTorchJob team-a/train-7c362eb76b failed: the API server at "
                                        f"http://127.0.0.1:{port} did not answer (ConnectError: ")
    with pytest.raises(LauncherError, match=rf"the API server at http://127.0.0.1:{port} did not answer for "):
        runner.wait(REF)
    with pytest.raises(LauncherError, match=r"^deleting PyTorchJob team-a/train-x failed: the API server at "):
        runner.delete(REF)


# -- replacing a job: its workers' grace period, and an outage meanwhile ---------------------------


class _ReplacedJobApi:
    """A running job on an earlier launcher's rendezvous store (so it is replaced), whose workers
    keep terminating (saving their SIGTERM checkpoint) for ``workers_for_s`` after its deletion."""

    def __init__(self, clock: _Clock, old: dict, workers_for_s: float) -> None:
        self.clock, self.workers_for_s = clock, workers_for_s
        job = json.loads(json.dumps(old))
        job["metadata"]["uid"] = "uid-old"
        job["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
        self.jobs = {job["metadata"]["name"]: job}
        self.deleted_at: float | None = None

    def get(self, resource: Any, name: str, *, namespace: str) -> Any:
        if name not in self.jobs:
            raise _status_error(404, "not found")
        return resource.from_dict(self.jobs[name])

    def list(self, resource: Any, **_: Any) -> list:
        if self.deleted_at is None or self.clock.now - self.deleted_at >= self.workers_for_s:
            return []
        return [{"metadata": {"name": "train-7c362eb76b-worker-0"}, "status": {"phase": "Running"}}]

    def delete(self, resource: Any, name: str, **_: Any) -> None:
        self.jobs.pop(name)
        self.deleted_at = self.clock.now

    def create(self, obj: Any) -> Any:
        data = dict(obj)
        data["metadata"] = {**data["metadata"], "uid": "uid-new"}
        self.jobs[data["metadata"]["name"]] = data
        return type(obj).from_dict(data)


OLD = {"rdzv_host": "10.244.0.7", "rdzv_port": 29400, "rdzv_id": "tf-0123456789abcdef-aaaa"}
NEW = {"rdzv_host": "10.244.0.9", "rdzv_port": 29400, "rdzv_id": "tf-0123456789abcdef-bbbb"}


def _replace(grace_s: int, workers_for_s: float) -> tuple[Any, _Clock, _ReplacedJobApi]:
    clock = _Clock()
    api = _ReplacedJobApi(clock, render_pytorchjob(_job_spec(**OLD, termination_grace_period_s=grace_s)),
                          workers_for_s)
    runner, _ = _runner(api, clock)
    try:
        return runner.create_or_reattach(_job_spec(**NEW)), clock, api
    except LauncherError as err:
        return err, clock, api


def test_a_replaced_jobs_workers_get_their_whole_grace_period_to_end() -> None:
    """A 300 s SIGTERM save (``termination_grace_period_s`` 300, allowed by the train step) used to
    hit the fixed 120 s wait: ``is the garbage collector running?``."""
    (ref, created), clock, api = _replace(grace_s=300, workers_for_s=250)
    assert created and ref.uid == "uid-new" and clock.now - api.deleted_at >= 250


def test_workers_that_outlive_their_grace_period_and_the_margin_still_fail_the_replacement() -> None:
    from components.launcher.runner import DELETE_GRACE_MARGIN_S

    err, clock, api = _replace(grace_s=300, workers_for_s=10_000)
    assert isinstance(err, LauncherError)
    waited = 300 + DELETE_GRACE_MARGIN_S
    assert str(err) == (f"PyTorchJob team-a/train-7c362eb76b was deleted but its workers still run after {waited} s "
                        "(their grace period is 300 s; is the garbage collector running?)")
    assert waited <= clock.now - api.deleted_at < waited + 1
    # A short grace period keeps the old floor, delete_timeout_s (120 s).
    err, _, _ = _replace(grace_s=30, workers_for_s=10_000)
    assert "still run after 120 s" in str(err)


def test_the_cli_takes_the_outage_tolerance_and_refuses_a_negative_one(tmp_path: Any, capsys: Any) -> None:
    from components.launcher.__main__ import _parse, main

    assert _parse(["--spec", "x"]).outage_tolerance_s == RunnerSettings().outage_tolerance_s == 600
    assert _parse(["--spec", "x", "--outage-tolerance-s", "1800"]).outage_tolerance_s == 1800
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run_id": "r", "task_name": "t", "namespace": "team-a", "image": "img"}))
    assert main(["--spec", str(spec), "--outage-tolerance-s", "-1"]) == 2
    assert "outage_tolerance_s must be >= 0, got -1.0" in capsys.readouterr().err


def test_a_replacement_rides_out_throttled_reads_while_it_waits() -> None:
    """Review 2026-11-30: one 429 (API Priority and Fairness) or 503 during the wait for a replaced
    job and its workers failed the launch, minutes in, the old job already deleted."""
    clock = _Clock()

    class _Throttled(_ReplacedJobApi):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.refusals = [_status_error(429, "too many requests"), _status_error(503, "unavailable"),
                             _connect_error(), _status_error(429, "too many requests")]

        def get(self, resource: Any, name: str, *, namespace: str) -> Any:
            if self.deleted_at is not None and len(self.refusals) == 4:
                raise self.refusals.pop(0)
            return super().get(resource, name, namespace=namespace)

        def list(self, resource: Any, **kw: Any) -> list:
            if self.deleted_at is not None and self.refusals:
                raise self.refusals.pop(0)
            return super().list(resource, **kw)

    api = _Throttled(clock, render_pytorchjob(_job_spec(**OLD, termination_grace_period_s=30)), 40)
    runner, _ = _runner(api, clock)
    ref, created = runner.create_or_reattach(_job_spec(**NEW))
    assert created and ref.uid == "uid-new" and api.refusals == []
    # a refusal is not an outage: it still fails at once
    api = _ReplacedJobApi(clock, render_pytorchjob(_job_spec(**OLD)), 40)
    api.list = lambda *a, **k: (_ for _ in ()).throw(_status_error(403, "forbidden"))
    runner, _ = _runner(api, clock)
    with pytest.raises(LauncherError, match="forbidden"):
        runner.create_or_reattach(_job_spec(**NEW))
