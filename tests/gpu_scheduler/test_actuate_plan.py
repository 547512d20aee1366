"""The planner (pure): decisions and safety rules -> patches and Events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_scheduler.actuate.plan import (
    GPUS_PER_WORKER_REQUEST,
    ActionKind,
    PlanSettings,
    order_actions,
    plan_decision,
    plan_safety,
)
from gpu_scheduler.kube import ANNOTATION_PREFIX, FIELD_MANAGER, POLICY_ANNOTATION_PREFIX, JobMemo, JobView
from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Node, Outcome, Placement
from gpu_scheduler.observe.kubernetes import pytorchjob_state
from tests.gpu_scheduler.kube_objects import T0, pytorchjob

WORKER_CONTAINERS = ("spec", "pytorchReplicaSpecs", "Worker", "template", "spec", "containers")

SETTINGS = PlanSettings(pending_timeout_s=120, rollback_hold_s=600)
SCALE_UP = ANNOTATION_PREFIX + "scale-up"
HOLD = ANNOTATION_PREFIX + "hold"
SUSPENDED_BY = ANNOTATION_PREFIX + "suspended-by"


def jview(name: str = "a", *, bound: dict[str, int] | None = None, pending: int = 0, **kw: Any) -> JobView:
    state = pytorchjob_state(pytorchjob("ns", name, **kw))
    assert state is not None
    placement = Placement.of(bound or {})
    pods = tuple(f"{name}-worker-{i}" for i in range(placement.workers + pending))
    return JobView(job=state, placement=placement, pending_workers=pending, pods=pods,
                   placement_since_s=T0 - 100 if placement else None)


def decide(views: dict[str, JobView], targets: dict[str, dict[str, int]], *, reason: str = "because",
           annotations: dict[str, dict[str, str]] | None = None) -> tuple[Decision, ClusterSnapshot]:
    jobs = tuple(Job(name=k, submit_time_s=T0, min_workers=v.job.min_workers, max_workers=v.job.max_workers,
                     gpus_per_worker=v.job.gpus_per_worker, placement=v.placement) for k, v in views.items())
    snap = ClusterSnapshot(nodes=(Node(name="n0", gpus=8), Node(name="n1", gpus=8)), jobs=jobs, taken_at_s=T0)
    decision = Decision.from_placements(snap, {k: Placement.of(t) for k, t in targets.items()}, policy="p",
                                        now_s=T0, reasons={k: reason for k in targets}, annotations=annotations)
    decision.validate(snap)
    return decision, snap


def only(actions: tuple, kind: ActionKind):
    assert [a.kind for a in actions] == [kind]
    return actions[0]


def _conflict() -> Exception:
    """The API server's 409 Conflict as lightkube raises it."""
    from lightkube.core.exceptions import ApiError

    class Answer:
        status_code = 409

        def json(self) -> dict:
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "the object has been modified", "reason": "Conflict", "code": 409}

    return ApiError(response=Answer())  # type: ignore[arg-type]


