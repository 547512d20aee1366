"""The live controller against the real test bed (issue 5, integration test 2).

Real parts only: kube-apiserver + etcd + kube-scheduler + KWOK GPU nodes + the Kubeflow training
operator (tests/support/k8s.py), a real Prometheus (Debian) scraping a simulated DCGM exporter that
follows the namespace's worker pods (tests/support/dcgm_exporter.py), and the controller wired
exactly as ``python -m gpu_scheduler run`` wires it (:func:`gpu_scheduler.controller.build_runtime`).
Ticks are driven by the test (``runtime.controller.tick()``) so every step can be asserted; the
last test runs the real command line as a subprocess.

Policies come from tests/gpu_scheduler/policies_for_tests.py: ``test-grow`` (every job at its
maximum), ``test-shrink`` (at its minimum), ``test-keep`` (no change).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.types import PatchType

import tests.gpu_scheduler.policies_for_tests  # noqa: F401  (registers test-grow / test-shrink / test-keep)
from components.launcher.pytorchjob import PyTorchJobSpec, render_pytorchjob
from gpu_scheduler.actuate.apply import Actuator
from gpu_scheduler.actuate.plan import ActionKind, PlanSettings, plan_decision
from gpu_scheduler.controller import Runtime, build_runtime
from gpu_scheduler.kube import ANNOTATION_PREFIX, FIELD_MANAGER
from gpu_scheduler.leader import LeaderElector
from gpu_scheduler.observe.kubernetes import KubeConnector
from gpu_scheduler.settings import ControllerSettings
from tests.support.controller_log import log_records, ticks
from tests.support.k8s import KubeTestBed, pytorchjob_resource, wait_until
from tests.support.lifetime import die_with_parent
from tests.support.processes import free_port

pytestmark = [pytest.mark.k8s, pytest.mark.prometheus]

POLICY_CONFIGMAP = "trainflow-gpu-scheduler-policy"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Live:
    """One test's world: namespace, GPU nodes, exporter, Prometheus, and controller factory."""

    bed: KubeTestBed
    namespace: str
    exporter: Any
    prometheus: Any
    runtimes: list[Runtime] = field(default_factory=list)

    @property
    def client(self) -> Any:
        return self.bed.client()

    def controller(self, *, clock: Callable[[], float] = time.time, **overrides: Any) -> Runtime:
        """A controller wired like ``python -m gpu_scheduler run`` (its own connector and caches)."""
        settings = ControllerSettings(**{
            "prometheus_url": self.prometheus.url,
            "kubeconfig": str(self.bed.kubeconfig),
            "namespace": self.namespace,
            "watch_namespace": self.namespace,
            "policy": "test-keep",
            "policy_configmap": POLICY_CONFIGMAP,
            "metrics_window_s": 3.0,
            "pending_timeout_s": 300.0,
            "leader_election": False,
            "metrics_port": 0,
            **overrides,
        })
        runtime = build_runtime(settings, clock=clock)
        self.runtimes.append(runtime)
        runtime.observer.start()
        assert runtime.observer.wait_synced(30), runtime.observer.unsynced()
        return runtime

    def create_job(self, task: str, *, replicas: int, min_replicas: int = 1, max_replicas: int = 4,
                   gpus: int = 1, cpu: str = "100m") -> str:
        spec = PyTorchJobSpec(run_id="run-1", task_name=task, namespace=self.namespace, image="trainflow:test",
                              min_replicas=min_replicas, max_replicas=max_replicas, replicas=replicas,
                              nproc_per_node=gpus, gpus_per_worker=gpus, cpu=cpu, memory="1Gi")
        manifest = render_pytorchjob(spec)
        self.client.create(pytorchjob_resource()(manifest))
        return spec.name

    def job(self, name: str) -> Any:
        return self.client.get(pytorchjob_resource(), name, namespace=self.namespace)

    def replicas(self, name: str) -> int:
        return self.job(name)["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]

    def pods(self, name: str) -> list[Any]:
        return [p for p in self.client.list(Pod, namespace=self.namespace,
                                            labels={"training.kubeflow.org/job-name": name})
                if p.metadata.deletionTimestamp is None]

    def running(self, name: str) -> int:
        return sum(1 for p in self.pods(name) if p.spec.nodeName and p.status and p.status.phase == "Running")

    def wait_running(self, name: str, count: int, *, timeout_s: float = 60) -> None:
        """Until exactly ``count`` workers run and Prometheus has a DCGM series for each."""
        wait_until(lambda: self.running(name) == count and len(self.pods(name)) == count, timeout_s=timeout_s,
                   what=f"{count} running workers of {name}")
        pods = {p.metadata.name for p in self.pods(name)}
        self.prometheus.wait_for(
            f'count(DCGM_FI_DEV_GPU_UTIL{{namespace="{self.namespace}",pod=~"{name}-worker-.*"}}) by (pod)',
            lambda r: {s["metric"]["pod"] for s in r} == pods if self.exporter.pod_labels else True,
            timeout_s=timeout_s,
        )

    def events(self, name: str) -> list[Any]:
        """The controller's Events about job ``name`` (the operator records its own too)."""
        for runtime in self.runtimes:
            assert runtime.actuator.flush_events(30), "events still queued after 30 s"
        return [e for e in self.client.list(Event, namespace=self.namespace, fields={"involvedObject.name": name})
                if e.source and e.source.component == FIELD_MANAGER]

    def set_policy(self, policy: str) -> None:
        data = {"policy.yaml": f"policy: {policy}\nparams: {{}}\ninterval_s: 60\n"}
        try:
            self.client.patch(ConfigMap, POLICY_CONFIGMAP, {"data": data}, namespace=self.namespace,
                              patch_type=PatchType.MERGE)
        except Exception:
            self.client.create(ConfigMap(metadata=ObjectMeta(name=POLICY_CONFIGMAP, namespace=self.namespace),
                                         data=data))


class SteppedClock:
    """The wall clock plus an offset the test advances: the controller's time moves on without a sleep.

    Prometheus holds samples at wall-clock times only (a query an offset ahead finds none, and the
    jobs would be left out for want of DCGM readings), so :meth:`attach` has the runtime's queries
    sent at the wall-clock time of each tick."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s

    def advance(self, seconds: float) -> None:
        self.offset_s += seconds

    def attach(self, runtime: Runtime) -> Runtime:
        observe = runtime.prometheus.observe
        runtime.prometheus.observe = lambda now_s: observe(now_s - self.offset_s)  # type: ignore[method-assign]
        return runtime


def own_client(bed: KubeTestBed) -> Any:
    """A separate lightkube client (its own connection pool) for a background thread."""
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig

    return Client(KubeConfig.from_file(bed.kubeconfig), field_manager="trainflow-tests")


@pytest.fixture
def live(k8s_testbed, k8s_namespace, prometheus_server, dcgm_exporter) -> Iterator[Live]:
    exporter = dcgm_exporter()
    exporter.follow(k8s_testbed.kubeconfig, k8s_namespace)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    world = Live(bed=k8s_testbed, namespace=k8s_namespace, exporter=exporter, prometheus=prom)
    yield world
    for runtime in world.runtimes:
        runtime.close()
    exporter.stop_following()


def test_scales_workers_up_to_max_and_confirms_once_bound(live: Live, kwok_gpu_nodes) -> None:
    kwok_gpu_nodes(2, gpus_per_node=4)
    name = live.create_job("grow", replicas=1, max_replicas=3)
    live.wait_running(name, 1)
    runtime = live.controller(policy="test-grow")
    report = runtime.controller.tick()
    assert report.skipped is None, report.skipped
    assert [(r.action.kind, r.status) for r in report.results] == [(ActionKind.SCALE_UP, "applied")]
    assert live.replicas(name) == 3  # the job's maximum, although 8 GPUs are free
    job = live.job(name)
    assert ANNOTATION_PREFIX + "scale-up" in job.metadata.annotations
    assert FIELD_MANAGER in {m.manager for m in job.metadata.managedFields}
    live.wait_running(name, 3)
    wait_until(lambda: runtime.observer.jobs.get(f"{live.namespace}/{name}") is not None and len(
        [p for p in runtime.observer.pods.items() if p.job == f"{live.namespace}/{name}" and p.bound]) == 3,
        timeout_s=30, what="the controller's caches to see 3 bound workers")
    report = runtime.controller.tick()
    assert [r.action.kind for r in report.results] == [ActionKind.CONFIRM]
    assert ANNOTATION_PREFIX + "scale-up" not in (live.job(name).metadata.annotations or {})
    report = runtime.controller.tick()
    assert report.results == [] and report.excluded == {}  # at max: nothing more to do
    events = live.events(name)
    assert [e.reason for e in events] == ["ScaledUp"]
    assert "workers 1->3 (test-grow" in events[0].message and events[0].type == "Normal"
    assert events[0].source.component == FIELD_MANAGER


#: The pending timeout under test: far longer than the waits for the pods and the caches before the
#: tick that must not roll back yet, however loaded the machine; the test's clock is then advanced past it.
PENDING_TIMEOUT_S = 600.0


def test_rolls_back_a_scale_up_whose_pods_stay_pending(live: Live, kwok_gpu_nodes) -> None:
    # 8 GPUs but CPU for only two 1-CPU workers: the policy sees free GPUs, kube-scheduler cannot bind
    # more than two workers (kubeflow/trainer#1751's NotEnoughResources).
    kwok_gpu_nodes(1, gpus_per_node=8, cpu="2")
    name = live.create_job("pending", replicas=1, max_replicas=4, cpu="1")
    key = f"{live.namespace}/{name}"
    live.wait_running(name, 1)
    clock = SteppedClock()
    runtime = clock.attach(live.controller(policy="test-grow", pending_timeout_s=PENDING_TIMEOUT_S,
                                           rollback_hold_s=600.0, clock=clock))
    report = runtime.controller.tick()
    assert [r.action.kind for r in report.results] == [ActionKind.SCALE_UP] and live.replicas(name) == 4
    wait_until(lambda: len(live.pods(name)) == 4 and live.running(name) == 2, timeout_s=60,
               what="2 running and 2 pending workers")

    def cached() -> bool:  # the scale-up's annotation, 2 bound and 2 pending workers, as the controller sees them
        job = runtime.observer.jobs.get(key)
        pods = [p for p in runtime.observer.pods.items() if p.job == key and not p.terminating]
        return job is not None and job.memo.scale_up is not None and sorted(p.bound for p in pods) == [
            False, False, True, True]

    wait_until(cached, timeout_s=30, what="the controller's caches to see 2 bound and 2 pending workers")
    report = runtime.controller.tick()  # within the timeout: left alone, no thrash
    assert report.results == [] and "waiting for 2 worker pod(s)" in report.excluded[key]
    clock.advance(PENDING_TIMEOUT_S)  # the timeout under test passes (the real time since the scale-up on top)
    report = runtime.controller.tick()
    assert [(r.action.kind, r.status) for r in report.results] == [(ActionKind.ROLLBACK, "applied")]
    assert live.replicas(name) == 1
    annotations = live.job(name).metadata.annotations
    assert json.loads(annotations[ANNOTATION_PREFIX + "hold"])["max_workers"] == 1
    warning = [e for e in live.events(name) if e.reason == "ScaleUpRolledBack"]
    assert len(warning) == 1 and warning[0].type == "Warning"
    assert "2 worker pod(s) still not bound" in warning[0].message
    live.wait_running(name, 1)  # the operator removed the pending pods
    wait_until(lambda: sum(1 for p in runtime.observer.pods.items() if p.job == key) == 1,
               timeout_s=30, what="the caches to drop the removed pods")
    for _ in range(2):  # held: test-grow may not scale it up again
        report = runtime.controller.tick()
        assert report.results == [] and live.replicas(name) == 1


def test_switches_policy_through_its_configmap_without_a_restart(live: Live, kwok_gpu_nodes) -> None:
    kwok_gpu_nodes(1, gpus_per_node=8)
    live.set_policy("test-keep")
    name = live.create_job("switch", replicas=3, max_replicas=4)
    live.wait_running(name, 3)
    runtime = live.controller(policy="test-grow")  # the ConfigMap wins over the flag
    controller = runtime.controller
    report = controller.tick()
    assert report.policy == "test-keep" and report.results == [] and live.replicas(name) == 3
    switches = controller.policies.switches
    runtime.wake.clear()
    live.set_policy("test-shrink")
    assert runtime.wake.wait(10), "the ConfigMap watch did not wake the controller"
    report = controller.tick()  # the very next tick, same process and object
    assert report.policy_switched and report.policy == "test-shrink"
    assert report.decision is not None and report.decision.policy == "test-shrink"
    assert [(r.action.kind, r.status) for r in report.results] == [(ActionKind.SCALE_DOWN, "applied")]
    assert live.replicas(name) == 1 and runtime.controller is controller
    assert controller.policies.switches == switches + 1


def test_prometheus_stopped_keeps_every_job_as_it_is_and_logs_why(
    live: Live, kwok_gpu_nodes, caplog: pytest.LogCaptureFixture
) -> None:
    kwok_gpu_nodes(1, gpus_per_node=8)
    name = live.create_job("outage", replicas=2, max_replicas=4)
    live.wait_running(name, 2)
    # Created only now: a worker of 8 GPUs bound first would fill the node and leave ``outage`` Pending.
    queued = live.create_job("outage-queued", replicas=2, max_replicas=2, gpus=8)  # cannot fit: Pending
    wait_until(lambda: len(live.pods(queued)) == 2, timeout_s=60, what=f"the Pending workers of {queued}")
    assert live.running(queued) == 0
    runtime = live.controller(policy="test-shrink")
    live.prometheus.stop()
    before = {n: live.job(n).metadata.resourceVersion for n in (name, queued)}
    with caplog.at_level(logging.INFO, logger="gpu_scheduler"):
        for _ in range(2):
            report = runtime.controller.tick()
            assert report.skipped is not None
            assert report.skipped.startswith("keeping every job as it is: Prometheus at http://127.0.0.1:")
            assert report.results == [] and report.decision is None
    assert {n: live.job(n).metadata.resourceVersion for n in (name, queued)} == before  # untouched
    reasons = [getattr(r, "reason", "") for r in caplog.records if r.name == "gpu_scheduler.controller"]
    assert any(r.startswith("keeping every job as it is: Prometheus at") and "unreachable" in r for r in reasons)
    assert b"trainflow_scheduler_prometheus_up 0.0" in _metrics_text(runtime)
    live.prometheus.start()
    live.wait_running(name, 2)
    report = runtime.controller.tick()  # Prometheus back: the policy acts again
    kinds = sorted(r.action.kind.value for r in report.results if r.ok)
    assert kinds == ["Queued", "ScaledDown"] and live.replicas(name) == 1, [
        (r.action.job, r.action.kind, r.action.reason, r.status) for r in report.results]


def test_exporter_without_pod_labels_means_no_change_for_running_jobs(
    live: Live, kwok_gpu_nodes, dcgm_exporter
) -> None:
    kwok_gpu_nodes(1, gpus_per_node=8)
    unlabelled = dcgm_exporter(pod_labels=False)
    unlabelled.follow(live.bed.kubeconfig, live.namespace)
    live.exporter.stop_following()
    live.prometheus.set_targets([unlabelled.target])
    live.exporter = unlabelled
    name = live.create_job("nolabels", replicas=2, max_replicas=4)
    live.wait_running(name, 2)
    live.prometheus.wait_for('DCGM_FI_DEV_GPU_UTIL{pod=""}', lambda r: len(r) == 2)
    runtime = live.controller(policy="test-shrink")
    rv = live.job(name).metadata.resourceVersion
    report = runtime.controller.tick()
    assert report.skipped is None and report.results == []
    assert "no DCGM metrics for pod(s)" in report.excluded[f"{live.namespace}/{name}"]
    assert live.job(name).metadata.resourceVersion == rv


def test_dry_run_validates_on_the_server_but_persists_nothing(live: Live, kwok_gpu_nodes) -> None:
    kwok_gpu_nodes(1, gpus_per_node=8)
    name = live.create_job("dry", replicas=1, max_replicas=4)
    live.wait_running(name, 1)
    runtime = live.controller(policy="test-grow", dry_run=True)
    report = runtime.controller.tick()
    assert [(r.action.kind, r.status, r.event_recorded) for r in report.results] == [
        (ActionKind.SCALE_UP, "dry_run", True)]
    assert live.replicas(name) == 1 and live.events(name) == []


def test_scale_subresource_and_optimistic_concurrency(live: Live, kwok_gpu_nodes) -> None:
    kwok_gpu_nodes(1, gpus_per_node=8)
    name = live.create_job("subres", replicas=1, max_replicas=4)
    live.wait_running(name, 1)
    runtime = live.controller(policy="test-grow", replicas_via="scale")
    report = runtime.controller.tick()
    assert [(r.action.kind, r.status) for r in report.results] == [(ActionKind.SCALE_UP, "applied")]
    assert [p.subresource for p in report.results[0].action.patches] == ["", "scale"]
    assert live.replicas(name) == 4
    # Plans made from a stale observation: resent after an unrelated change (as the operator's
    # status updates are), refused when a field the decision depends on changed.
    from gpu_scheduler.kube import JobView
    from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Node, Placement

    key = f"{live.namespace}/{name}"
    client = KubeConnector(live.bed.kubeconfig).client()

    def stale_plan(current: int, target: int, replicas_via: str = "merge") -> tuple:
        wait_until(lambda: any(j.name == name and j.spec_workers == current for j in runtime.observer.state().jobs),
                   timeout_s=30, what=f"the cache to see {current} workers")
        stale = next(j for j in runtime.observer.state().jobs if j.name == name)
        snap = ClusterSnapshot(nodes=(Node(name="x", gpus=8),), jobs=(
            Job(name=key, submit_time_s=0, max_workers=4, placement=Placement.of({"x": current})),), taken_at_s=0)
        decision = Decision.from_placements(snap, {key: Placement.of({"x": target})}, policy="t", now_s=0)
        return plan_decision(decision, snap, {key: JobView(job=stale, placement=Placement.of({"x": current}))},
                             0, PlanSettings(replicas_via=replicas_via))

    actions = stale_plan(4, 2)
    live.client.patch(pytorchjob_resource(), name, {"metadata": {"labels": {"touched": "yes"}}},
                      namespace=live.namespace, patch_type=PatchType.MERGE)
    (result,) = Actuator(client).apply(actions)
    assert result.status == "applied", result.message  # 409, re-read, guard holds, resent
    assert live.replicas(name) == 2
    actions = stale_plan(2, 1)
    live.client.patch(pytorchjob_resource(), name, {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}},
                      namespace=live.namespace, patch_type=PatchType.MERGE)
    (result,) = Actuator(client).apply(actions)
    assert result.status == "conflict" and live.replicas(name) == 3
    assert result.message == "spec.pytorchReplicaSpecs.Worker.replicas changed since it was observed (2 -> 3)"
    # The job deleted and recreated under its name with the same spec (the launcher does so after a
    # stale rendezvous): the old job's plan reached the new job before the guard held its UID.
    def recreate(replicas: int) -> str:
        live.client.delete(pytorchjob_resource(), name, namespace=live.namespace)
        wait_until(lambda: not any(j.metadata.name == name for j in live.client.list(
            pytorchjob_resource(), namespace=live.namespace)), timeout_s=60, what="the job to go")
        assert live.create_job("subres", replicas=replicas, max_replicas=4) == name
        return live.job(name).metadata.uid

    actions = stale_plan(3, 1)
    old_uid = live.job(name).metadata.uid
    new_uid = recreate(3)
    (result,) = Actuator(client).apply(actions)
    assert result.status == "conflict" and live.replicas(name) == 3
    assert result.message == f"metadata.uid changed since it was observed ({old_uid!r} -> {new_uid!r})"

    # --replicas-via scale sends two requests: the annotations' merge patch, then the scale patch.
    # The scale patch carries the resourceVersion the first one's answer returned, so a change
    # between the two is caught by the same guard (before, a scale patch had no precondition).
    class ChangeBetween:
        """The real client, with ``change()`` run once right after the first PATCH answered."""

        def __init__(self, change) -> None:
            self._change = change

        def patch(self, *args, **kwargs):
            answer = client.patch(*args, **kwargs)
            change, self._change = self._change, None
            if change is not None:
                change()
            return answer

        def __getattr__(self, attr: str):
            return getattr(client, attr)

    actions = stale_plan(3, 2, replicas_via="scale")
    assert [p.subresource for p in actions[0].patches] == ["", "scale"]
    touch = ChangeBetween(lambda: live.client.patch(pytorchjob_resource(), name, {"metadata": {"labels": {"touched": "again"}}},
                                                    namespace=live.namespace, patch_type=PatchType.MERGE))
    (result,) = Actuator(touch).apply(actions)
    assert result.status == "applied", result.message  # scale patch: 409, re-read, guard holds, resent
    assert live.replicas(name) == 2
    actions = stale_plan(2, 1, replicas_via="scale")
    old_uid = live.job(name).metadata.uid
    uids: list[str] = []
    (result,) = Actuator(ChangeBetween(lambda: uids.append(recreate(2)))).apply(actions)
    assert result.status == "conflict" and live.replicas(name) == 2
    assert result.message == f"metadata.uid changed since it was observed ({old_uid!r} -> {uids[0]!r})"


class Crash(BaseException):
    """The controller process dies here (nothing after it runs; no tick catches it)."""


def test_a_controller_killed_between_the_reshape_patches_is_finished_by_the_next_one(
    live: Live, kwok_gpu_nodes
) -> None:
    """Review finding 11: suspend -> template patch -> resume, with the controller killed after the
    template patch and before the resume; a new controller (nothing in memory) resumes the job
    with the new GPUs per worker, counting one restart."""
    from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST

    kwok_gpu_nodes(1, gpus_per_node=8)
    name = live.create_job("reshape", replicas=2, max_replicas=4)
    live.wait_running(name, 2)
    live.client.patch(pytorchjob_resource(), name, {"metadata": {"annotations": {GPUS_PER_WORKER_REQUEST: "2"}}},
                      namespace=live.namespace, patch_type=PatchType.MERGE)
    key = f"{live.namespace}/{name}"
    first = live.controller(policy="test-keep")
    report = first.controller.tick()
    assert [(r.action.kind, r.status) for r in report.results] == [(ActionKind.RESHAPE_SUSPEND, "applied")]
    wait_until(lambda: not live.pods(name), timeout_s=60, what="the operator to delete the suspended job's pods")
    wait_until(lambda: not [p for p in first.observer.pods.items() if p.job == key]
               and first.observer.jobs.get(key).suspended, timeout_s=30, what="the caches to see it")
    send, sent = first.actuator._send, []

    def send_then_die(patch: Any, body: Any = None) -> None:
        send(patch, body)
        sent.append(patch.patch_type)
        raise Crash("killed after the template patch")

    first.actuator._send = send_then_die
    with pytest.raises(Crash):
        first.controller.tick()
    assert sent == ["json"]
    job = live.job(name)
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("2", 2)
    assert job["spec"]["runPolicy"]["suspend"] is True
    assert ANNOTATION_PREFIX + "reshape" in job.metadata.annotations
    second = live.controller(policy="test-keep")  # the restarted controller
    report = second.controller.tick()
    assert [(r.action.kind, r.status) for r in report.results] == [(ActionKind.RESHAPE_RESUME, "applied")]
    job = live.job(name)
    annotations = job.metadata.annotations
    assert not job["spec"]["runPolicy"].get("suspend") and live.replicas(name) == 1  # 2 GPUs at 2 per worker
    assert ANNOTATION_PREFIX + "reshape" not in annotations and annotations[ANNOTATION_PREFIX + "restarts"] == "1"
    live.wait_running(name, 1)
    (pod,) = live.pods(name)
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "2"


def test_release_before_an_uninstall_resumes_what_the_controller_suspended_and_nothing_else(
    live: Live, kwok_gpu_nodes
) -> None:
    """Review finding 11: a job the controller suspended would stay suspended once the controller is
    removed. ``python -m gpu_scheduler release`` resumes it and drops the controller's annotations
    (a GPUs-per-worker change it began goes back to a request); a job a user suspended stays
    suspended, a job the controller never touched is not written."""
    from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST

    kwok_gpu_nodes(1, gpus_per_node=8)
    ours = live.create_job("ours", replicas=2, max_replicas=4)
    theirs = live.create_job("theirs", replicas=1, max_replicas=2)
    untouched = live.create_job("untouched", replicas=1, max_replicas=2)
    live.wait_running(ours, 2)
    live.client.patch(pytorchjob_resource(), ours, {"metadata": {"annotations": {GPUS_PER_WORKER_REQUEST: "2"}}},
                      namespace=live.namespace, patch_type=PatchType.MERGE)
    live.client.patch(pytorchjob_resource(), theirs, {"spec": {"runPolicy": {"suspend": True}}},
                      namespace=live.namespace, patch_type=PatchType.MERGE)
    controller = live.controller(policy="test-keep")
    report = controller.controller.tick()  # suspends ``ours`` to change its GPUs per worker
    assert (ActionKind.RESHAPE_SUSPEND, "applied") in [(r.action.kind, r.status) for r in report.results]
    assert live.job(ours)["spec"]["runPolicy"]["suspend"] is True
    controller.close()  # the Deployment scaled to 0
    live.runtimes.remove(controller)
    controller_annotations = [k for k in live.job(ours).metadata.annotations if k.startswith(ANNOTATION_PREFIX)
                              and k != GPUS_PER_WORKER_REQUEST]
    assert ANNOTATION_PREFIX + "suspended-by" in controller_annotations
    theirs_before = live.job(theirs).metadata.annotations or {}
    untouched_version = live.job(untouched).metadata.resourceVersion

    argv = [sys.executable, "-m", "gpu_scheduler", "release", f"--kubeconfig={live.bed.kubeconfig}",
            f"--watch-namespace={live.namespace}"]
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # A CI run saw rc 0 with an empty stdout here once (not reproduced in 5 runs): say what else came back.
    assert f"{live.namespace}/{ours}: resumed, {len(controller_annotations)} annotation(s) removed" in done.stdout, (
        f"stdout {done.stdout!r}; stderr tail {done.stderr[-3000:]!r}; job now {live.job(ours).metadata.annotations}")
    assert done.stdout.strip().endswith("released 1 job(s), resumed 1")

    job = live.job(ours)
    assert not job["spec"]["runPolicy"].get("suspend")
    assert {k: v for k, v in job.metadata.annotations.items() if k.startswith(ANNOTATION_PREFIX)} == {
        GPUS_PER_WORKER_REQUEST: "2"}  # the change in progress goes back to a request for a later install
    live.wait_running(ours, 2)  # the operator starts its workers again
    assert live.job(theirs)["spec"]["runPolicy"]["suspend"] is True
    assert (live.job(theirs).metadata.annotations or {}) == theirs_before
    assert live.job(untouched).metadata.resourceVersion == untouched_version


def test_leader_election_lets_one_replica_act(live: Live) -> None:
    connector = KubeConnector(live.bed.kubeconfig)
    a = LeaderElector(connector.client(), namespace=live.namespace, name="sched", identity="a",
                      lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.5)
    b = LeaderElector(connector.client(), namespace=live.namespace, name="sched", identity="b",
                      lease_duration_s=3, renew_deadline_s=2, retry_period_s=0.5)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()  # renewals keep it
    a.release()
    assert b.try_acquire_or_renew() and not a.try_acquire_or_renew()
    lease_holder = live.client.get(_lease(), "sched", namespace=live.namespace).spec.holderIdentity
    assert lease_holder == "b"
    # b goes silent: a takes over once it has seen the same record for lease_duration_s
    wait_until(a.try_acquire_or_renew, timeout_s=10, interval_s=0.5, what="a to take over the silent lease")
    assert not b.is_leader() or b.try_acquire_or_renew() is False


def test_a_quiet_watch_moves_its_resume_point_with_bookmarks(live: Live) -> None:
    """A watch whose selector matched no change for a while used to resume (after each server-side
    timeout) from the resourceVersion of the last object it saw; the server may have compacted it
    (410 Gone: a LIST of the whole kind). The informer now asks for bookmarks: the resume point
    follows the server's progress, changes the selector does not match included."""
    from gpu_scheduler.observe.kubernetes import Informer

    def configmap(name: str, watched: str) -> str:
        obj = live.client.create(ConfigMap(metadata=ObjectMeta(name=name, labels={"watched": watched}), data={}),
                                 namespace=live.namespace)
        return obj.metadata.resourceVersion

    seen_version = configmap("seen", "yes")
    informer = Informer(KubeConnector(live.bed.kubeconfig), ConfigMap, lambda obj: obj.metadata.name, name="cm",
                        namespace=live.namespace, labels={"watched": "yes"}, watch_timeout_s=5).start()
    try:
        assert informer.wait_synced(30) and informer.items() == ["seen"]
        unseen_version = configmap("unseen", "no")  # moves the server's resourceVersion, not this watch's
        assert int(unseen_version) > int(seen_version)
        wait_until(lambda: informer.bookmarks > 0 and int(informer.resume_version or 0) >= int(unseen_version),
                   timeout_s=60, what=f"a bookmark at or after {unseen_version} (resume point {informer.resume_version})")
        assert informer.items() == ["seen"] and informer.relists == 1 and informer.healthy
    finally:
        informer.stop()


def test_command_line_runs_the_controller_until_sigterm(live: Live, kwok_gpu_nodes, tmp_path: Path) -> None:
    kwok_gpu_nodes(1, gpus_per_node=8)
    name = live.create_job("cli", replicas=1, max_replicas=2)
    live.wait_running(name, 1)
    port = free_port()
    log_path = tmp_path / "controller.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "POD_NAMESPACE": live.namespace}
    argv = [sys.executable, "-m", "gpu_scheduler", "run", f"--prometheus-url={live.prometheus.url}",
            f"--kubeconfig={live.bed.kubeconfig}", f"--watch-namespace={live.namespace}",
            "--plugin=tests.gpu_scheduler.policies_for_tests", "--policy=test-grow", "--interval-s=1",
            "--metrics-window-s=3", "--metrics-addr=127.0.0.1", f"--metrics-port={port}"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*die_with_parent(), *argv], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                start_new_session=True)
    scrapes: list[str] = []

    def controller_said() -> str:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        return f"controller exit code {proc.poll()}; the last lines of its log:\n{tail}"

    try:
        try:
            wait_until(lambda: live.replicas(name) == 2, timeout_s=60, what="the CLI controller to scale the job")
            metrics = wait_until(lambda: _scrape(port, scrapes), timeout_s=20, what="/metrics")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last scrape: {scrapes[-1:] or 'none'}; {controller_said()}") from exc
        assert "trainflow_scheduler_ticks_total" in metrics and 'trainflow_scheduler_leader 1.0' in metrics, (
            f"{[x for x in metrics.splitlines() if x.startswith(('trainflow_scheduler_leader', 'trainflow_scheduler_ticks'))]}"
            f"; {controller_said()}")
        holder = live.client.get(_lease(), "trainflow-gpu-scheduler", namespace=live.namespace).spec.holderIdentity
        assert holder
        # SIGUSR1: every thread's stack to the log (faulthandler), and the loop goes on ticking.
        proc.send_signal(signal.SIGUSR1)
        # The waits below return as soon as the log shows it; 30 s leaves room for a CI machine whose
        # cores are saturated (10 s ran out once with two simulations holding both cores).
        wait_until(lambda: "Current thread 0x" in log_path.read_text(errors="replace"), timeout_s=30,
                   what="the stack dump SIGUSR1 asks for")
        ticked = ticks(log_path)
        wait_until(lambda: ticks(log_path) > ticked, timeout_s=30, what="a tick after the stack dump")
        assert proc.poll() is None, controller_said()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0
    text = log_path.read_text()
    assert 'File "' in text and "gpu_scheduler/controller.py" in text  # the dump shows the control loop
    lines = log_records(log_path)
    messages = [rec["msg"] for rec in lines]
    assert messages.index("Kubernetes caches synced") < messages.index("tick")
    assert any(rec["msg"] == "action applied" and rec["action"] == "ScaledUp" and rec["job"].endswith(name)
               for rec in lines)
    assert all({"ts", "level", "logger", "msg"} <= rec.keys() for rec in lines)
    lease = live.client.get(_lease(), "trainflow-gpu-scheduler", namespace=live.namespace)
    assert not lease.spec.holderIdentity  # released on SIGTERM


