"""The controller loop with small fakes of its ports (pure logic: the tick's orchestration).

The same behaviours are tested against a real kube-apiserver and a real Prometheus in
tests/integration/test_controller_k8s.py; here the fakes make every branch cheap to reach.
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from lightkube.resources.core_v1 import Node, Pod
from prometheus_client import generate_latest

import tests.gpu_scheduler.policies_for_tests  # noqa: F401  (registers the test policies)
from gpu_scheduler.actuate.apply import ApplyResult
from gpu_scheduler.actuate.plan import Action, ActionKind, PlanSettings
from gpu_scheduler.controller import Controller, ControllerMetrics, PolicySource
from gpu_scheduler.kube import ANNOTATION_PREFIX, NodeState, PodState, PyTorchJobState
from gpu_scheduler.observe.kubernetes import KubernetesUnavailable, node_state, pod_state, pytorchjob_state
from gpu_scheduler.observe.prometheus import MetricsSample, PodGpu, PrometheusUnavailable
from gpu_scheduler.settings import PolicyConfig
from tests.gpu_scheduler.kube_objects import T0, node, pod, pytorchjob


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (the fake API server's PATCH)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass
class FakeCluster:
    nodes: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    jobs: dict[str, dict] = field(default_factory=dict)
    synced: bool = True

    @dataclass
    class State:
        nodes: tuple[NodeState, ...]
        pods: tuple[PodState, ...]
        jobs: tuple[PyTorchJobState, ...]

    def state(self) -> State:
        if not self.synced:
            raise KubernetesUnavailable("Kubernetes caches not synced: pods (connection refused)")
        return self.State(
            nodes=tuple(node_state(Node.from_dict(n)) for n in self.nodes),
            pods=tuple(pod_state(Pod.from_dict(p)) for p in self.pods),
            jobs=tuple(s for s in (pytorchjob_state(j) for j in self.jobs.values()) if s is not None),
        )

    def add_job(self, name: str, workers_on: list[str], pending: int = 0, gpus: int = 1, **kw: Any) -> None:
        self.jobs[name] = pytorchjob("ns", name, replicas=len(workers_on) + pending, gpus=gpus, **kw)
        for i, n in enumerate(workers_on):
            self.pods.append(pod("ns", f"{name}-worker-{i}", job=name, node=n, gpus=gpus, started_at=T0 - 3600))
        for i in range(len(workers_on), len(workers_on) + pending):
            self.pods.append(pod("ns", f"{name}-worker-{i}", job=name, gpus=gpus))

    def replicas(self, name: str) -> int:
        return self.jobs[name]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]

    def annotations(self, name: str) -> dict[str, str]:
        return self.jobs[name]["metadata"].get("annotations", {})


@dataclass
class FakePrometheus:
    cluster: FakeCluster
    down: bool = False
    without_pods: set[str] = field(default_factory=set)
    calls: int = 0

    def observe(self, now_s: float) -> MetricsSample:
        self.calls += 1
        if self.down:
            raise PrometheusUnavailable("Prometheus at http://127.0.0.1:9 unreachable: ConnectError: refused")
        pods = {("ns", p["metadata"]["name"]): PodGpu(busy=0.9, source="gr_engine_active")
                for p in self.cluster.pods
                if p["spec"].get("nodeName") and p["metadata"]["name"] not in self.without_pods}
        return MetricsSample(taken_at_s=now_s, window_s=60, pods=pods, jobs={})


@dataclass
class FakeActuator:
    cluster: FakeCluster
    applied: list[Action] = field(default_factory=list)

    def apply(self, actions: Any) -> list[ApplyResult]:
        out = []
        for action in actions:
            self.applied.append(action)
            name = action.job.split("/")[1]
            for patch in action.patches:
                body = copy.deepcopy(patch.body)
                body.get("metadata", {}).pop("resourceVersion", None)
                self.cluster.jobs[name] = merge_patch(self.cluster.jobs[name], body)
            out.append(ApplyResult(action=action, status="applied"))
        return out


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Leader:
    leader: bool = True

    def is_leader(self) -> bool:
        return self.leader


def make(cluster: FakeCluster, policy: str = "test-grow", *, configmap: list | None = None, **kw: Any):
    prom = FakePrometheus(cluster)
    act = FakeActuator(cluster)
    clock = Clock()
    holder = configmap if configmap is not None else [None]
    source = PolicySource(PolicyConfig(name=policy), lambda: holder[0])
    metrics = ControllerMetrics()
    ctl = Controller(cluster=cluster, prometheus=prom, actuator=act, policies=source, clock=clock,
                     plan_settings=PlanSettings(pending_timeout_s=120, rollback_hold_s=600), metrics=metrics, **kw)
    return ctl, prom, act, clock, holder, metrics


def two_nodes() -> FakeCluster:
    return FakeCluster(nodes=[node("n0", 4), node("n1", 4)])


def test_tick_observes_decides_plans_and_applies() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])  # 2 of max 4
    ctl, _, act, _, _, _ = make(cluster)
    report = ctl.tick()
    assert report.skipped is None and report.policy == "test-grow" and report.jobs == 1
    assert [a.kind for a in act.applied] == [ActionKind.SCALE_UP]
    assert cluster.replicas("a") == 4
    assert ANNOTATION_PREFIX + "scale-up" in cluster.annotations("a")


def test_prometheus_down_keeps_every_job_as_it_is_and_logs_why(caplog: pytest.LogCaptureFixture) -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    cluster.add_job("b", [], pending=2, created_at=T0 + 1)
    ctl, prom, act, _, _, metrics = make(cluster)
    prom.down = True
    before = copy.deepcopy(cluster.jobs)
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler"):
        report = ctl.tick()
    assert report.skipped is not None and report.skipped.startswith("keeping every job as it is: Prometheus at")
    assert report.decision is None and act.applied == [] and cluster.jobs == before
    assert any(getattr(r, "reason", "").startswith("keeping every job as it is") for r in caplog.records)
    assert b"trainflow_scheduler_prometheus_up 0.0" in generate_latest(metrics.registry)
    prom.down = False
    assert ctl.tick().skipped is None and act.applied  # back to normal on the next tick


def test_policy_switch_through_the_configmap_takes_effect_at_the_next_tick() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    ctl, _, act, clock, configmap, _ = make(cluster, policy="test-keep")
    assert ctl.tick().decision.policy == "test-keep" and act.applied == []
    configmap[0] = {"policy.yaml": "policy: test-shrink\nparams: {}\n"}
    clock.now += 60
    report = ctl.tick()
    assert report.policy_switched and report.decision.policy == "test-shrink"
    assert [a.kind for a in act.applied] == [ActionKind.SCALE_DOWN] and cluster.replicas("a") == 1
    assert ctl.policies.switches == 1
    configmap[0] = None  # ConfigMap deleted: back to the default
    assert ctl.tick().policy == "test-keep"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"policy.yaml": "policy: no-such-policy"}, "unknown policy 'no-such-policy'"),
        ({"policy.yaml": "policy: test-oracle"}, "cannot run live"),
        ({"policy.yaml": "policy: test-keep\nparams: {bogus: 1}"}, "bad parameters"),
        ({"policy.yaml": "[unclosed"}, "not valid YAML"),
        ({"policy.yaml": "policy: test-keep\nspeed: 3"}, "unknown keys ['speed']"),
        # a traceback on the first tick, then the old policy with no error reported
        ({"policy.yaml": "policy: test-keep\nparams: {1: 2}"}, "policy params must be named by strings, got [1]"),
        # accepted before: Event.wait(inf) raised OverflowError in the loop, a crash loop from the ConfigMap
        ({"policy.yaml": "policy: test-keep\ninterval_s: .inf"}, "interval_s must be between 1 and 86400 s, got inf"),
        ({"policy.yaml": "policy: test-keep\ninterval_s: 1e10"}, "interval_s must be between 1 and 86400 s"),
        ({"policy.yaml": "policy: test-keep\ninterval_s: 0.01"}, "interval_s must be between 1 and 86400 s"),
        # silently dropped before (review 2026-11-30): a key beside the others, both forms at once
        ({"policy": "test-keep", "interval": "15"}, "unknown data keys ['interval']"),
        ({"policy.yaml": "policy: test-keep", "interval_s": "15"},
         "policy ConfigMap sets policy.yaml and ['interval_s']: use one form"),
    ],
)
def test_invalid_configmap_keeps_the_current_policy(data: dict, error: str) -> None:
    cluster = two_nodes()
    ctl, _, _, _, configmap, _ = make(cluster, policy="test-keep")
    configmap[0] = data
    report = ctl.tick()
    assert report.policy == "test-keep" and report.skipped is None
    assert error in (ctl.policies.error or "")


def test_configmap_interval_and_params_are_read() -> None:
    cluster = two_nodes()
    ctl, _, _, _, configmap, _ = make(cluster, policy="test-grow")
    configmap[0] = {"policy": "test-keep", "params": "note: hi", "interval_s": "15"}
    ctl.tick()
    assert ctl.policies.config.interval_s == 15.0 and ctl.policies.policy.note == "hi"


def test_job_without_dcgm_metrics_is_left_alone_while_others_change() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    cluster.add_job("b", ["n1"], created_at=T0 + 1)
    ctl, prom, act, _, _, _ = make(cluster)
    prom.without_pods = {"a-worker-1"}
    report = ctl.tick()
    assert "no DCGM metrics for pod(s) a-worker-1" in report.excluded["ns/a"]
    assert [a.job for a in act.applied] == ["ns/b"] and cluster.replicas("a") == 2
    # a's 2 GPUs on n0 stay a's: b may grow to 4 (n1: 3 more), never onto a's GPUs
    assert cluster.replicas("b") == 4


def test_a_failing_policy_changes_nothing() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0"])
    ctl, _, act, _, _, _ = make(cluster, policy="test-broken")
    report = ctl.tick()
    assert "policy 'test-broken' failed" in (report.skipped or "") and "broken on purpose" in report.skipped
    assert act.applied == []


def test_not_leader_or_unsynced_means_no_change() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0"])
    leader = Leader(leader=False)
    ctl, prom, act, _, _, _ = make(cluster, leader=leader)
    assert ctl.tick().skipped == "not the leader" and prom.calls == 0
    leader.leader = True
    cluster.synced = False
    assert "caches not synced" in (ctl.tick().skipped or "")
    assert act.applied == []


def test_pending_scale_up_is_rolled_back_and_held_without_thrash() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    ctl, _, _act, clock, _, _ = make(cluster)
    ctl.tick()
    assert cluster.replicas("a") == 4
    # the operator creates the 2 new pods, but they never get a node
    cluster.pods += [pod("ns", "a-worker-2", job="a"), pod("ns", "a-worker-3", job="a")]
    for _ in range(3):  # before the timeout: the job is left out (no thrash)
        clock.now += 30
        report = ctl.tick()
        assert "waiting for 2 worker pod(s)" in report.excluded["ns/a"] and not report.actions
    clock.now += 40  # 130 s > 120 s
    report = ctl.tick()
    assert [a.kind for a in report.actions] == [ActionKind.ROLLBACK]
    assert cluster.replicas("a") == 2
    assert report.actions[0].event.type == "Warning"
    cluster.pods = [p for p in cluster.pods if p["metadata"]["name"] not in ("a-worker-2", "a-worker-3")]
    clock.now += 60
    report = ctl.tick()  # held: test-grow may not scale it up again
    assert report.actions == [] and cluster.replicas("a") == 2
    assert report.decision is not None and report.decision["ns/a"].workers == 2
    clock.now += 600
    assert [a.kind for a in ctl.tick().actions] == [ActionKind.SCALE_UP]  # hold expired


def test_rollback_still_happens_while_prometheus_is_down() -> None:
    cluster = two_nodes()
    watch = '{"from":2,"to":4,"at":%s}' % (T0 - 500)
    cluster.add_job("a", ["n0", "n0"], pending=2, annotations={ANNOTATION_PREFIX + "scale-up": watch})
    ctl, prom, _act, _, _, _ = make(cluster)
    prom.down = True
    report = ctl.tick()
    assert report.skipped and [a.kind for a in report.actions] == [ActionKind.ROLLBACK]
    assert cluster.replicas("a") == 2


def test_controller_metrics_and_request_counts() -> None:
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    sent = [0]
    ctl, _, act, _, _, metrics = make(cluster, api_requests=lambda: sent[0])
    apply = act.apply

    def counting_apply(actions: Any) -> list[ApplyResult]:
        sent[0] += 7  # as if the writes took 7 requests
        return apply(actions)

    act.apply = counting_apply  # type: ignore[method-assign]
    report = ctl.tick()
    assert report.api_requests == 7
    assert report.requests_by_phase == {"observe_kubernetes": 0, "observe_prometheus": 0, "snapshot": 0,
                                        "decide": 0, "plan": 0, "apply": 7}
    text = generate_latest(metrics.registry).decode()
    assert 'trainflow_scheduler_decisions_total{outcome="scale_up",policy="test-grow"} 1.0' in text
    assert 'trainflow_scheduler_actions_total{kind="ScaledUp",status="applied"} 1.0' in text
    assert "trainflow_scheduler_api_requests_per_tick 7.0" in text
    assert 'trainflow_scheduler_policy_info{policy="test-grow"} 1.0' in text
    assert "trainflow_scheduler_tick_seconds_count 1.0" in text


def test_actions_per_tick_are_capped_releases_first() -> None:
    cluster = FakeCluster(nodes=[node("n0", 8)])
    cluster.add_job("big", ["n0"] * 4)                       # 4 -> 1 under test-shrink
    for i in range(3):
        cluster.add_job(f"s{i}", ["n0"], created_at=T0 + 1 + i, min_replicas=2, max_replicas=2)
    ctl, *_ = make(cluster, policy="test-shrink", max_actions_per_tick=2)
    report = ctl.tick()
    # the release (big 4->1) goes first; only one of the three 1->2 claims fits under the cap
    assert [a.kind for a in report.actions] == [ActionKind.SCALE_DOWN, ActionKind.SCALE_UP]
    assert len(report.deferred) == 2
    report = ctl.tick()  # the rest follows on the next tick
    assert sorted(a.kind for a in report.actions) == [ActionKind.SCALE_UP, ActionKind.SCALE_UP]


@pytest.mark.parametrize("error", ["ZeroDivisionError", "AttributeError", "IndexError", "RuntimeError"])
def test_a_policy_crash_of_any_kind_still_rolls_back_pending_scale_ups(error: str) -> None:
    """Review finding 11: safety actions (rollbacks) run whatever the policy raises."""
    cluster = two_nodes()
    watch = '{"from":2,"to":4,"at":%s}' % (T0 - 500)
    cluster.add_job("a", ["n0", "n0"], pending=2, annotations={ANNOTATION_PREFIX + "scale-up": watch})
    cluster.add_job("b", ["n1"], created_at=T0 + 1)
    ctl, _, act, _, _, _ = make(cluster, policy="test-crash")
    ctl.policies = PolicySource(PolicyConfig(name="test-crash", params={"error": error}))
    report = ctl.tick()
    assert report.skipped is not None and "policy 'test-crash' failed" in report.skipped and error in report.skipped
    assert report.decision is None
    assert [a.kind for a in act.applied] == [ActionKind.ROLLBACK] and cluster.replicas("a") == 2
    assert cluster.replicas("b") == 1  # the policy's jobs stay as they are


@dataclass
class LeaseLostWhileObserving(FakePrometheus):
    """Prometheus answers slowly: the Lease lapses while the tick waits for it."""

    leader: Leader = field(default_factory=Leader)

    def observe(self, now_s: float) -> MetricsSample:
        self.leader.leader = False
        return super().observe(now_s)


def test_a_follower_reports_no_jobs() -> None:
    """Review 2026-11-30: a former leader kept exporting its last job counts, so sum() over the
    replicas counted the jobs twice."""
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    leader = Leader(leader=True)
    ctl, _, _, _, _, metrics = make(cluster, "test-keep", leader=leader)
    ctl.tick()
    assert b'trainflow_scheduler_jobs{state="managed"} 1.0' in generate_latest(metrics.registry)
    leader.leader = False
    ctl.tick()
    assert b'trainflow_scheduler_jobs{state="managed"} 0.0' in generate_latest(metrics.registry)


def test_leadership_lost_during_a_tick_writes_nothing() -> None:
    """Review finding 11: leadership is checked again before anything is written."""
    cluster = two_nodes()
    watch = '{"from":2,"to":4,"at":%s}' % (T0 - 500)
    cluster.add_job("a", ["n0", "n0"], pending=2, annotations={ANNOTATION_PREFIX + "scale-up": watch})
    cluster.add_job("b", ["n1"], created_at=T0 + 1)
    leader = Leader(leader=True)
    ctl, _, act, _, _, _ = make(cluster, leader=leader)
    ctl._prometheus = LeaseLostWhileObserving(cluster, leader=leader)
    before = copy.deepcopy(cluster.jobs)
    report = ctl.tick()
    assert act.applied == [] and cluster.jobs == before  # neither the rollback of a nor b's scale-up
    assert report.skipped is not None and "lost the lease" in report.skipped
    assert report.results == []


class Crash(BaseException):
    """The controller process dies (nothing after the raise runs; not an Exception a tick catches)."""


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 ``test`` / ``add`` / ``replace`` (what the planner sends), on a copy; a failed
    ``test`` raises, as the API server refuses the whole patch."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if op["op"] == "test":
            assert node[key] == op["value"], f"test failed at {op['path']}"
        elif op["op"] in ("add", "replace"):
            node[key] = copy.deepcopy(op["value"])
        else:
            raise AssertionError(f"unexpected op {op['op']}")
    return doc


@dataclass
class CrashingActuator(FakeActuator):
    """Applies merge and JSON patches; on a ``crash_on`` action it sends the first patch, then the
    process 'dies'."""

    crash_on: ActionKind | None = None

    def apply(self, actions: Any) -> list[ApplyResult]:
        out = []
        for action in actions:
            self.applied.append(action)
            name = action.job.split("/")[1]
            for i, patch in enumerate(action.patches):
                if i == 1 and action.kind == self.crash_on:
                    self.crash_on = None
                    raise Crash(f"killed between the patches of {action.kind.value}")
                body = copy.deepcopy(patch.body)
                if patch.patch_type == "json":
                    self.cluster.jobs[name] = json_patch(self.cluster.jobs[name], body)
                else:
                    body.get("metadata", {}).pop("resourceVersion", None)
                    self.cluster.jobs[name] = merge_patch(self.cluster.jobs[name], body)
            out.append(ApplyResult(action=action, status="applied"))
        return out


def test_a_crash_between_the_reshape_patches_is_finished_by_the_next_controller() -> None:
    """Review finding 11: suspend -> patch template -> resume survives a controller killed after the
    template patch and before the resume; a fresh controller (empty memory) finishes it once."""
    from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST

    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"], annotations={GPUS_PER_WORKER_REQUEST: "2"})  # nprocPerNode "1"
    ctl, _, _, clock, _, _ = make(cluster, policy="test-keep")
    actuator = CrashingActuator(cluster, crash_on=ActionKind.RESHAPE_RESUME)
    ctl._actuator = actuator
    assert [a.kind for a in ctl.tick().actions] == [ActionKind.RESHAPE_SUSPEND]
    assert cluster.jobs["a"]["spec"]["runPolicy"]["suspend"] is True
    cluster.pods = []  # the operator deletes the suspended job's pods
    clock.now += 60
    with pytest.raises(Crash):
        ctl.tick()
    job = cluster.jobs["a"]
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][1]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"  # the template patch went through
    assert job["spec"]["runPolicy"]["suspend"] is True  # the resume did not
    assert ANNOTATION_PREFIX + "reshape" in cluster.annotations("a")
    # A new controller process: nothing in memory, everything it needs on the job.
    restarted, _, _, clock2, _, _ = make(cluster, policy="test-keep")
    restarted._actuator = CrashingActuator(cluster)
    clock2.now = clock.now + 30
    report = restarted.tick()
    assert [a.kind for a in report.actions] == [ActionKind.RESHAPE_RESUME]
    job = cluster.jobs["a"]
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][1]
    assert job["spec"]["runPolicy"]["suspend"] is False and cluster.replicas("a") == 1  # 2 GPUs / 2 per worker
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2", "memory": "4Gi"}
    assert job["spec"]["nprocPerNode"] == "2"  # one rank per GPU, as before
    annotations = cluster.annotations("a")
    assert ANNOTATION_PREFIX + "reshape" not in annotations and annotations[ANNOTATION_PREFIX + "restarts"] == "1"
    assert ANNOTATION_PREFIX + "suspended-by" not in annotations
    # The next tick only watches the new pods: no second template patch, no second restart.
    clock2.now += 30
    assert [a.kind for a in restarted.tick().actions] == []
    assert cluster.annotations("a")[ANNOTATION_PREFIX + "restarts"] == "1"


def test_managed_gc_pauses_the_automatic_collections_during_a_tick_only() -> None:
    import gc

    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    ctl, prom, act, _, _, _ = make(cluster, manage_gc=True)
    seen: list[bool] = []
    apply = act.apply
    act.apply = lambda actions: (seen.append(gc.isenabled()), apply(actions))[1]  # type: ignore[method-assign]
    try:
        assert gc.isenabled()
        report = ctl.tick()
        assert report.skipped is None and seen == [False]  # off while the tick ran ...
        assert gc.isenabled() and "gc" in report.phases_cpu_s  # ... on again after its one collection
        prom.down = True
        assert ctl.tick().skipped is not None and gc.isenabled()  # a skipped tick turns it back on too
        gc.disable()  # a process that turned it off itself keeps it off
        ctl.tick()
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
        ctl.close()


def test_a_scrape_that_sees_a_tick_counted_sees_that_ticks_leader_gauge() -> None:
    # /metrics is served from another thread while a tick records its metrics one by one: the
    # tick counter goes last, so "ticks_total >= 1" implies the rest of that tick is recorded
    # (a scrape once read ticks_total 1 with trainflow_scheduler_leader still 0).
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    ctl, _, _, _, _, metrics = make(cluster, leader=Leader(True))
    seen_at_count: list[bytes] = []
    ok = metrics.ticks.labels(result="ok")
    count = ok.inc

    def inc(amount: float = 1) -> None:
        seen_at_count.append(generate_latest(metrics.registry))  # what a scrape at that moment reads
        count(amount)

    ok.inc = inc  # type: ignore[method-assign]
    ctl.tick()
    (scrape,) = seen_at_count
    assert b"trainflow_scheduler_leader 1.0" in scrape
    assert b'trainflow_scheduler_jobs{state="managed"} 1.0' in scrape


def test_a_gpus_per_worker_request_above_every_nodes_gpus_is_refused_by_the_controller() -> None:
    """The controller bounds GPUs-per-worker requests by its nodes' allocatable GPUs (4 each here)."""
    from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST

    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"], annotations={GPUS_PER_WORKER_REQUEST: "5"})
    ctl, _, _, _, _, _ = make(cluster, policy="test-keep")
    (action,) = ctl.tick().actions
    assert action.kind == ActionKind.RESHAPE_REFUSED and "the most any node has is 4" in action.reason
    assert GPUS_PER_WORKER_REQUEST not in cluster.annotations("a") and not cluster.jobs["a"]["spec"]["runPolicy"].get(
        "suspend")