def test_scale_up_is_one_merge_patch_with_replicas_watch_and_resource_version() -> None:
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2, rv="7")}
    decision, snap = decide(views, {"ns/a": {"n0": 2, "n1": 2}})
    a = only(plan_decision(decision, snap, views, T0, SETTINGS), ActionKind.SCALE_UP)
    (patch,) = a.patches
    assert patch.patch_type == "merge" and patch.subresource == ""
    assert patch.body["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}
    meta = patch.body["metadata"]
    assert meta["resourceVersion"] == "7"
    assert dict(patch.guard) == {("metadata", "uid"): "uid-a", ("spec", "pytorchReplicaSpecs", "Worker", "replicas"): 2,
                                 ("spec", "runPolicy", "suspend"): None, ("spec", "elasticPolicy", "minReplicas"): 1,
                                 ("spec", "elasticPolicy", "maxReplicas"): 4,
                                 (*WORKER_CONTAINERS, 1, "resources", "limits", "nvidia.com/gpu"): "1"}
    assert json.loads(meta["annotations"][SCALE_UP]) == {"from": 2, "to": 4, "at": T0}
    assert meta["annotations"][ANNOTATION_PREFIX + "requested-workers"] == "2"
    assert meta["annotations"][ANNOTATION_PREFIX + "restarts"] == "1"
    assert (a.from_workers, a.to_workers, a.outcome) == (2, 4, Outcome.SCALE_UP)
    assert a.event is not None and a.event.reason == "ScaledUp" and "p: because" in a.event.message


def test_scale_subresource_variant_splits_replicas_from_annotations() -> None:
    views = {"ns/a": jview(bound={"n0": 3}, replicas=3)}
    decision, snap = decide(views, {"ns/a": {"n0": 1}})
    a = only(plan_decision(decision, snap, views, T0, PlanSettings(replicas_via="scale")), ActionKind.SCALE_DOWN)
    merge, scale = a.patches
    assert "spec" not in merge.body and merge.body["metadata"]["annotations"]
    assert scale.subresource == "scale" and scale.body["spec"] == {"replicas": 1}
    # The scale patch has the same precondition and guard as the merge patch (the applier sends it
    # with the resourceVersion of the merge patch's answer).
    assert scale.body["metadata"] == {"resourceVersion": merge.body["metadata"]["resourceVersion"]}
    assert scale.guard == merge.guard and dict(scale.guard)[("metadata", "uid")]


def test_scale_subresource_variant_resumes_with_the_worker_count_in_the_same_patch() -> None:
    """Review finding (scaleorder): with ``replicas_via="scale"`` a START/RESUME sent ``suspend:
    false`` first and the worker count after it, so the operator could create pods for the old
    count. The count now travels in the resume's merge patch (one atomic request)."""
    queued = {"ns/a": jview(replicas=8, max_replicas=8, suspend=True, annotations={SUSPENDED_BY: FIELD_MANAGER})}
    decision, snap = decide(queued, {"ns/a": {"n0": 2}})
    a = only(plan_decision(decision, snap, queued, T0, PlanSettings(replicas_via="scale")), ActionKind.START)
    (patch,) = a.patches
    assert patch.subresource == "" and patch.patch_type == "merge"
    assert patch.body["spec"] == {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}
    assert dict(patch.guard)[("spec", "runPolicy", "suspend")] is True
    # Suspending leaves the worker count alone; a resize of a running job still uses the subresource.
    running = {"ns/a": jview(bound={"n0": 2}, replicas=2)}
    decision, snap = decide(running, {"ns/a": {"n0": 3}})
    a = only(plan_decision(decision, snap, running, T0, PlanSettings(replicas_via="scale")), ActionKind.SCALE_UP)
    assert [p.subresource for p in a.patches] == ["", "scale"]


def test_wait_suspends_and_marks_a_job_that_never_ran_and_start_resumes_it() -> None:
    views = {"ns/a": jview(replicas=2, pending=2)}
    decision, snap = decide(views, {})
    a = only(plan_decision(decision, snap, views, T0, SETTINGS), ActionKind.QUEUE)
    assert a.patches[0].body["spec"] == {"runPolicy": {"suspend": True}}
    assert a.patches[0].body["metadata"]["annotations"][SUSPENDED_BY] == FIELD_MANAGER
    queued = {"ns/a": jview(replicas=2, suspend=True, annotations={SUSPENDED_BY: FIELD_MANAGER})}
    decision, snap = decide(queued, {"ns/a": {"n0": 3}})
    a = only(plan_decision(decision, snap, queued, T0, SETTINGS), ActionKind.START)
    body = a.patches[0].body
    assert body["spec"] == {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}
    assert body["metadata"]["annotations"][SUSPENDED_BY] is None
    assert json.loads(body["metadata"]["annotations"][SCALE_UP])["from"] == 0
    assert ANNOTATION_PREFIX + "restarts" not in body["metadata"]["annotations"]  # first start is free


def test_preempt_then_resume_counts_a_restart() -> None:
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2, started_at=T0 - 50)}
    decision, snap = decide(views, {})
    only(plan_decision(decision, snap, views, T0, SETTINGS), ActionKind.PREEMPT)
    resumed = {"ns/a": jview(replicas=2, suspend=True, started_at=T0 - 50,
                             annotations={SUSPENDED_BY: FIELD_MANAGER})}
    decision, snap = decide(resumed, {"ns/a": {"n1": 2}})
    a = only(plan_decision(decision, snap, resumed, T0, SETTINGS), ActionKind.RESUME)
    assert a.patches[0].body["metadata"]["annotations"][ANNOTATION_PREFIX + "restarts"] == "1"


def test_keep_changes_nothing_and_pending_extras_are_trimmed_or_watched() -> None:
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2), "ns/b": jview("b", bound={"n1": 1}, pending=1, replicas=2),
             "ns/c": jview("c", bound={"n1": 1}, pending=1, replicas=2)}
    decision, snap = decide(views, {"ns/a": {"n0": 2}, "ns/b": {"n1": 1}, "ns/c": {"n1": 2}})
    actions = {a.job: a for a in plan_decision(decision, snap, views, T0, SETTINGS)}
    assert "ns/a" not in actions
    assert actions["ns/b"].kind is ActionKind.TRIM
    assert actions["ns/b"].patches[0].body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert actions["ns/c"].kind is ActionKind.WATCH and actions["ns/c"].event is None
    assert "spec" not in actions["ns/c"].patches[0].body


def test_a_pending_worker_below_the_target_is_not_trimmed_by_deleting_running_ones() -> None:
    """Review (2026-11-30): worker-1 of a 4-worker job was evicted and its replacement waits for a
    node; the policy kept the 3 bound workers, so TRIM set replicas 3 and the training operator
    deleted worker-3 (running), not worker-1 (it keeps indices 0..replicas-1); next tick the same
    again, until the job ran on one worker. Only a pending worker above the target is trimmed."""
    import dataclasses

    low = {"ns/a": dataclasses.replace(jview(bound={"n0": 3}, pending=1, replicas=4), pending_indices=(1,))}
    decision, snap = decide(low, {"ns/a": {"n0": 3}})
    assert plan_decision(decision, snap, low, T0, SETTINGS) == ()
    high = {"ns/a": dataclasses.replace(low["ns/a"], pending_indices=(3,))}
    a = only(plan_decision(decision, snap, high, T0, SETTINGS), ActionKind.TRIM)
    assert a.patches[0].body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3