def _lease() -> Any:
    from lightkube.resources.coordination_v1 import Lease

    return Lease


def _ticks_counted(text: str) -> float:
    """The sum of ``trainflow_scheduler_ticks_total``'s samples in a scrape (0 before the first tick:
    the labelled counter's HELP and TYPE lines come before any sample)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "trainflow_scheduler_ticks_total"
    )


def _scrape(port: int, seen: list[str] | None = None) -> str | None:
    """The text of ``/metrics`` once it has counted a tick, else None (what came back goes to ``seen``)."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except httpx.HTTPError as exc:
        if seen is not None:
            seen.append(f"{type(exc).__name__}: {exc}")
        return None
    if response.status_code == 200 and _ticks_counted(response.text) >= 1:
        return response.text
    if seen is not None:
        seen.append(f"HTTP {response.status_code}: {response.text[:200]!r}")
    return None


def _metrics_text(runtime: Runtime) -> bytes:
    from prometheus_client import generate_latest

    return generate_latest(runtime.metrics.registry)



def _token_kubeconfig(live: Live, user: str, token: str, path: Path) -> Path:
    """A kubeconfig at ``path`` for the bed's API server as ``user`` with bearer ``token``."""
    import yaml

    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "bed", "cluster": {"server": live.bed.server,
                                                 "certificate-authority": str(live.bed.root / "pki" / "ca.crt")}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": user, "namespace": live.namespace}}],
        "current-context": "bed",
    }))
    return path


