"""Exceptions of an unexpected type in the controller's adapters (pure logic, with fakes).

lightkube raises ``KeyError: 'Content-Type'`` on an error answer without Content-Type (a proxy's
bare 503); a bearer-token file can vanish while the controller runs. Neither may cost the results
of actions already sent, the actions not sent yet, a clean shutdown, or an honest
``trainflow_scheduler_prometheus_up``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from prometheus_client import generate_latest

from gpu_scheduler import controller as controller_module
from gpu_scheduler.actuate.apply import Actuator, EventRecorder
from gpu_scheduler.actuate.plan import Action, ActionKind, EventSpec, Patch
from gpu_scheduler.controller import ControllerMetrics, Runtime
from gpu_scheduler.leader import LeaderElector
from gpu_scheduler.observe.prometheus import PrometheusObserver, PrometheusUnavailable
from gpu_scheduler.settings import ControllerSettings
from tests.gpu_scheduler.kube_objects import T0
from tests.gpu_scheduler.test_controller_loop import Leader, make, two_nodes

BARE_503 = KeyError("Content-Type")  # what lightkube raises on an error answer without Content-Type


def action(job: str, kind: ActionKind, *, event: bool = False) -> Action:
    namespace, name = job.split("/")
    return Action(job=job, uid=f"uid-{name}", kind=kind, from_workers=2, to_workers=1,
                  patches=(Patch(namespace=namespace, name=name, body={"spec": {"runPolicy": {"suspend": True}}}),),
                  event=EventSpec(type="Normal", reason=kind.value, message="m") if event else None)


class PatchingClient:
    """Records PATCHes; the jobs in ``failing`` answer with ``error`` instead."""

    def __init__(self, failing: dict[str, Exception]) -> None:
        self.failing, self.sent = failing, []
        self._lock = threading.Lock()

    def patch(self, resource: Any, name: str, body: Any, **kw: Any) -> None:
        with self._lock:
            self.sent.append(name)
        if name in self.failing:
            raise self.failing[name]

    def create(self, obj: Any, **kw: Any) -> None:
        raise BARE_503


@pytest.mark.parametrize("max_concurrency", [1, 8])
def test_an_unexpected_exception_ends_only_its_own_action(max_concurrency: int) -> None:
    """Review: a KeyError from one PATCH escaped Actuator.apply, so the results of the actions sent
    before it were lost and the second group (confirmations, claims) was never sent."""
    actions = [action("ns/a", ActionKind.SCALE_DOWN), action("ns/b", ActionKind.PREEMPT),
               action("ns/c", ActionKind.CONFIRM), action("ns/d", ActionKind.SCALE_UP)]
    client = PatchingClient({"a": BARE_503, "c": RuntimeError("boom\nsecond line")})
    actuator = Actuator(client, record_events=False, max_concurrency=max_concurrency)  # type: ignore[arg-type]
    try:
        results = actuator.apply(actions)
    finally:
        actuator.close()
    assert sorted(client.sent) == ["a", "b", "c", "d"]
    by_job = {r.action.job: (r.status, r.message) for r in results}
    assert by_job == {"ns/a": ("error", "KeyError: 'Content-Type'"), "ns/b": ("applied", ""),
                      "ns/c": ("error", "RuntimeError: boom second line"), "ns/d": ("applied", "")}
    assert [r.action.job for r in results][:2] in (["ns/a", "ns/b"], ["ns/b", "ns/a"])  # releases first
    # what went out, for trainflow_scheduler_patches_total (review 2026-11-30: it counted the action's
    # patches whether sent or not)
    assert {r.action.job: r.requests_sent for r in results} == {"ns/a": 1, "ns/b": 1, "ns/c": 1, "ns/d": 1}
    lost = Actuator(client, record_events=False, proceed=lambda: False)  # type: ignore[arg-type]
    try:
        (result,) = lost.apply([action("ns/e", ActionKind.SCALE_UP)])
    finally:
        lost.close()
    assert (result.status, result.requests_sent) == ("not_leader", 0)


def test_an_event_that_fails_unexpectedly_leaves_its_applied_action_applied(caplog: pytest.LogCaptureFixture) -> None:
    client = PatchingClient({})  # every PATCH goes through; creating the Event raises KeyError
    actuator = Actuator(client, async_events=False, max_concurrency=1)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler"):
        (result,) = actuator.apply([action("ns/a", ActionKind.SCALE_DOWN, event=True)])
    assert (result.status, result.event_recorded) == ("applied", False)
    assert any(getattr(r, "error", "") == "KeyError: 'Content-Type'" for r in caplog.records)


@contextmanager
def bare_503_server() -> Iterator[str]:
    """An HTTP server answering every request 503 with no Content-Type (as some proxies do)."""

    class Bare(BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.send_response_only(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PATCH = do_PUT = do_POST = answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Bare)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def lightkube_client(url: str) -> Any:
    from lightkube import Client, KubeConfig
    from lightkube.config.kubeconfig import Cluster, User

    return Client(KubeConfig.from_one(cluster=Cluster(server=url), user=User(token="t")), trust_env=False)


def test_a_bare_503_from_the_api_server_is_each_actions_error_result() -> None:
    """The same through lightkube itself: every action is tried, each ends ``error``."""
    with bare_503_server() as url:
        actuator = Actuator(lightkube_client(url), record_events=False, max_concurrency=4)
        try:
            results = actuator.apply([action("ns/a", ActionKind.SCALE_DOWN), action("ns/b", ActionKind.SCALE_UP),
                                      action("ns/c", ActionKind.SCALE_UP)])
        finally:
            actuator.close()
    assert [(r.action.job, r.status, r.message) for r in results] == [
        (job, "error", "KeyError: 'Content-Type'") for job in ("ns/a", "ns/b", "ns/c")]


# ------------------------------------------------------------------------------------ leader / close


class LeaseClient:
    """Serves one Lease; raises ``error`` once it is set."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.lease = Lease(metadata=ObjectMeta(name="lease", namespace="ns", resourceVersion="1"),
                           spec=LeaseSpec(holderIdentity="me", leaseDurationSeconds=15))

    def get(self, resource: Any, name: str, **kw: Any) -> Lease:
        if self.error is not None:
            raise self.error
        return self.lease

    def replace(self, lease: Lease, **kw: Any) -> Lease:
        if self.error is not None:
            raise self.error
        self.lease = lease
        return lease