def test_a_change_the_operator_has_not_carried_out_yet_is_not_undone() -> None:
    """Review 2026-11-30: right after a scale-down (replicas 2) the operator had not yet stopped the
    surplus workers, so the policy saw the 4 still bound and kept them: the planner set replicas back
    to 4 (labelled a trim). A job just suspended with its pods still live was resumed the same way."""
    views = {"ns/a": jview(bound={"n0": 4}, replicas=2, started_at=T0 - 50),
             "ns/b": jview("b", bound={"n1": 2}, replicas=2, suspend=True, started_at=T0 - 50,
                           annotations={SUSPENDED_BY: FIELD_MANAGER})}
    decision, snap = decide(views, {"ns/a": {"n0": 4}, "ns/b": {"n1": 2}})
    assert plan_decision(decision, snap, views, T0, SETTINGS) == ()


def test_policy_annotations_are_prefixed_and_deleted_with_empty_values() -> None:
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2, annotations={POLICY_ANNOTATION_PREFIX + "old": "1"})}
    decision, snap = decide(views, {"ns/a": {"n0": 2}}, annotations={"ns/a": {"queue": "2", "old": ""}})
    a = only(plan_decision(decision, snap, views, T0, SETTINGS), ActionKind.ANNOTATE)
    assert a.patches[0].body["metadata"]["annotations"] == {
        POLICY_ANNOTATION_PREFIX + "queue": "2", POLICY_ANNOTATION_PREFIX + "old": None}
    assert "spec" not in a.patches[0].body and a.event is None


def test_watched_scale_up_is_confirmed_once_all_workers_are_bound() -> None:
    watch = json.dumps({"from": 2, "to": 4, "at": T0 - 10})
    views = {"ns/a": jview(bound={"n0": 4}, replicas=4, annotations={SCALE_UP: watch})}
    a = only(plan_safety(views, T0, SETTINGS), ActionKind.CONFIRM)
    assert a.patches[0].body["metadata"]["annotations"][SCALE_UP] is None
    assert a.event is None