def test_runs_under_the_manifests_least_privilege_rbac(live: Live, kwok_gpu_nodes, tmp_path: Path) -> None:
    """The controller as the ``trainflow-gpu-scheduler`` ServiceAccount bound by
    manifests/base/scheduler/rbac.yaml: watches, a scale-up through the scale subresource, an
    Event, the Lease and the ConfigMap all work; a Secret read is forbidden."""
    import uuid

    import yaml
    from lightkube import codecs
    from lightkube.core.exceptions import ApiError
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.resources.core_v1 import Secret, ServiceAccount
    from lightkube.resources.core_v1 import ServiceAccountToken as TokenRequest

    kwok_gpu_nodes(1, gpus_per_node=8)
    client = live.client
    sa = "trainflow-gpu-scheduler"
    client.create(ServiceAccount(metadata=ObjectMeta(name=sa, namespace=live.namespace)))
    suffix = uuid.uuid4().hex[:6]
    created_cluster_objects = []
    for doc in yaml.safe_load_all((REPO / "manifests/base/scheduler/rbac.yaml").read_text()):
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["name"] += f"-{suffix}"  # cluster-scoped: unique per test
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{suffix}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = live.namespace
        if doc["kind"] in ("Role", "RoleBinding"):
            doc["metadata"]["namespace"] = live.namespace
        obj = codecs.from_dict(doc)
        client.create(obj)
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            created_cluster_objects.append(obj)
    try:
        token = client.create(TokenRequest(metadata=ObjectMeta(name=sa, namespace=live.namespace),
                                           spec=TokenRequestSpec(audiences=[], expirationSeconds=3600)),
                              sa, namespace=live.namespace).status.token
        kubeconfig = _token_kubeconfig(live, sa, token, tmp_path / "scheduler.kubeconfig")
        live.set_policy("test-grow")
        name = live.create_job("rbac", replicas=1, max_replicas=3)
        live.wait_running(name, 1)
        runtime = live.controller(kubeconfig=str(kubeconfig), watch_namespace=None, leader_election=True,
                                  replicas_via="scale", lease_duration_s=6, renew_deadline_s=4, retry_period_s=1)
        runtime.leader.start()
        wait_until(runtime.leader.is_leader, timeout_s=15, what="the Lease")
        report = runtime.controller.tick()
        assert report.skipped is None and report.policy == "test-grow"
        assert [(r.action.kind, r.status, r.event_recorded) for r in report.results] == [
            (ActionKind.SCALE_UP, "applied", True)]
        assert live.replicas(name) == 3
        assert [e.reason for e in live.events(name)] == ["ScaledUp"]  # created as the ServiceAccount
        scheduler_client = KubeConnector(kubeconfig).client()
        with pytest.raises(ApiError) as denied:
            list(scheduler_client.list(Secret, namespace=live.namespace))
        assert denied.value.status.code == 403
    finally:
        for obj in created_cluster_objects:
            with contextlib.suppress(Exception):
                client.delete(type(obj), obj.metadata.name)