class Closing:
    """Any of the runtime's parts: records which of its stopping methods ran."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, method: str) -> Any:
        return lambda *a, **kw: self.calls.append(f"{self.name}.{method}")


def test_a_release_that_fails_unexpectedly_still_lets_the_runtime_close(caplog: pytest.LogCaptureFixture) -> None:
    """Review: KeyError from the Lease GET escaped release(), so Runtime.close() stopped before the
    Events were flushed and the informers and the Prometheus client were stopped."""
    client = LeaseClient()
    elector = LeaderElector(client, namespace="ns", name="lease", identity="me")  # type: ignore[arg-type]
    assert elector.try_acquire_or_renew() and elector.is_leader()
    client.error = BARE_503
    calls: list[str] = []
    runtime = Runtime(controller=Closing("controller", calls), settings=None, observer=Closing("observer", calls),  # type: ignore[arg-type]
                      prometheus=Closing("prometheus", calls), leader=elector, metrics=ControllerMetrics(),  # type: ignore[arg-type]
                      wake=threading.Event(), connector=None, actuator=Closing("actuator", calls))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler"):
        runtime.close()
    assert calls == ["controller.close", "actuator.close", "observer.stop", "prometheus.close"]
    assert not elector.is_leader()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("lease not released")]
    assert record.levelno == logging.WARNING and record.error == "KeyError: 'Content-Type'"  # type: ignore[attr-defined]


class Failing:
    """Any of the runtime's parts: records each stopping method called, then raises ``error``."""

    def __init__(self, name: str, calls: list[str], error: Exception) -> None:
        self.name, self.calls, self.error = name, calls, error

    def __getattr__(self, method: str) -> Any:
        def call(*a: Any, **kw: Any) -> None:
            self.calls.append(f"{self.name}.{method}")
            raise self.error

        return call


def runtime_of(**parts: Any) -> Runtime:
    """A Runtime whose ``parts`` (leader, controller, actuator, observer, prometheus) are fakes."""
    return Runtime(
        settings=None,  # type: ignore[arg-type]
        metrics=ControllerMetrics(),
        wake=threading.Event(),
        connector=None,  # type: ignore[arg-type]
        **parts,
    )


def test_every_shutdown_step_runs_when_the_ones_before_it_fail(caplog: pytest.LogCaptureFixture) -> None:
    """Only the Lease release was guarded: an informer that failed to stop skipped the Prometheus
    client, a failed Event flush skipped the informers."""
    calls: list[str] = []
    runtime = runtime_of(
        leader=Failing("leader", calls, RuntimeError("join")),
        controller=Failing("controller", calls, RuntimeError("executor\nbroken")),
        actuator=Failing("actuator", calls, TimeoutError("flush")),
        observer=Failing("observer", calls, BARE_503),
        prometheus=Failing("prometheus", calls, OSError("closed")),
    )
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler"):
        runtime.close()  # raised RuntimeError from leader.stop, and nothing else ran
    assert calls == ["leader.stop", "controller.close", "actuator.close", "observer.stop", "prometheus.close"]
    failed = [(r.step, r.error) for r in caplog.records if r.getMessage() == "shutdown step failed"]  # type: ignore[attr-defined]
    assert failed == [
        ("leader.stop", "RuntimeError: join"),
        ("controller.close", "RuntimeError: executor broken"),
        ("actuator.close", "TimeoutError: flush"),
        ("observer.stop", "KeyError: 'Content-Type'"),
        ("prometheus.close", "OSError: closed"),
    ]