def test_pending_scale_up_rolls_back_after_the_timeout_with_a_warning_and_a_hold() -> None:
    watch = json.dumps({"from": 2, "to": 4, "at": T0 - 121})
    views = {"ns/a": jview(bound={"n0": 2}, pending=2, replicas=4, annotations={SCALE_UP: watch})}
    assert plan_safety(views, T0 - 2, SETTINGS) == ()  # not yet
    a = only(plan_safety(views, T0, SETTINGS), ActionKind.ROLLBACK)
    body = a.patches[0].body
    assert body["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}
    assert body["metadata"]["annotations"][SCALE_UP] is None
    assert json.loads(body["metadata"]["annotations"][HOLD]) == {"until": T0 + 600, "max_workers": 2}
    assert a.event is not None and a.event.type == "Warning" and a.event.reason == "ScaleUpRolledBack"
    assert "2 worker pod(s) still not bound 121 s after scaling 2->4" in a.event.message


def test_failed_start_rolls_back_to_suspended() -> None:
    watch = json.dumps({"from": 0, "to": 2, "at": T0 - 500})
    views = {"ns/a": jview(pending=2, replicas=2, annotations={SCALE_UP: watch})}
    a = only(plan_safety(views, T0, SETTINGS), ActionKind.ROLLBACK)
    body = a.patches[0].body
    assert body["spec"] == {"runPolicy": {"suspend": True}}
    assert body["metadata"]["annotations"][SUSPENDED_BY] == FIELD_MANAGER
    assert json.loads(body["metadata"]["annotations"][HOLD])["max_workers"] == 0


def test_watch_superseded_by_someone_elses_change_is_dropped() -> None:
    watch = json.dumps({"from": 2, "to": 4, "at": T0 - 500})
    views = {"ns/a": jview(bound={"n0": 2}, pending=1, replicas=3, annotations={SCALE_UP: watch})}
    a = only(plan_safety(views, T0, SETTINGS), ActionKind.CONFIRM)
    assert "superseded" in a.reason and "spec" not in a.patches[0].body


def test_start_suspended_by_someone_else_while_pending_is_superseded_not_rolled_back() -> None:
    """Review finding (usersuspend): the scheduler starts a job (watch from 0); a user or Kueue
    suspends it while its pods are Pending. Rolling the start back would stamp ``suspended-by``
    on a job the scheduler did not suspend, and a later tick could resume it."""
    watch = json.dumps({"from": 0, "to": 2, "at": T0 - 500})
    ann = {SCALE_UP: watch, ANNOTATION_PREFIX + "requested-workers": "2"}
    views = {"ns/a": jview(replicas=2, suspend=True, annotations=ann)}
    a = only(plan_safety(views, T0, SETTINGS), ActionKind.CONFIRM)
    assert "superseded" in a.reason and "suspended by someone else" in a.reason
    (patch,) = a.patches
    assert "spec" not in patch.body and a.event is None
    annotations = patch.body["metadata"]["annotations"]
    assert annotations == {SCALE_UP: None}  # no suspended-by, no hold
    after = {k: v for k, v in {**ann, **annotations}.items() if v is not None}
    assert JobMemo.parse(after) == JobMemo(requested_workers=2)  # left to its owner, no hold
    # A start the scheduler itself suspended again (its mark is on the job) still rolls back.
    ours = {"ns/a": jview(replicas=2, suspend=True, annotations={**ann, SUSPENDED_BY: FIELD_MANAGER})}
    only(plan_safety(ours, T0, SETTINGS), ActionKind.ROLLBACK)


def test_gpus_per_worker_change_goes_suspend_then_patch_then_resume() -> None:
    start = {"ns/a": jview(bound={"n0": 4}, replicas=4, gpus=1, annotations={GPUS_PER_WORKER_REQUEST: "2"})}
    a = only(plan_safety(start, T0, SETTINGS), ActionKind.RESHAPE_SUSPEND)
    body = a.patches[0].body
    assert body["spec"] == {"runPolicy": {"suspend": True}}
    ann = body["metadata"]["annotations"]
    assert json.loads(ann[ANNOTATION_PREFIX + "reshape"]) == {"gpus_per_worker": 2, "workers": 2,
                                                              "requested_workers": 2}
    assert ann[GPUS_PER_WORKER_REQUEST] is None and ann[SUSPENDED_BY] == FIELD_MANAGER
    memo = {k: v for k, v in ann.items() if v is not None}
    # pods still terminating: wait
    waiting = {"ns/a": JobView(job=pytorchjob_state(pytorchjob("ns", "a", replicas=4, gpus=1, suspend=True,
                                                               annotations=memo)), terminating_workers=2)}
    assert plan_safety(waiting, T0 + 5, SETTINGS) == ()
    memo[ANNOTATION_PREFIX + "throughput"] = json.dumps({"unit": "samples/s", "by_workers": {"4": 400.0}})
    gone = {"ns/a": jview(replicas=4, gpus=1, suspend=True, rv="9", annotations=memo)}
    assert dict(gone["ns/a"].job.memo.throughput) == {4: 400.0}
    a = only(plan_safety(gone, T0 + 10, SETTINGS), ActionKind.RESHAPE_RESUME)
    template, resume = a.patches
    assert template.patch_type == "json"
    ops = template.body
    assert ops[0] == {"op": "test", "path": "/spec/runPolicy/suspend", "value": True}
    # the container's resources still those observed: a user's edit meanwhile is not overwritten
    assert ops[1] == {"op": "test", "path": "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/1/resources",
                      "value": {"limits": {"nvidia.com/gpu": "1", "memory": "4Gi"}, "requests": {"cpu": "1"}}}
    assert ops[2]["path"] == "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/1/resources"
    assert ops[2]["value"]["limits"] == {"nvidia.com/gpu": "2", "memory": "4Gi"}
    assert ops[3] == {"op": "replace", "path": "/spec/nprocPerNode", "value": "2"}
    assert resume.body["spec"] == {"runPolicy": {"suspend": False}, "pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}
    assert resume.body["metadata"]["annotations"][ANNOTATION_PREFIX + "reshape"] is None
    # review 2026-11-30: the request is carried over in GPUs (4 x 1 -> 2 x 2), not left as 4 workers
    # (of 2 GPUs now), and throughput measured per worker count of 1-GPU workers is dropped
    changed = resume.body["metadata"]["annotations"]
    after = JobMemo.parse({k: v for k, v in {**memo, **changed}.items() if v is not None})
    assert after.requested_workers == 2 and dict(after.throughput) == {}
    # The template patch landed and the resume failed (an error, a lost Lease): the retry reads the new
    # size from the template, and still carries the request over from the old one (review 2026-11-30:
    # it kept 4 workers, of 2 GPUs now).
    patched = {"ns/a": jview(replicas=4, gpus=2, suspend=True, rv="10", annotations=memo)}
    retry = only(plan_safety(patched, T0 + 20, SETTINGS), ActionKind.RESHAPE_RESUME)
    changed = retry.patches[1].body["metadata"]["annotations"]
    assert JobMemo.parse({k: v for k, v in {**memo, **changed}.items() if v is not None}).requested_workers == 2


def test_gpus_per_worker_change_is_refused_when_ranks_are_set_in_the_deprecated_field() -> None:
    """Review finding (nproc): with ranks per worker only in ``elasticPolicy.nProcPerNode``, the
    template patch's ``replace /spec/nprocPerNode`` fails (422: no such path) and the operator's
    webhook refuses setting both fields, so the job would stay suspended for good. The request is
    dropped with a Warning Event instead, and the running job is not suspended."""
    running = {"ns/a": jview(bound={"n0": 2}, replicas=2, gpus=4, elastic_nproc=4,
                             annotations={GPUS_PER_WORKER_REQUEST: "2"})}
    a = only(plan_safety(running, T0, SETTINGS), ActionKind.RESHAPE_REFUSED)
    (patch,) = a.patches
    assert "spec" not in patch.body
    assert patch.body["metadata"]["annotations"][GPUS_PER_WORKER_REQUEST] is None
    assert ANNOTATION_PREFIX + "reshape" not in patch.body["metadata"]["annotations"]
    assert a.event is not None and a.event.type == "Warning" and a.event.reason == "ReshapeRefused"
    assert "elasticPolicy.nProcPerNode" in a.event.message and (a.from_workers, a.to_workers) == (2, 2)
    assert not a.kind.releases_gpus and not a.kind.claims_gpus
    # Ranks per worker that do not follow the GPUs (here 1 per worker) need no nprocPerNode patch:
    # the change goes ahead.
    one_rank = {"ns/a": jview(bound={"n0": 2}, replicas=2, gpus=4, elastic_nproc=1,
                              annotations={GPUS_PER_WORKER_REQUEST: "2"})}
    only(plan_safety(one_rank, T0, SETTINGS), ActionKind.RESHAPE_SUSPEND)
    # A change already under way (suspended by an earlier controller) is abandoned once the pods
    # are gone: the job is resumed as it was, never left suspended.
    memo = {ANNOTATION_PREFIX + "reshape": '{"gpus_per_worker":2,"workers":4}', SUSPENDED_BY: FIELD_MANAGER,
            ANNOTATION_PREFIX + "requested-workers": "2"}
    stuck = {"ns/a": jview(replicas=2, gpus=4, elastic_nproc=4, suspend=True, annotations=memo)}
    a = only(plan_safety(stuck, T0, SETTINGS), ActionKind.RESUME)
    (patch,) = a.patches
    assert patch.patch_type == "merge" and patch.body["spec"] == {"runPolicy": {"suspend": False}}
    ann = patch.body["metadata"]["annotations"]
    assert ann[ANNOTATION_PREFIX + "reshape"] is None and ann[SUSPENDED_BY] is None
    assert json.loads(ann[SCALE_UP]) == {"from": 0, "to": 2, "at": T0}
    assert a.event is not None and a.event.type == "Warning" and a.event.reason == "ReshapeRefused"


def test_order_releases_before_claims() -> None:
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2), "ns/b": jview("b", bound={"n1": 4}, replicas=4)}
    decision, snap = decide(views, {"ns/a": {"n0": 4}, "ns/b": {"n1": 1}})
    kinds = [a.kind for a in order_actions(plan_decision(decision, snap, views, T0, SETTINGS))]
    assert kinds == [ActionKind.SCALE_DOWN, ActionKind.SCALE_UP]