def test_metrics_are_served_to_scrapers_rbac_allows_and_probes_to_anyone(live: Live, tmp_path: Path) -> None:
    """Review finding 10 and item 4: ``run`` serves /healthz and /readyz, and /metrics only to a
    bearer token whose user may get /metrics (TokenReview + SubjectAccessReview by the real API
    server; the manifests' metrics-reader ClusterRole bound to one ServiceAccount)."""
    import threading
    import uuid

    import yaml
    from lightkube import codecs
    from lightkube.models.authentication_v1 import TokenRequestSpec
    from lightkube.resources.core_v1 import ServiceAccount
    from lightkube.resources.core_v1 import ServiceAccountToken as TokenRequest

    from gpu_scheduler.controller import run

    client = live.client
    suffix = uuid.uuid4().hex[:6]
    (reader,) = [d for d in yaml.safe_load_all((REPO / "manifests/base/scheduler/rbac.yaml").read_text())
                 if d["metadata"]["name"] == "trainflow-gpu-scheduler-metrics-reader"]
    reader["metadata"]["name"] += f"-{suffix}"
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": f"metrics-reader-{suffix}"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": reader["metadata"]["name"]},
               "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": live.namespace}]}
    created = [codecs.from_dict(reader), codecs.from_dict(binding)]
    tokens = {}
    for name in ("prometheus", "someone"):
        client.create(ServiceAccount(metadata=ObjectMeta(name=name, namespace=live.namespace)))
        tokens[name] = client.create(TokenRequest(metadata=ObjectMeta(name=name, namespace=live.namespace),
                                                  spec=TokenRequestSpec(audiences=[], expirationSeconds=3600)),
                                     name, namespace=live.namespace).status.token
    for obj in created:
        client.create(obj)
    port = free_port()
    settings = ControllerSettings(prometheus_url=live.prometheus.url, kubeconfig=str(live.bed.kubeconfig),
                                  namespace=live.namespace, watch_namespace=live.namespace, policy="test-keep",
                                  policy_configmap=None, leader_election=False, metrics_addr="127.0.0.1",
                                  metrics_port=port, metrics_auth="kubernetes", interval_s=1.0)
    stop = threading.Event()
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(run(settings, stop=stop)), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _get(f"{url}/readyz") == 200, timeout_s=60, what="/readyz to answer 200")
        assert _get(f"{url}/healthz") == 200
        assert _get(f"{url}/metrics") == 401
        assert _get(f"{url}/metrics", token="not-a-token") == 401
        assert _get(f"{url}/metrics", token=tokens["someone"]) == 403
        ok = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {tokens['prometheus']}"}, timeout=10)
        assert ok.status_code == 200 and "trainflow_scheduler_ticks_total" in ok.text
    finally:
        stop.set()
        thread.join(30)
        for obj in created:
            with contextlib.suppress(Exception):
                client.delete(type(obj), obj.metadata.name)
    assert exit_code == [0]