@pytest.mark.parametrize("unnoticed", [False, True], ids=["a-follower-tick-between", "lost-and-won-between-ticks"])
def test_a_replica_leading_again_rebuilds_its_ledger_from_the_annotations(unnoticed: bool) -> None:
    """Review 2026-11-30: a replica that led, lost the Lease for two hours and won it back kept its
    in-memory ledger: it added the whole gap to attained service and would write its old throughput
    back over what the other leader measured and persisted. Also when the Lease was lost and won
    back between two of its ticks (a new term of the elector)."""
    cluster = two_nodes()
    cluster.add_job("a", ["n0", "n0"])
    leader = Leader(leader=True)
    ctl, _, _, clock, _, _ = make(cluster, "test-keep", leader=leader)
    ctl.tick()
    first = ctl.ledger
    if unnoticed:
        leader.terms = 2  # type: ignore[attr-defined]  # a LeaderElector counts them
    else:
        leader.leader = False
        clock.now = T0 + 60
        assert ctl.tick().skipped == "not the leader"
        leader.leader = True
    # meanwhile the other leader measured the job at 2 and 4 workers and persisted its service
    other = {"unit": "samples/s", "by_workers": {"2": 100.0, "4": 190.0}}
    cluster.annotations("a").update({
        ANNOTATION_PREFIX + "throughput": json.dumps(other),
        ANNOTATION_PREFIX + "attained-service": json.dumps({"gpu_s": 3000.0, "at": T0 + 7100}),
    })
    cluster.jobs["a"]["metadata"]["annotations"] = cluster.annotations("a")
    clock.now = T0 + 7200
    ctl.tick()
    assert ctl.ledger is not first
    entry = ctl.ledger._jobs["ns/a"]
    assert dict(entry.book.by_workers) == {2: 100.0, 4: 190.0}