def test_no_plan_ever_uses_a_strategic_merge_patch() -> None:
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2)}
    for targets in ({"ns/a": {"n0": 4}}, {"ns/a": {"n0": 1}}, {}):
        decision, snap = decide(views, targets)
        for action in plan_decision(decision, snap, views, T0, SETTINGS):
            assert all(p.patch_type in ("merge", "json") for p in action.patches)


def test_settings_validate() -> None:
    with pytest.raises(ValueError, match="replicas_via"):
        PlanSettings(replicas_via="strategic")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pending_timeout_s"):
        PlanSettings(pending_timeout_s=0)


def test_memo_defaults_are_stable() -> None:
    assert JobMemo.parse({}) == JobMemo()


def test_actuator_stops_sending_once_the_lease_is_lost() -> None:
    """Review finding 11: leadership is checked before each action, not only at the tick's start."""
    from gpu_scheduler.actuate.apply import Actuator

    views = {k: jview(k.split("/")[1], bound={"n0": 1}, replicas=1) for k in ("ns/a", "ns/b", "ns/c")}
    decision, snap = decide(views, {k: {"n0": 2} for k in views})
    actions = plan_decision(decision, snap, views, T0, SETTINGS)
    sent: list[str] = []
    leading = [True]

    class Client:  # records the PATCHes; the lease lapses after the first one
        def patch(self, resource: Any, name: str, body: Any, **kw: Any) -> None:
            sent.append(name)
            leading[0] = False

    actuator = Actuator(Client(), record_events=False, max_concurrency=1, proceed=lambda: leading[0])  # type: ignore[arg-type]
    results = actuator.apply(actions)
    actuator.close()
    assert sent == ["a"]
    assert [(r.action.job, r.status) for r in results] == [("ns/a", "applied"), ("ns/b", "not_leader"),
                                                           ("ns/c", "not_leader")]