def _get(url: str, token: str | None = None) -> int | None:
    try:
        return httpx.get(url, headers={"Authorization": f"Bearer {token}"} if token else None, timeout=10).status_code
    except httpx.HTTPError:
        return None


class _NarrowScheduler:
    """A ServiceAccount that reads nodes and pods cluster-wide (the manifests' ClusterRole without
    PyTorchJobs) and gets the manifests' trainflow-gpu-scheduler-jobs rights per namespace
    (:meth:`bind`): a controller of several namespaces, each with its RoleBinding."""

    def __init__(self, live: Live, tmp_path: Path, sa: str = "narrow-scheduler") -> None:
        import uuid

        import yaml
        from lightkube import codecs
        from lightkube.models.authentication_v1 import TokenRequestSpec
        from lightkube.resources.core_v1 import ServiceAccount
        from lightkube.resources.core_v1 import ServiceAccountToken as TokenRequest

        self.live, self.sa = live, sa
        client = live.client
        suffix = uuid.uuid4().hex[:6]
        rbac = {d["metadata"]["name"]: d for d in
                yaml.safe_load_all((REPO / "manifests/base/scheduler/rbac.yaml").read_text())
                if d["kind"] == "ClusterRole"}
        reads = rbac["trainflow-gpu-scheduler"]
        reads["rules"] = [r for r in reads["rules"] if "kubeflow.org" not in r.get("apiGroups", ())]  # nodes, pods
        self.jobs_role = rbac["trainflow-gpu-scheduler-jobs"]
        for doc in (reads, self.jobs_role):
            doc["metadata"]["name"] += f"-{suffix}"
        self.cluster_objects = [codecs.from_dict(reads), codecs.from_dict(self.jobs_role), codecs.from_dict({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"narrow-reads-{suffix}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reads["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": live.namespace}]})]
        for obj in self.cluster_objects:
            client.create(obj)
        client.create(ServiceAccount(metadata=ObjectMeta(name=sa, namespace=live.namespace)))
        token = client.create(TokenRequest(metadata=ObjectMeta(name=sa, namespace=live.namespace),
                                           spec=TokenRequestSpec(audiences=[], expirationSeconds=3600)),
                              sa, namespace=live.namespace).status.token
        self.kubeconfig = _token_kubeconfig(live, sa, token, tmp_path / "narrow.kubeconfig")

    def bind(self, namespace: str) -> None:
        from lightkube import codecs

        self.live.client.create(codecs.from_dict({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "narrow-jobs", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": self.jobs_role["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": self.sa, "namespace": self.live.namespace}]}))

    def close(self) -> None:
        for obj in self.cluster_objects:
            with contextlib.suppress(Exception):
                self.live.client.delete(type(obj), obj.metadata.name)


def _one_worker_job(client: Any, namespace: str, task: str = "narrow") -> str:
    spec = PyTorchJobSpec(run_id="run-1", task_name=task, namespace=namespace, image="trainflow:test",
                          min_replicas=1, max_replicas=2, replicas=1, nproc_per_node=1, gpus_per_worker=1,
                          cpu="100m", memory="1Gi")
    client.create(pytorchjob_resource()(render_pytorchjob(spec)))
    return spec.name


def test_watching_named_namespaces_needs_only_rolebindings_there(live: Live, kwok_gpu_nodes, tmp_path: Path) -> None:
    """Review finding 9 (namespaced Roles via watch namespaces): with ``--watch-namespace a,b`` the
    controller lists and patches PyTorchJobs in a and b only, so RoleBindings of the manifests'
    ClusterRole trainflow-gpu-scheduler-jobs in those namespaces are all the write and job-read
    rights it needs (cluster-wide it reads nodes and pods only)."""
    from gpu_scheduler.kube import JobView
    from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Node, Placement

    kwok_gpu_nodes(1, gpus_per_node=8)
    client = live.client
    second = live.bed.create_namespace(f"{live.namespace}-b")
    third = live.bed.create_namespace(f"{live.namespace}-c")
    narrow = _NarrowScheduler(live, tmp_path)
    try:
        for ns in (live.namespace, second):
            narrow.bind(ns)
        names = {ns: _one_worker_job(client, ns) for ns in (live.namespace, second, third)}
        runtime = live.controller(kubeconfig=str(narrow.kubeconfig), watch_namespace=f"{live.namespace},{second}",
                                  policy="test-keep", policy_configmap=None)
        wait_until(lambda: len(runtime.observer.jobs) == 2, timeout_s=30, what="both namespaces' jobs in the cache")
        assert {j.namespace for j in runtime.observer.state().jobs} == {live.namespace, second}
        state = runtime.observer.state()
        running = Placement.of({"x": 1})  # each job as running one worker: scaled to 2 below
        plan_jobs = {j.key: JobView(job=j, placement=running) for j in state.jobs}
        snap = ClusterSnapshot(nodes=(Node(name="x", gpus=8),), jobs=tuple(
            Job(name=k, submit_time_s=0, max_workers=2, placement=running) for k in plan_jobs), taken_at_s=0)
        decision = Decision.from_placements(snap, {k: Placement.of({"x": 2}) for k in plan_jobs}, policy="t", now_s=0)
        results = runtime.actuator.apply(plan_decision(decision, snap, plan_jobs, 0, PlanSettings()))
        assert sorted((r.action.job, r.status) for r in results) == sorted(
            (f"{ns}/{names[ns]}", "applied") for ns in (live.namespace, second))
        assert client.get(pytorchjob_resource(), names[third], namespace=third)["spec"]["pytorchReplicaSpecs"][
            "Worker"]["replicas"] == 1
    finally:
        narrow.close()
        for ns in (second, third):
            live.bed.cleanup_namespace(ns)


def test_a_watched_namespace_the_controller_may_not_read_is_left_out_not_stopping_the_others(
    live: Live, kwok_gpu_nodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review (2026-11-30): one of ``--watch-namespace a,b`` without its RoleBinding (not made yet,
    or removed with a deleted profile) failed every tick ("caches not synced") and the start-up
    (exit 1): no team's job was scaled or rolled back. Now the controller starts, holds ticks up
    for ``NAMESPACE_EXCLUDE_AFTER_S`` (here 10 s), then leaves b's jobs out and acts on a's; once
    b's binding exists, b's jobs come back."""
    from gpu_scheduler.observe import kubernetes as observe_kubernetes

    monkeypatch.setattr(observe_kubernetes, "NAMESPACE_EXCLUDE_AFTER_S", 10.0)
    kwok_gpu_nodes(1, gpus_per_node=8)
    client = live.client
    second = live.bed.create_namespace(f"{live.namespace}-b")
    narrow = _NarrowScheduler(live, tmp_path)
    try:
        narrow.bind(live.namespace)  # b: no binding yet
        ours = _one_worker_job(client, live.namespace)
        _one_worker_job(client, second)
        live.wait_running(ours, 1)
        runtime = live.controller(kubeconfig=str(narrow.kubeconfig), watch_namespace=f"{live.namespace},{second}",
                                  policy="test-grow", policy_configmap=None)  # started: b's LIST failed, not hung
        held = not runtime.observer.excluded()
        first = runtime.controller.tick()
        if held:  # b failing for less than 10 s: ticks wait, as for any cache
            assert first.skipped is not None and f"pytorchjobs/{second}" in first.skipped, first.skipped
        wait_until(lambda: runtime.observer.excluded(), timeout_s=30, what=f"{second} to be left out")
        (excluded,) = runtime.observer.excluded()
        assert excluded.startswith(f"pytorchjobs/{second} (") and "forbidden" in excluded, excluded
        report = runtime.controller.tick()
        assert report.skipped is None, report.skipped
        assert [(r.action.job, r.action.kind, r.status) for r in report.results] == [
            (f"{live.namespace}/{ours}", ActionKind.SCALE_UP, "applied")]
        narrow.bind(second)
        wait_until(lambda: not runtime.observer.excluded() and len(runtime.observer.jobs) == 2, timeout_s=60,
                   what=f"{second}'s jobs back in the view")
    finally:
        narrow.close()
        live.bed.cleanup_namespace(second)


def test_a_stopped_informer_opens_no_further_watch(k8s_testbed: KubeTestBed, k8s_namespace: str) -> None:
    """lightkube's watch opens the next request itself at each server-side timeout, so an informer
    that only checked its stop flag between events watched on, one request per timeout, until the
    next event in its namespace (seen as a pod watch re-opened in a finished test's namespace)."""
    from gpu_scheduler.observe.kubernetes import Informer

    k8s_testbed.client().create(ConfigMap(metadata=ObjectMeta(name="watched", namespace=k8s_namespace)))
    connector = KubeConnector(k8s_testbed.kubeconfig)
    informer = Informer(connector, ConfigMap, lambda obj: obj.metadata.name, name="configmaps",
                        namespace=k8s_namespace, watch_timeout_s=1).start()
    try:
        assert informer.wait_synced(30)
        wait_until(lambda: connector.counts.watches >= 2, timeout_s=30, what="the watch re-opened after its 1 s window")
        assert informer.healthy and "watched" in informer.items()
    finally:
        informer.stop(timeout_s=0)
    wait_until(lambda: not informer.running, timeout_s=10, what="the stopped informer's thread to end")
    opened = connector.counts.watches
    time.sleep(2.5)  # two more windows: no request may follow
    assert connector.counts.watches == opened
    assert not informer.running