def test_one_failing_shutdown_step_leaves_the_others_quiet(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    runtime = runtime_of(
        leader=None,
        controller=Closing("controller", calls),
        actuator=Closing("actuator", calls),
        observer=Failing("observer", calls, RuntimeError("watch thread")),
        prometheus=Closing("prometheus", calls),
    )
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler"):
        runtime.close()
    assert calls == ["controller.close", "actuator.close", "observer.stop", "prometheus.close"]
    (record,) = caplog.records
    assert record.getMessage() == "shutdown step failed" and record.levelno == logging.WARNING
    assert (record.step, record.error) == ("observer.stop", "RuntimeError: watch thread")  # type: ignore[attr-defined]


def test_a_lease_released_through_lightkube_answering_a_bare_503() -> None:
    with bare_503_server() as url:
        elector = LeaderElector(lightkube_client(url), namespace="ns", name="lease", identity="me")
        with elector._state_lock:  # as after a renewal
            elector._renewed_at = elector._clock()
            elector._set(True)
        elector.release()  # raised KeyError: 'Content-Type' before
    assert not elector.is_leader()


# -------------------------------------------------------------------------------------------- events


def test_a_flush_that_times_out_leaves_no_thread_behind() -> None:
    """flush() waited for Queue.join() in a new thread; with a sender stuck for good, each flush
    that timed out left that thread waiting forever."""
    stuck, started = threading.Event(), threading.Event()

    def send(**kw: Any) -> None:
        started.set()
        stuck.wait()  # an API call that never returns

    recorder = EventRecorder(send)
    try:
        recorder.submit({"event": 1})
        recorder.submit({"event": 2})
        assert started.wait(5)
        threads = threading.active_count()
        for _ in range(5):
            began = time.monotonic()
            assert recorder.flush(0.2) is False
            assert 0.2 <= time.monotonic() - began < 1.0
        assert threading.active_count() == threads, [t.name for t in threading.enumerate()]
        stuck.set()
        assert recorder.flush(5) is True
    finally:
        stuck.set()
        recorder.close()


def test_a_flush_returns_as_soon_as_the_events_are_sent() -> None:
    sent: list[int] = []
    recorder = EventRecorder(lambda **kw: sent.append(kw["n"]))
    try:
        assert recorder.flush(0) is True  # nothing queued
        for n in range(100):
            recorder.submit({"n": n})
        began = time.monotonic()
        assert recorder.flush(5) is True and time.monotonic() - began < 2
        assert sent == list(range(100))
    finally:
        recorder.close()


# ------------------------------------------------------------------------------------------ prometheus


def empty_vector(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})


def test_a_token_file_gone_or_empty_after_start_up_makes_prometheus_unavailable(tmp_path) -> None:
    """Review: _TokenFile.read() raised ValueError from each query, which no caller expected."""
    token = tmp_path / "token"
    token.write_text("t1")
    observer = PrometheusObserver("https://prometheus:9090", bearer_token_file=token,
                                  client=httpx.Client(transport=httpx.MockTransport(empty_vector)))
    try:
        assert observer.query("up", T0) == []
        token.unlink()
        with pytest.raises(PrometheusUnavailable, match=rf"not queried: bearer token file {token}: No such file"):
            observer.query("up", T0)
        token.write_text("")
        with pytest.raises(PrometheusUnavailable, match=rf"bearer token file {token} is empty"):
            observer.observe(T0)
        token.write_bytes(b"\xff\xfe")
        with pytest.raises(PrometheusUnavailable, match=rf"bearer token file {token} is not UTF-8 text"):
            observer.query("up", T0)
        token.write_text("t2")
        assert observer.query("up", T0) == []
    finally:
        observer.close()


def prometheus_up(metrics: ControllerMetrics) -> str:
    (line,) = [x for x in generate_latest(metrics.registry).decode().splitlines()
               if x.startswith("trainflow_scheduler_prometheus_up ")]
    return line.split()[1]