def test_the_lease_is_checked_before_every_request_of_an_action_not_only_its_first() -> None:
    """Review (2026-11-30): an action's second patch (``--replicas-via scale``, a reshape) and the
    re-sends after a 409 went out without a check, possibly after another replica took the Lease."""

    from gpu_scheduler.actuate.apply import Actuator

    leading = [True]

    class Client:  # every request is recorded; the lease lapses with the first one
        def __init__(self, conflict: bool) -> None:
            self.conflict, self.sent = conflict, []

        def patch(self, resource: Any, name: str, body: Any, **kw: Any) -> dict:
            self.sent.append("PATCH")
            leading[0] = False
            if self.conflict:
                raise _conflict()
            return {"metadata": {"resourceVersion": "8"}}

        def get(self, resource: Any, name: str, **kw: Any) -> dict:
            self.sent.append("GET")
            return {"metadata": {"uid": "uid-a", "resourceVersion": "9"},
                    "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}, "runPolicy": {}}}

    views = {"ns/a": jview(bound={"n0": 2}, replicas=2, uid="uid-a")}
    decision, snap = decide(views, {"ns/a": {"n0": 3}})
    for settings, conflict, message in (
        (PlanSettings(replicas_via="scale"), False, "lost the lease between the action's patches"),
        (SETTINGS, True, "lost the lease before resending after a conflict"),
    ):
        (action,) = plan_decision(decision, snap, views, T0, settings)
        leading[0] = True
        client = Client(conflict)
        actuator = Actuator(client, record_events=False, max_concurrency=1, proceed=lambda: leading[0])  # type: ignore[arg-type]
        try:
            (result,) = actuator.apply((action,))
        finally:
            actuator.close()
        assert client.sent == ["PATCH"], client.sent  # no second patch, no GET and re-send
        assert (result.status, result.message) == ("not_leader", message)


@pytest.mark.parametrize(("changed", "message"), [
    ({"max_replicas": 2}, "spec.elasticPolicy.maxReplicas changed since it was observed (4 -> 2)"),
    ({"gpus": 2}, "spec.pytorchReplicaSpecs.Worker.template.spec.containers.1.resources.limits.nvidia.com/gpu "
                  "changed since it was observed ('1' -> '2')"),
], ids=["maxReplicas", "worker-gpus"])
def test_a_409_after_the_bounds_or_the_workers_gpus_changed_drops_the_patch(changed: dict, message: str) -> None:
    """Review (2026-11-30): the guard compared uid, replicas and suspend only, so a scale-up planned
    within maxReplicas 4 was re-sent after a 409 although the user had lowered maxReplicas to 2
    meanwhile (workers past the maximum cannot join the rendezvous), and one planned for workers of
    1 GPU although the user had made them 2 GPUs each (twice the GPUs the policy had placed)."""

    from gpu_scheduler.actuate.apply import Actuator

    class Client:
        sent = 0

        def patch(self, *a: Any, **kw: Any) -> dict:
            self.sent += 1
            raise _conflict()

        def get(self, resource: Any, name: str, **kw: Any) -> dict:  # the job as the user left it
            return pytorchjob("ns", "a", uid="uid-a", rv="9", **changed)

    views = {"ns/a": jview(bound={"n0": 2}, replicas=2, uid="uid-a")}
    decision, snap = decide(views, {"ns/a": {"n0": 4}})
    client = Client()
    actuator = Actuator(client, record_events=False)  # type: ignore[arg-type]
    try:
        (result,) = actuator.apply(plan_decision(decision, snap, views, T0, SETTINGS))
    finally:
        actuator.close()
    assert client.sent == 1
    assert (result.status, result.message) == ("conflict", message)


def test_a_gpus_per_worker_request_no_node_can_hold_is_refused() -> None:
    """Review (2026-11-30): a request above every node's GPUs suspended the job, resumed it with
    workers no node could place, rolled the start back, and so on. Now it is refused at once
    (Warning Event) and the job keeps running as it is; without node figures nothing changes."""
    start = {"ns/a": jview(bound={"n0": 4}, replicas=4, gpus=1, annotations={GPUS_PER_WORKER_REQUEST: "16"})}
    a = only(plan_safety(start, T0, SETTINGS, max_node_gpus=8), ActionKind.RESHAPE_REFUSED)
    assert "spec" not in a.patches[0].body
    assert a.patches[0].body["metadata"]["annotations"][GPUS_PER_WORKER_REQUEST] is None
    assert a.event is not None and a.event.type == "Warning"
    assert a.event.message == ("GPUs per worker 1->16 refused: no node allocates 16 nvidia.com/gpu (the most any "
                               "node has is 8), so no worker of that size could start")
    only(plan_safety(start, T0, SETTINGS, max_node_gpus=16), ActionKind.RESHAPE_SUSPEND)
    only(plan_safety(start, T0, SETTINGS), ActionKind.RESHAPE_SUSPEND)


def test_a_job_that_ran_and_has_no_live_worker_is_left_alone() -> None:
    """Its last worker may have Succeeded a moment before the operator marks the job Succeeded
    (ended pods leave the controller's view first); the operator never marks a suspended job
    Succeeded, so suspending it here would leave its run waiting forever (CI, 2026-11-23: the
    end-to-end resize test's train step hung after its last step under the ``test-keep`` policy)."""
    finishing = {"ns/a": jview(replicas=1, started_at=T0 - 50)}
    for target in ({}, {"ns/a": {"n0": 2}}):  # neither suspended nor given workers (a pod would start)
        decision, snap = decide(finishing, target)
        assert plan_decision(decision, snap, finishing, T0, SETTINGS) == ()
    # Once the operator has recreated the workers (pending) the policy's 0 holds again, as it does
    # for a job that never ran, with no pod yet.
    recreated = {"ns/a": jview(replicas=1, pending=1, started_at=T0 - 50)}
    decision, snap = decide(recreated, {})
    only(plan_decision(decision, snap, recreated, T0, SETTINGS), ActionKind.QUEUE)
    never_ran = {"ns/a": jview(replicas=1)}
    decision, snap = decide(never_ran, {})
    only(plan_decision(decision, snap, never_ran, T0, SETTINGS), ActionKind.QUEUE)


def test_a_job_below_its_minimum_is_watched_and_then_suspended_not_rolled_back_to_itself() -> None:
    """Review finding: a job (min 2) lost a worker; its replacement stays pending. The rollback went
    "back" to max(min, 1) = 2 replicas, the size it already asked for: a no-op patch and a Warning
    every timeout, forever, the job holding the GPUs of a worker that cannot train alone."""
    views = {"ns/a": jview(bound={"n0": 1}, pending=1, replicas=2, min_replicas=2, max_replicas=2)}
    watch = only(plan_safety(views, T0, SETTINGS), ActionKind.WATCH)
    assert (watch.from_workers, watch.to_workers) == (1, 2) and watch.event is None
    (patch,) = watch.patches
    assert "spec" not in patch.body
    recorded = json.loads(patch.body["metadata"]["annotations"][SCALE_UP])
    assert recorded == {"from": 1, "to": 2, "at": T0}
    watched = {"ns/a": jview(bound={"n0": 1}, pending=1, replicas=2, min_replicas=2, max_replicas=2,
                             annotations={SCALE_UP: json.dumps(recorded)})}
    assert plan_safety(watched, T0 + 60, SETTINGS) == ()  # waiting
    rollback = only(plan_safety(watched, T0 + 120, SETTINGS), ActionKind.ROLLBACK)
    body = rollback.patches[0].body
    assert body["spec"] == {"runPolicy": {"suspend": True}}  # not replicas 2 again
    assert body["metadata"]["annotations"][SUSPENDED_BY] == FIELD_MANAGER
    assert "suspended (1 worker(s) cannot train below elasticPolicy minReplicas 2)" in rollback.event.message
    # bound again in time: confirmed, nothing suspended
    bound = {"ns/a": jview(bound={"n0": 2}, replicas=2, min_replicas=2, max_replicas=2,
                           annotations={SCALE_UP: json.dumps(recorded)})}
    assert only(plan_safety(bound, T0 + 60, SETTINGS), ActionKind.CONFIRM).to_workers == 2
    # at or above the minimum, pending workers are the policy's (a scale-up it asked for is watched there)
    assert plan_safety({"ns/b": jview("b", bound={"n0": 1}, pending=1, replicas=2, min_replicas=1)}, T0,
                       SETTINGS) == ()


def test_a_rollback_through_the_scale_subresource_lowers_the_workers_before_clearing_the_watch() -> None:
    """Review finding: the merge patch (watch cleared, hold set) went first; if the scale patch then
    failed, nothing tracked the rollback and the pending pods stayed. The worker count goes first now."""
    watch = json.dumps({"from": 2, "to": 4, "at": T0 - 121})
    views = {"ns/a": jview(bound={"n0": 2}, pending=2, replicas=4, annotations={SCALE_UP: watch})}
    a = only(plan_safety(views, T0, PlanSettings(pending_timeout_s=120, rollback_hold_s=600, replicas_via="scale")),
             ActionKind.ROLLBACK)
    scale, merge = a.patches
    assert scale.subresource == "scale" and scale.body["spec"] == {"replicas": 2}
    assert merge.subresource == "" and merge.body["metadata"]["annotations"][SCALE_UP] is None
    # a scale-up records its watch first, then asks for the pods
    views = {"ns/a": jview(bound={"n0": 2}, replicas=2, rv="7")}
    decision, snap = decide(views, {"ns/a": {"n0": 2, "n1": 2}})
    up = only(plan_decision(decision, snap, views, T0, PlanSettings(replicas_via="scale")), ActionKind.SCALE_UP)
    assert [p.subresource for p in up.patches] == ["", "scale"]


def test_a_rollback_through_the_scale_subresource_survives_a_409_on_its_second_patch() -> None:
    """Review finding: the merge patch sent after the scale patch guarded on the old worker count; a
    409 (the operator wrote the status in between) re-read the job, found the count the scale patch
    had set, and dropped the action: no hold, no watch cleared by the rollback, a scale-up loop."""

    from gpu_scheduler.actuate.apply import Actuator

    class Client:
        def __init__(self) -> None:
            self.sent: list[tuple[str, dict]] = []
            self.replicas, self.conflicts = 4, 1

        def patch(self, resource: Any, name: str, body: Any, **kw: Any) -> dict:
            if getattr(resource, "__name__", "") == "Scale" or "Scale" in str(resource):
                self.replicas = body["spec"]["replicas"]
                self.sent.append(("scale", body))
                return {"metadata": {"resourceVersion": "8"}}
            if self.conflicts:
                self.conflicts -= 1
                raise _conflict()
            self.sent.append(("merge", body))
            return {"metadata": {"resourceVersion": "10"}}

        def get(self, resource: Any, name: str, **kw: Any) -> dict:
            return pytorchjob("ns", "a", uid="uid-a", rv="9", replicas=self.replicas)

    watch = json.dumps({"from": 2, "to": 4, "at": T0 - 121})
    views = {"ns/a": jview(bound={"n0": 2}, pending=2, replicas=4, uid="uid-a", annotations={SCALE_UP: watch})}
    rollback = only(plan_safety(views, T0, PlanSettings(pending_timeout_s=120, replicas_via="scale")),
                    ActionKind.ROLLBACK)
    client = Client()
    actuator = Actuator(client, record_events=False)  # type: ignore[arg-type]
    try:
        (result,) = actuator.apply([rollback])
    finally:
        actuator.close()
    assert (result.status, result.message) == ("applied", "")
    assert [kind for kind, _ in client.sent] == ["scale", "merge"]
    merge = client.sent[1][1]
    assert merge["metadata"]["resourceVersion"] == "9"  # resent on the fresh read
    assert merge["metadata"]["annotations"][SCALE_UP] is None and HOLD in merge["metadata"]["annotations"]


def test_a_rollback_keeps_the_workers_bound_by_then_and_spares_jobs_the_scheduler_does_not_manage() -> None:
    """Review findings: the rollback chose by the size the watch started from (1, below min 2) and
    suspended a job that had 3 workers bound by the timeout; and a CPU-only or HPA-resized job below
    its minimum was watched and then suspended, though the scheduler leaves such jobs alone."""
    watch = json.dumps({"from": 1, "to": 4, "at": T0 - 121})
    views = {"ns/a": jview(bound={"n0": 3}, pending=1, replicas=4, min_replicas=2, annotations={SCALE_UP: watch})}
    a = only(plan_safety(views, T0, SETTINGS), ActionKind.ROLLBACK)
    assert a.patches[0].body["spec"] == {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}  # not suspended
    assert json.loads(a.patches[0].body["metadata"]["annotations"][HOLD])["max_workers"] == 3
    hpa = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                         "averageUtilization": 80}}}]
    others = {"ns/cpu": jview("cpu", bound={"n0": 1}, pending=1, replicas=2, min_replicas=2, gpus=0),
              "ns/hpa": jview("hpa", bound={"n0": 1}, pending=1, replicas=2, min_replicas=2, elastic_metrics=hpa)}
    assert plan_safety(others, T0, SETTINGS) == ()


