"""Pod status and Events → the cause a launch fails with (pure).

The shapes are the API's own: Pod ``status`` as the kubelet and kube-scheduler write it and
``core/v1`` Events as ``kubectl get events -o yaml`` shows them (Kubernetes docs, "Debug Pods":
``ImagePullBackOff``, ``CreateContainerConfigError``, ``FailedScheduling``; kubelet
``pkg/kubelet/images/types.go``; training-operator v1.9 ``pod_control.go``).
"""

from __future__ import annotations

import pytest

from components.launcher.diagnose import (
    UNSCHEDULABLE_GRACE_S,
    UNSYNCED_CACHE_GRACE_S,
    OomKill,
    Problem,
    job_problems,
    one_line,
    oom_kill_burst,
    oom_kills,
    pod_problems,
    running_workers,
    waits_for_capacity,
)


def pod(*, phase: str = "Pending", waiting: dict | None = None, terminated: dict | None = None,
        conditions: list | None = None, name: str = "train-1a2b-worker-0", uid: str = "uid-0",
        deleting: bool = False, image: str = "registry.example/trainflow:9.9") -> dict:
    status: dict = {"phase": phase, "conditions": conditions or []}
    if waiting is not None or terminated is not None:
        state = {"waiting": waiting} if waiting is not None else {"terminated": terminated}
        status["containerStatuses"] = [{"name": "pytorch", "image": image, "imageID": "", "ready": False,
                                        "restartCount": 0, "started": False, "state": state}]
    meta = {"name": name, "namespace": "team-a", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-23T10:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def event(reason: str, message: str, *, kind: str = "Pod", name: str = "train-1a2b-worker-0", uid: str = "uid-0",
          last: str = "2026-11-23T10:00:05Z", type_: str = "Warning") -> dict:
    return {"apiVersion": "v1", "kind": "Event", "type": type_, "reason": reason, "message": message, "count": 3,
            "involvedObject": {"kind": kind, "name": name, "namespace": "team-a", "uid": uid},
            "firstTimestamp": "2026-11-23T10:00:00Z", "lastTimestamp": last,
            "source": {"component": "kubelet", "host": "node-1"}}


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "lastTransitionTime": "2026-11-23T10:00:00Z",
                 "message": "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: "
                            "3 No preemption victims found for incoming pod."}