def test_a_lost_token_file_skips_the_tick_and_sets_prometheus_up_to_0(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    ctl, *_, metrics = make(cluster)
    ctl._prometheus = PrometheusObserver("https://prometheus:9090", bearer_token_file=token,
                                         client=httpx.Client(transport=httpx.MockTransport(empty_vector)))
    try:
        assert ctl.tick().skipped is None and prometheus_up(metrics) == "1.0"
        token.unlink()
        report = ctl.tick()
    finally:
        ctl._prometheus.close()
    assert report.skipped is not None
    assert report.skipped.startswith("keeping every job as it is: Prometheus at https://prometheus:9090 not queried: "
                                     f"bearer token file {token}")
    assert prometheus_up(metrics) == "0.0"


def test_prometheus_up_is_0_after_a_read_that_failed_unexpectedly_and_kept_while_not_leading() -> None:
    """A metrics port raising something else than PrometheusUnavailable did not read Prometheus
    either: the tick fails (logged with its traceback) and the gauge says 0. A tick skipped before
    Prometheus is read (not the leader) leaves the gauge as it was: nothing was learnt about it."""
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    leader = Leader()
    ctl, prom, _, _, _, metrics = make(cluster, leader=leader)
    assert ctl.tick().skipped is None and prometheus_up(metrics) == "1.0"
    leader.leader = False
    assert ctl.tick().skipped == "not the leader" and prometheus_up(metrics) == "1.0"
    leader.leader = True

    def broken(now_s: float) -> Any:
        raise RuntimeError("a bug in the port")

    prom.observe = broken  # type: ignore[method-assign]
    report = ctl.tick()
    assert report.skipped == "tick failed: RuntimeError: a bug in the port"
    assert prometheus_up(metrics) == "0.0"
    leader.leader = False
    ctl.tick()
    assert prometheus_up(metrics) == "0.0"


# ------------------------------------------------------------------------------------------ start-up


class NeverSynced:
    def __init__(self) -> None:
        self.stopped = threading.Event()

    def start(self) -> None:
        pass

    def wait_synced(self, timeout_s: float) -> bool:
        time.sleep(timeout_s)
        return False

    def unsynced(self) -> list[str]:
        return ["pods (not listed yet)"]

    def stop(self) -> None:
        self.stopped.set()


def test_a_stop_while_the_caches_sync_ends_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: run() waited the whole sync timeout (60 s, longer than the pod's 30 s grace
    period) before looking at a SIGTERM that came during start-up."""
    observer, calls = NeverSynced(), list[str]()
    runtime = Runtime(controller=Closing("controller", calls), settings=None, observer=observer,  # type: ignore[arg-type]
                      prometheus=Closing("prometheus", calls), leader=None, metrics=ControllerMetrics(),  # type: ignore[arg-type]
                      wake=threading.Event(), connector=None, actuator=Closing("actuator", calls))  # type: ignore[arg-type]
    monkeypatch.setattr(controller_module, "build_runtime", lambda settings: runtime)
    settings = ControllerSettings(prometheus_url="http://prometheus:9090", metrics_port=0)
    stop, rc = threading.Event(), list[int]()
    # not the main thread: run() installs no signal handler there (a SIGTERM's handler only sets ``stop``)
    thread = threading.Thread(target=lambda: rc.append(controller_module.run(settings, stop=stop, sync_timeout_s=60)),
                              daemon=True)
    thread.start()
    time.sleep(0.3)
    stopped_at = time.monotonic()
    stop.set()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - stopped_at < 2
    assert rc == [0] and observer.stopped.is_set()
    assert calls == ["controller.close", "actuator.close", "prometheus.close"]


def test_caches_that_never_sync_still_fail_start_up_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    observer = NeverSynced()
    runtime = Runtime(controller=Closing("controller", []), settings=None, observer=observer,  # type: ignore[arg-type]
                      prometheus=Closing("prometheus", []), leader=None, metrics=ControllerMetrics(),  # type: ignore[arg-type]
                      wake=threading.Event(), connector=None, actuator=Closing("actuator", []))  # type: ignore[arg-type]
    monkeypatch.setattr(controller_module, "build_runtime", lambda settings: runtime)
    settings = ControllerSettings(prometheus_url="http://prometheus:9090", metrics_port=0)
    rc: list[int] = []
    started = time.monotonic()
    thread = threading.Thread(target=lambda: rc.append(controller_module.run(settings, stop=threading.Event(),
                                                                             sync_timeout_s=0.5)), daemon=True)
    thread.start()  # not the main thread, so run() leaves pytest's signal handlers alone
    thread.join(10)
    assert rc == [1] and 0.5 <= time.monotonic() - started < 5 and observer.stopped.is_set()