def test_a_job_kept_outside_its_bounds_is_not_moved_into_them_by_the_planner() -> None:
    """Review finding: Decision.validate let a policy keep a job at 1 worker below min 2, but the
    planner clamped the target and scaled it to 2, asking for GPUs the decision never placed."""
    views = {"ns/a": jview(bound={"n0": 1}, replicas=1, min_replicas=2, max_replicas=4)}
    jobs = (Job(name="ns/a", submit_time_s=T0, min_workers=2, max_workers=4, gpus_per_worker=1,
                placement=Placement.of({"n0": 1})),)
    snap = ClusterSnapshot(nodes=(Node(name="n0", gpus=8),), jobs=jobs, taken_at_s=T0)
    decision = Decision.from_placements(snap, {"ns/a": Placement.of({"n0": 1})}, policy="p", now_s=T0)
    decision.validate(snap)
    assert plan_decision(decision, snap, views, T0, SETTINGS) == ()


def test_a_kept_job_below_its_minimum_with_no_pending_pod_is_clamped_not_trimmed_and_a_full_one_is_confirmed() -> None:
    """Second review: a job at 1 bound worker (min 2) whose replacement pod did not exist yet was kept
    by the policy; the planner trimmed it to replicas 1, below minReplicas, and nothing watched it
    after. A kept job changes nothing only when it asks for what it has; else the target is clamped.
    And a rollback whose job has as many workers bound as it asks for only clears the watch."""
    views = {"ns/a": jview(bound={"n0": 1}, replicas=2, min_replicas=2, max_replicas=4)}
    jobs = (Job(name="ns/a", submit_time_s=T0, min_workers=2, max_workers=4, gpus_per_worker=1,
                placement=Placement.of({"n0": 1})),)
    snap = ClusterSnapshot(nodes=(Node(name="n0", gpus=8),), jobs=jobs, taken_at_s=T0)
    decision = Decision.from_placements(snap, {"ns/a": Placement.of({"n0": 1})}, policy="p", now_s=T0)
    actions = plan_decision(decision, snap, views, T0, SETTINGS)
    assert all(p.body.get("spec", {}).get("pytorchReplicaSpecs", {}).get("Worker", {}).get("replicas") != 1
               for a in actions for p in a.patches)
    watch = json.dumps({"from": 2, "to": 4, "at": T0 - 121})
    full = {"ns/b": jview("b", bound={"n0": 4}, pending=1, replicas=4, annotations={SCALE_UP: watch})}
    a = only(plan_safety(full, T0, SETTINGS), ActionKind.CONFIRM)
    assert a.patches[0].body["metadata"]["annotations"][SCALE_UP] is None and "spec" not in a.patches[0].body