def test_image_pull_backoff_names_the_image_and_takes_the_kubelets_reason_from_the_event() -> None:
    p = pod(waiting={"reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/trainflow:9.9"'})
    events = [
        event("Pulling", 'Pulling image "registry.example/trainflow:9.9"', type_="Normal"),
        event("Failed", 'Failed to pull image "registry.example/trainflow:9.9": rpc error: code = NotFound desc = '
                        'failed to pull and unpack image "registry.example/trainflow:9.9": failed to resolve reference '
                        '"registry.example/trainflow:9.9": registry.example/trainflow:9.9: not found'),
        event("Failed", "Error: ErrImagePull"),
        event("BackOff", 'Back-off pulling image "registry.example/trainflow:9.9"'),
    ]
    (problem,) = pod_problems(p, events)
    assert problem.reason == "ImagePullBackOff" and problem.grace_s == 30
    line = problem.line()
    assert line.startswith("pod team-a/train-1a2b-worker-0: cannot pull image 'registry.example/trainflow:9.9'")
    assert "not found" in line and "\n" not in line


def test_a_pull_flipping_between_err_image_pull_and_back_off_is_one_problem() -> None:
    """The kubelet shows ErrImagePull during each attempt and ImagePullBackOff between them; the
    launcher's grace must not restart at each flip (on the real node it did: 132 s, not 30 s)."""
    (pulling,) = pod_problems(pod(waiting={"reason": "ErrImagePull", "message": "lookup registry.invalid: timeout"}), [])
    (backing_off,) = pod_problems(pod(waiting={"reason": "ImagePullBackOff", "message": "Back-off pulling"}), [])
    assert pulling.key == backing_off.key
    (secret,) = pod_problems(pod(waiting={"reason": "CreateContainerConfigError", "message": "x"}), [])
    assert secret.key != pulling.key


def test_events_of_an_earlier_pod_with_the_same_name_are_not_used() -> None:
    p = pod(waiting={"reason": "ErrImagePull", "message": "rpc error: code = Unknown desc = 503"})
    stale = event("Failed", 'Failed to pull image "x": not found', uid="uid-of-the-previous-pod")
    (problem,) = pod_problems(p, [stale])
    assert "503" in problem.message and "not found" not in problem.message


@pytest.mark.parametrize(
    ("waiting", "expected", "grace"),
    [
        ({"reason": "InvalidImageName", "message": 'Failed to apply default image tag "Bad//Name": couldn\'t parse '
                                                   'image name "Bad//Name": invalid reference format'},
         "invalid image name (InvalidImageName): Failed to apply default image tag", 0),
        ({"reason": "ErrImageNeverPull", "message": 'Container image "x:1" is not present with pull policy of Never'},
         "imagePullPolicy is Never", 0),
        ({"reason": "CreateContainerConfigError", "message": 'secret "trainflow-s3-credentials" not found'},
         'container configuration error (a Secret or ConfigMap it names) (CreateContainerConfigError): secret '
         '"trainflow-s3-credentials" not found', 0),
        ({"reason": "CreateContainerConfigError",
          "message": "couldn't find key accesskey in Secret team-a/trainflow-s3-credentials"},
         "couldn't find key accesskey", 0),
        ({"reason": "CreateContainerError", "message": "context deadline exceeded"}, "cannot create", 30),
    ],
)
def test_waiting_reasons(waiting: dict, expected: str, grace: float) -> None:
    (problem,) = pod_problems(pod(waiting=waiting))
    assert expected in problem.line() and problem.grace_s == grace


def test_a_kubelet_cache_not_yet_synced_is_waited_for_and_the_missing_secret_then_fails_at_once() -> None:
    """On a busy real node the kubelet first said ``failed to sync secret cache: timed out waiting for
    the condition`` (its watch-based cache's one-second wait), which is no verdict on the Secret: an
    existing one is read on the kubelet's next try. The launch waits; the later ``not found`` is the
    same problem (its first sighting kept) and ends the launch at once."""
    unsynced = pod(waiting={"reason": "CreateContainerConfigError",
                            "message": "failed to sync secret cache: timed out waiting for the condition"})
    (waiting,) = pod_problems(unsynced)
    assert waiting.grace_s == UNSYNCED_CACHE_GRACE_S > 0
    (missing,) = pod_problems(pod(waiting={"reason": "CreateContainerConfigError",
                                           "message": 'secret "no-such-secret" not found'}))
    assert missing.grace_s == 0 and missing.key == waiting.key


START_ERROR = {"exitCode": 128, "reason": "StartError", "startedAt": "1970-01-01T00:00:00Z",
               "finishedAt": "2026-11-23T10:00:01Z",
               "message": 'failed to create containerd task: failed to create shim task: OCI runtime create failed: '
                          'runc create failed: unable to start container process: exec: "python": executable '
                          'file not found in $PATH: unknown'}


@pytest.mark.parametrize("deleting", [False, True])
def test_a_command_that_cannot_start_is_fatal_at_once(deleting: bool) -> None:
    """Under the operator's ExitCode policy the pod's restartPolicy is Never (training-operator v1.9
    ``pkg/core/pod.go`` SetRestartPolicy), so a container that cannot start leaves the pod Failed — and
    the operator, exit 128 being retryable to it, deletes and recreates it forever."""
    (problem,) = pod_problems(pod(phase="Failed", terminated=START_ERROR, deleting=deleting))
    assert problem.reason == "StartError" and problem.grace_s == 0 and '"python"' in problem.message
    nvidia = {**START_ERROR, "reason": "ContainerCannotRun",
              "message": "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"}
    (problem,) = pod_problems(pod(phase="Failed", terminated=nvidia))
    assert problem.reason == "ContainerCannotRun" and problem.grace_s == 0 and "nvml" in problem.line()


@pytest.mark.parametrize(
    "message",
    ["0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes are "
     "available: 4 Preemption is not helpful for scheduling.",
     "0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 2 node(s) didn't match "
     "Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
     "scheduling."],
)
def test_pods_no_node_matches_quote_the_scheduler_and_fail_after_the_unschedulable_grace(message: str) -> None:
    cond = {**UNSCHEDULABLE, "message": message}
    (problem,) = pod_problems(pod(conditions=[cond]))
    assert problem.reason == "Unschedulable" and problem.grace_s == UNSCHEDULABLE_GRACE_S and not problem.capacity
    assert problem.line() == f"pod team-a/train-1a2b-worker-0: no node can run it (Unschedulable): {message}"


@pytest.mark.parametrize(
    "message",
    [UNSCHEDULABLE["message"],
     "0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 3 node(s) didn't match Pod's node affinity/selector. "
     "preemption: 0/5 nodes are available: 2 No preemption victims found for incoming pod, 3 Preemption is not "
     "helpful for scheduling.",
     "0/1 nodes are available: 1 Too many pods. preemption: 0/1 nodes are available: 1 No preemption victims "
     "found for incoming pod."],
)
def test_pods_waiting_for_capacity_queue_instead_of_failing(message: str) -> None:
    """``Insufficient <resource>``: a node matched but is full (GPUs held by other jobs, a node pool
    scaling up from zero): no grace of its own; the runner's ``capacity_grace_s`` decides."""
    (problem,) = pod_problems(pod(conditions=[{**UNSCHEDULABLE, "message": message}]))
    assert problem.reason == "Unschedulable" and problem.capacity and problem.grace_s == float("inf")
    assert problem.line() == (f"pod team-a/train-1a2b-worker-0: waiting for capacity, no node has room for it now "
                              f"(Unschedulable): {message}")
    (mismatch,) = pod_problems(pod(conditions=[{**UNSCHEDULABLE, "message": "0/1 nodes are available: 1 node(s) "
                                                "didn't match Pod's node affinity/selector."}]))
    assert mismatch.key != problem.key  # a grace of its own, not one that started while the pod queued


def test_a_node_being_added_for_the_pod_makes_a_mismatch_a_wait_for_capacity() -> None:
    """A GPU node pool scaling from zero has no node yet that the pod could match: the scheduler says
    "didn't match"; the cluster autoscaler's (or Karpenter's) Normal Event says a node is coming."""
    mismatch = {**UNSCHEDULABLE, "message": "0/2 nodes are available: 2 node(s) didn't match Pod's node "
                                            "affinity/selector. preemption: 0/2 nodes are available: 2 Preemption "
                                            "is not helpful for scheduling."}
    p = pod(conditions=[mismatch])
    (alone,) = pod_problems(p)
    assert not alone.capacity and alone.grace_s == 60
    scale_up = event("TriggeredScaleUp", "pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]", type_="Normal")
    (waiting,) = pod_problems(p, [scale_up])
    assert waiting.capacity and waiting.grace_s == float("inf")
    assert waiting.line() == ("pod team-a/train-1a2b-worker-0: waiting for a node the cluster autoscaler is adding "
                              "for it (Unschedulable): pod triggered scale-up: [{gpu-pool 0->1 (max: 4)}]")
    karpenter = event("Nominated", "Pod should schedule on: nodeclaim/gpu-abc12", type_="Normal")
    assert pod_problems(p, [karpenter])[0].capacity
    # another pod's scale-up, an older incarnation's (other uid), or a Warning of that reason: no
    other = event("TriggeredScaleUp", "x", type_="Normal", name="train-1a2b-worker-1")
    stale = event("TriggeredScaleUp", "x", type_="Normal", uid="uid-old")
    warning = event("TriggeredScaleUp", "x")
    assert not any(pr.capacity for pr in pod_problems(p, [other, stale, warning]))


def test_insufficient_after_preemption_is_not_capacity() -> None:
    """Only the filter part counts: the preemption part's wording is not about this pod's nodes."""
    assert not waits_for_capacity("0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. "
                                  "preemption: 0/2 nodes are available: 2 Insufficient cpu.")


def test_running_finished_and_deleted_pods_have_no_problems() -> None:
    waiting = {"reason": "ErrImagePull", "message": "x"}
    for p in (pod(phase="Running", waiting=waiting), pod(phase="Failed", waiting=waiting),
              pod(phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled"}),
              pod(phase="Succeeded"), pod(deleting=True, waiting=waiting)):
        assert pod_problems(p) == []
    assert pod_problems(pod(conditions=[{"type": "PodScheduled", "status": "True"}])) == []  # scheduled, starting


def test_mount_and_sandbox_events_count_once_each_with_the_newest_message() -> None:
    p = pod(conditions=[{"type": "PodScheduled", "status": "True"}])
    events = [
        event("FailedMount", 'MountVolume.SetUp failed for volume "creds" : secret "old" not found',
              last="2026-11-23T10:00:01Z"),
        event("FailedMount", 'MountVolume.SetUp failed for volume "creds" : secret "creds" not found',
              last="2026-11-23T10:00:09Z"),
        event("FailedCreatePodSandBox", "Failed to create pod sandbox: plugin type=\"bridge\" failed (add): "
                                        "failed to allocate for range 0"),
    ]
    problems = {p.reason: p for p in pod_problems(p, events)}
    assert set(problems) == {"FailedMount", "FailedCreatePodSandBox"}
    assert 'secret "creds"' in problems["FailedMount"].message


def test_the_operators_create_errors_on_the_job() -> None:
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "train-1a2b", "namespace": "team-a", "uid": "job-uid"}}
    events = [
        event("FailedCreatePod", 'Error creating: pods "train-1a2b-worker-0" is forbidden: error looking up service '
                                 'account team-a/trainer: serviceaccount "trainer" not found',
              kind="PyTorchJob", name="train-1a2b", uid="job-uid"),
        event("SuccessfulCreateService", "Created service: train-1a2b-worker-0", kind="PyTorchJob",
              name="train-1a2b", uid="job-uid", type_="Normal"),
        event("FailedCreatePod", "Error creating: other job", kind="PyTorchJob", name="other", uid="x"),
    ]
    (problem,) = job_problems(job, events)
    assert problem.subject == "PyTorchJob team-a/train-1a2b" and problem.grace_s == 30
    assert 'serviceaccount "trainer" not found' in problem.line()


def test_running_workers_and_one_line() -> None:
    assert running_workers([pod(phase="Running"), pod(phase="Running", deleting=True), pod()]) == 1
    assert one_line("a\n  b\tc") == "a b c"
    long = one_line("x" * 1000)
    assert len(long) == 400 and long.endswith("...")
    assert Problem("s", "R", "w", "", 0).line() == "s: w (R): no message"


def test_oom_kills_are_read_from_the_state_and_the_last_state_once_each() -> None:
    """``ExitCode``: the pod ends Failed with the kill as its state (the operator recreates it under
    the same name, a new uid); ``OnFailure``: the container restarts in place and the kill moves to
    ``lastState``; a container that ended otherwise, or another container, does not count."""
    killed = {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-23T10:00:07Z"}
    failed = pod(phase="Failed", terminated=killed)
    failed["spec"] = {"containers": [{"name": "pytorch", "resources": {"limits": {"memory": "128Mi"}}}]}
    (kill,) = oom_kills(failed, "pytorch")
    assert (kill.key, kill.subject, kill.memory_limit) == (
        ("uid-0", "pytorch", "2026-11-23T10:00:07Z"), "pod team-a/train-1a2b-worker-0", "128Mi")
    assert oom_kills(failed, "sidecar") == []
    recreated = pod(phase="Failed", terminated=killed, uid="uid-1")
    assert [k.key[0] for k in oom_kills(recreated, "pytorch")] == ["uid-1"] and oom_kills(recreated, "pytorch")[0].memory_limit == ""
    restarted = pod(phase="Running", waiting={"reason": "ContainerCreating"})
    restarted["status"]["containerStatuses"][0].update(restartCount=1, lastState={"terminated": killed})
    assert [k.key for k in oom_kills(restarted, "pytorch")] == [kill.key]  # the same end, seen again
    for ended in ({**killed, "reason": "Error", "exitCode": 1}, {**killed, "reason": "Completed", "exitCode": 0}):
        assert oom_kills(pod(phase="Failed", terminated=ended), "pytorch") == []


def test_only_the_jobs_own_pods_are_counted() -> None:
    """A job replaced under the same name leaves its pods (same labels) behind for a while."""
    killed = pod(phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-23T10:00:07Z"})
    killed["metadata"]["ownerReferences"] = [{"kind": "PyTorchJob", "uid": "job-new", "controller": True}]
    assert len(oom_kills(killed, "pytorch", owner_uid="job-new")) == 1
    assert oom_kills(killed, "pytorch", owner_uid="job-old") == []


def kill(worker: int, at_s: float | None, n: int = 0) -> OomKill:
    return OomKill((f"uid-{worker}-{n}", "pytorch", str(at_s)), f"pod team-a/train-worker-{worker}", "1Gi", at_s)


def test_a_burst_is_one_workers_kills_within_the_window() -> None:
    again_and_again = [kill(0, t, n) for n, t in enumerate((0.0, 40.0, 90.0))]
    assert [k.finished_s for k in oom_kill_burst(again_and_again, 900.0)] == [0.0, 40.0, 90.0]
    assert len(oom_kill_burst(again_and_again, 60.0)) == 2  # 40 and 90 s
    now_and_then = [kill(0, t, n) for n, t in enumerate((0.0, 3600.0, 7200.0, 10800.0))]
    assert len(oom_kill_burst(now_and_then, 900.0)) == 1
    every_worker_once = [kill(w, 10.0 + w) for w in range(4)]
    assert len(oom_kill_burst(every_worker_once, 900.0)) == 1
    assert oom_kill_burst([], 900.0) == []
    assert len(oom_kill_burst([kill(1, None, 0), kill(1, None, 1), kill(1, 5.0, 2)], 900.0)) == 2