def test_a_mark_left_on_a_job_someone_else_resumed_is_cleared_so_their_next_suspension_stays() -> None:
    """Review (2026-11-30): the scheduler's suspended-by mark stayed on a job that a user (or Kueue)
    resumed, and on one whose GPUs-per-worker change they abandoned by resuming it. Suspended again
    by them, the job looked like the scheduler's: the policy resumed it within a tick (a fight with
    Kueue). The mark is cleared once the job is seen running, guarded by resourceVersion and suspend."""
    resumed = {"ns/a": jview(bound={"n0": 2}, replicas=2, rv="12", annotations={SUSPENDED_BY: FIELD_MANAGER})}
    a = only(plan_safety(resumed, T0, SETTINGS), ActionKind.CONFIRM)
    (patch,) = a.patches
    assert patch.body["metadata"]["annotations"][SUSPENDED_BY] is None
    assert patch.body["metadata"]["resourceVersion"] == "12" and "spec" not in patch.body
    assert dict(patch.guard)[("spec", "runPolicy", "suspend")] is None  # dropped if suspended again since
    # Suspended by the scheduler and still suspended: the mark stays (the policy may resume it).
    ours = {"ns/a": jview(replicas=2, suspend=True, annotations={SUSPENDED_BY: FIELD_MANAGER})}
    assert plan_safety(ours, T0, SETTINGS) == ()
    # A GPUs-per-worker change abandoned because someone resumed the job drops the mark too.
    reshape = {ANNOTATION_PREFIX + "reshape": json.dumps({"gpus_per_worker": 2, "workers": 2}),
               SUSPENDED_BY: FIELD_MANAGER}
    abandoned = {"ns/a": jview(bound={"n0": 4}, replicas=4, gpus=1, annotations=reshape)}
    a = only(plan_safety(abandoned, T0, SETTINGS), ActionKind.CONFIRM)
    ann = a.patches[0].body["metadata"]["annotations"]
    assert ann[ANNOTATION_PREFIX + "reshape"] is None and ann[SUSPENDED_BY] is None
