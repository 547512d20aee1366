"""Bad input on the cluster backend fails the launch fast, with one line naming the cause, and
leaves nothing behind unless asked — against the real control plane (kube-apiserver with RBAC and
admission, kube-scheduler, the training operator) and KWOK nodes.

KWOK plays the kubelet: a pod annotated ``kwok.trainflow.dev/waiting-reason`` reports its
containers waiting for that reason, as a kubelet does for a missing image or Secret. That a real
kubelet reports them the same way is checked on the real node (``realnode`` tests).

Also here: one writer per job key (an orphan of a dead launcher is deleted first; a live one is an
error) and the launcher Pod as the job's owner.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.launcher.diagnose import UNSCHEDULABLE_GRACE_S
from components.launcher.pytorchjob import JOB_KEY_HASH_LABEL, PyTorchJobSpec
from components.launcher.runner import (
    LauncherError,
    LaunchStuck,
    LaunchTerminated,
    PyTorchJobRunner,
    RunnerSettings,
    pytorchjob_resource,
)
from tests.support.k8s import (
    WAITING_MESSAGE_ANNOTATION,
    WAITING_REASON_ANNOTATION,
    KubeTestBed,
    wait_until,
)

pytestmark = pytest.mark.k8s

FAST = {"poll_interval_s": 0.5, "max_grace_s": 2.0, "capacity_grace_s": 2.0, "delete_timeout_s": 30.0}
#: What a loaded CI machine may add to a grace the launcher waits out (scheduling, polls, the deletion).
CI_ALLOWANCE_S = 120.0


def make_spec(namespace: str, pool: str, **overrides: Any) -> PyTorchJobSpec:
    fields: dict[str, Any] = {
        "run_id": f"run-{uuid.uuid4().hex[:8]}", "task_name": "train", "namespace": namespace,
        "image": "registry.example/trainflow:test", "training_args": ["--epochs", "1"], "min_replicas": 1,
        "max_replicas": 1, "nproc_per_node": 1, "gpus_per_worker": 1, "node_selector": {"pool": pool},
    }
    fields.update(overrides)
    return PyTorchJobSpec(**fields)


def jobs(client: Any, namespace: str) -> list[str]:
    return [j.metadata.name for j in client.list(pytorchjob_resource(), namespace=namespace)]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"gpus_per_worker": 64}, "waiting for capacity, no node has room for it now (Unschedulable): 0/"),
        ({"node_selector": {"pool": "nowhere"}}, "didn't match Pod's node affinity/selector"),
        ({"pod_annotations": {WAITING_REASON_ANNOTATION: "ErrImagePull", WAITING_MESSAGE_ANNOTATION:
          'failed to pull and unpack image "registry.example/trainflow:test": not found'}},
         "cannot pull image 'registry.example/trainflow:test' (ErrImagePull): failed to pull and unpack image"),
        ({"pod_annotations": {WAITING_REASON_ANNOTATION: "CreateContainerConfigError",
                              WAITING_MESSAGE_ANNOTATION: 'secret "trainflow-s3-credentials" not found'}},
         '(CreateContainerConfigError): secret "trainflow-s3-credentials" not found'),
        ({"service_account_name": "no-such-sa"},
         'the training operator cannot create worker pods (FailedCreatePod): Error creating: pods '),
        ({"priority_class_name": "no-such-priority"}, "no PriorityClass with name no-such-priority was found"),
    ],
    ids=["insufficient-gpu", "node-selector", "missing-image", "missing-secret", "missing-sa", "missing-priority"],
)
def test_workers_that_cannot_start_fail_the_launch_and_the_job_is_deleted(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, overrides: dict, expected: str
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    spec = make_spec(k8s_namespace, k8s_namespace, **overrides)
    runner = PyTorchJobRunner(client, RunnerSettings(cleanup="always", **FAST))
    t0 = time.monotonic()
    with pytest.raises(LaunchStuck) as stuck:
        runner.run(spec)
    elapsed = time.monotonic() - t0
    message = str(stuck.value)
    assert expected in message, message
    assert "\n" not in message and elapsed < 60, (elapsed, message)
    assert jobs(client, k8s_namespace) == []


def test_a_stuck_job_is_kept_when_asked_and_a_scale_up_that_cannot_schedule_is_not_fatal(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    spec = make_spec(k8s_namespace, k8s_namespace, gpus_per_worker=64)
    with pytest.raises(LaunchStuck):
        PyTorchJobRunner(client, RunnerSettings(cleanup="on-success", **FAST)).run(spec)
    assert jobs(client, k8s_namespace) == [spec.name]

    # min 1, max 2, 8 GPUs each on one 8-GPU node: worker 1 runs, worker 2 stays Pending (Insufficient)
    # — the job trains, so the launcher keeps waiting (the GPU scheduler rolls such a scale-up back).
    elastic = make_spec(k8s_namespace, k8s_namespace, task_name="train-elastic", min_replicas=1, max_replicas=2,
                        gpus_per_worker=8)
    runner = PyTorchJobRunner(client, RunnerSettings(cleanup="always", **FAST))
    ref, _ = runner.create_or_reattach(elastic)
    wait_until(lambda: "1 Pending" in (s := runner.workers_summary(ref)) and "1 Running" in s, timeout_s=60,
               what="one worker running, one pending")
    timer = threading.Timer(15.0, runner.stop_requested.set)  # many times the 2 s grace
    timer.start()
    with pytest.raises(LaunchTerminated):  # still waiting after 15 s, not LaunchStuck
        runner.wait(ref, spec=elastic)
    assert "Insufficient nvidia.com/gpu" in runner.workers_summary(ref)


def _sa_kubeconfig(bed: KubeTestBed, namespace: str, sa: str, out: Path) -> Path:
    """A kubeconfig that authenticates as ServiceAccount ``namespace/sa`` (a bound token)."""
    bed.kubectl("create", "serviceaccount", sa, "-n", namespace)
    token = bed.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(bed.kubeconfig).read_text())
    admin["users"] = [{"name": sa, "user": {"token": token}}]
    admin["contexts"] = [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": sa,
                                                    "namespace": namespace}}]
    admin["current-context"] = "sa"
    out.write_text(yaml.safe_dump(admin))
    return out


def test_refusals_of_the_api_are_one_line(k8s_testbed: KubeTestBed, k8s_namespace: str, tmp_path: Path) -> None:
    from lightkube import Client
    from lightkube.config.kubeconfig import KubeConfig

    config = _sa_kubeconfig(k8s_testbed, k8s_namespace, "no-rights", tmp_path / "kubeconfig")
    as_sa = Client(KubeConfig.from_file(config))
    assert as_sa.namespace == k8s_namespace  # the default namespace the train step would pick outside a pod
    with pytest.raises(LauncherError) as refused:
        PyTorchJobRunner(as_sa, RunnerSettings(**FAST)).run(make_spec(k8s_namespace, "x", job_key="k/1"))
    message = str(refused.value)
    assert "(403 Forbidden): the service account this step runs as may not do it in namespace" in message
    assert k8s_namespace in message and "\n" not in message

    admin = k8s_testbed.client()
    with pytest.raises(LauncherError, match="namespace no-such-ns-1 does not exist") as missing:
        PyTorchJobRunner(admin, RunnerSettings(**FAST)).run(make_spec("no-such-ns-1", "x"))
    assert "\n" not in str(missing.value)


def _pod(bed: KubeTestBed, namespace: str, name: str, pool: str) -> Any:
    """A stand-in for the launcher's own Pod (KFP's task pod), bound to a KWOK node."""
    from lightkube.models.core_v1 import Container, PodSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    client = bed.client()
    client.create(Pod(metadata=ObjectMeta(name=name, namespace=namespace),
                      spec=PodSpec(containers=[Container(name="main", image="launcher:1")], nodeSelector={"pool": pool})))
    return wait_until(lambda: (p := client.get(Pod, name, namespace=namespace)).status.phase == "Running" and p,
                      timeout_s=60, what=f"pod {name} running")


def _owner(pod: Any) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}


def test_one_job_per_job_key_an_orphan_is_replaced_a_live_one_is_not(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Pod

    client = k8s_testbed.client()
    kwok_gpu_nodes(2, 8, labels={"pool": k8s_namespace})
    launcher = _pod(k8s_testbed, k8s_namespace, "launcher-attempt-1", k8s_namespace)
    first = make_spec(k8s_namespace, k8s_namespace, run_id="kfp-run-1", job_key="dag/run/train",
                      owner_references=[_owner(launcher)])
    runner = PyTorchJobRunner(client, RunnerSettings(**FAST))
    ref1, _ = runner.create_or_reattach(first)
    job = client.get(pytorchjob_resource(), ref1.name, namespace=k8s_namespace)
    assert [o.uid for o in job.metadata.ownerReferences] == [launcher.metadata.uid]
    assert job.metadata.labels[JOB_KEY_HASH_LABEL]
    wait_until(lambda: runner.workers_summary(ref1) == "workers: 1 Running", timeout_s=60, what="worker running")

    # An Airflow retry makes a new KFP run (another job name) on the same job key. While the first
    # launcher runs, that is refused: two jobs would write the same checkpoints.
    second = make_spec(k8s_namespace, k8s_namespace, run_id="kfp-run-2", job_key="dag/run/train")
    with pytest.raises(LauncherError, match=r"already being trained by PyTorchJob .* launched by pod launcher-attempt-1"):
        runner.create_or_reattach(second)

    # The first launcher is gone (OOM-killed, node lost): its job is an orphan and is deleted, and
    # the retry waits for its running workers to end first (here the test plays the garbage collector).
    client.delete(Pod, "launcher-attempt-1", namespace=k8s_namespace, grace_period=0)
    wait_until(lambda: "launcher-attempt-1" not in [p.metadata.name for p in client.list(Pod, namespace=k8s_namespace)],
               timeout_s=30, what="launcher pod gone")

    gc_errors: list[BaseException] = []

    def garbage_collector() -> None:
        try:
            wait_until(lambda: ref1.name not in jobs(client, k8s_namespace), timeout_s=30, what="orphan deleted")
            for p in client.list(Pod, namespace=k8s_namespace, labels={"training.kubeflow.org/job-name": ref1.name}):
                try:
                    client.delete(Pod, p.metadata.name, namespace=k8s_namespace)
                except ApiError as exc:  # the bed's kube-controller-manager (real-node tier) may be first
                    if exc.status.code != 404:
                        raise
        except BaseException as exc:  # surfaced by the test below, not lost in the thread
            gc_errors.append(exc)

    gc = threading.Thread(target=garbage_collector)
    gc.start()
    ref2, created = runner.create_or_reattach(second)
    gc.join()
    assert not gc_errors, f"the test's garbage collector failed: {gc_errors[0]!r}"
    assert created and jobs(client, k8s_namespace) == [ref2.name] and ref2.name != ref1.name

    # A job on the key with no owner to ask (launched from outside the cluster): refused, with the fix.
    third = make_spec(k8s_namespace, k8s_namespace, run_id="kfp-run-3", job_key="dag/run/train")
    with pytest.raises(LauncherError, match=f"no launcher pod .*kubectl delete pytorchjob -n {k8s_namespace} {ref2.name}"):
        runner.create_or_reattach(third)


def test_a_retried_launcher_takes_over_the_job_it_reattaches_to(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    old = _pod(k8s_testbed, k8s_namespace, "launcher-old", k8s_namespace)
    new = _pod(k8s_testbed, k8s_namespace, "launcher-new", k8s_namespace)
    spec = make_spec(k8s_namespace, k8s_namespace, job_key="run-9/train", owner_references=[_owner(old)])
    runner = PyTorchJobRunner(client, RunnerSettings(**FAST))
    ref, created = runner.create_or_reattach(spec)
    assert created
    from dataclasses import replace

    ref_again, created = runner.create_or_reattach(replace(spec, owner_references=[_owner(new)]))
    assert (ref_again, created) == (ref, False)
    job = client.get(pytorchjob_resource(), ref.name, namespace=k8s_namespace)
    assert [(o.name, o.uid) for o in job.metadata.ownerReferences] == [("launcher-new", new.metadata.uid)]


@pytest.mark.s3
def test_the_train_step_fails_within_two_minutes_naming_the_cause_and_cleans_up(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, s3_server: Any, digits_dataset: Path,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole train step (components/training/step.py) on the cluster backend with an image that
    cannot be pulled: one line, within 2 minutes, nothing left behind; with keep_failed_job (a
    missing Secret this time) the job stays, and it holds no credential."""
    import json

    from components.training.step import TrainStepError, run_train_step
    from trainflow.common.training_spec import TrainJobSpec

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("KUBECONFIG", str(k8s_testbed.kubeconfig))
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    bucket = s3_server.make_bucket("ckpt")
    settings = {"node_selector": {"pool": k8s_namespace}, "pod_annotations": {
        WAITING_REASON_ANNOTATION: "ImagePullBackOff",
        WAITING_MESSAGE_ANNOTATION: 'Back-off pulling image "registry.example/trainflow:missing"'}}
    req = TrainJobSpec.build(
        dataset_path=str(digits_dataset), dataset_uri=str(digits_dataset), backend="pytorchjob", epochs=1,
        job_key="failfast/1", kfp_run_id="run-ff-1", kfp_task_name="train", checkpoint_uri=f"s3://{bucket}/ckpt",
        image="registry.example/trainflow:missing", namespace=k8s_namespace, gpus_per_worker=1, nproc_per_node=1,
        worker_pod_settings=json.dumps(settings), s3_secret_name="trainflow-s3-credentials",
        s3_endpoint_url="http://minio.example:9000", poll_interval_s=2.0,
    )
    t0 = time.monotonic()
    with pytest.raises(TrainStepError) as failed:
        run_train_step(req, model_dir=tmp_path / "model", work_dir=tmp_path / "work")
    elapsed = time.monotonic() - t0
    message = str(failed.value)
    assert "cannot pull image 'registry.example/trainflow:missing' (ImagePullBackOff)" in message, message
    assert "\n" not in message and elapsed < 120, (elapsed, message)
    assert jobs(client, k8s_namespace) == []

    settings["pod_annotations"] = {WAITING_REASON_ANNOTATION: "CreateContainerConfigError",
                                   WAITING_MESSAGE_ANNOTATION: 'secret "trainflow-s3-credentials" not found'}
    kept = req.replace(job_key="failfast/2", kfp_run_id="run-ff-2", keep_failed_job=True,
                   worker_pod_settings=json.dumps(settings))
    with pytest.raises(TrainStepError, match='secret "trainflow-s3-credentials" not found'):
        run_train_step(kept, model_dir=tmp_path / "model2", work_dir=tmp_path / "work2")
    (name,) = jobs(client, k8s_namespace)
    job = client.get(pytorchjob_resource(), name, namespace=k8s_namespace).to_dict()
    env = {e["name"]: e for e in job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {
        "name": "trainflow-s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"}}}
    pod_spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    command = pod_spec["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "components.training.torchrun"]  # exit 2 stays permanent
    config = json.loads(command[command.index("--config-json") + 1])
    # the SIGTERM checkpoint gets its deadline + 10 s before the kubelet's SIGKILL
    assert pod_spec["terminationGracePeriodSeconds"] == config["preemption_save_deadline_s"] + 10 == 30
    assert config["dataset"] == f"s3://{bucket}/ckpt/failfast/2/dataset"  # never this pod's path
    assert config["metrics_path"] == f"s3://{bucket}/ckpt/failfast/2/metrics"
    written = json.dumps(job) + "".join(p.read_text() for p in (tmp_path / "work2").iterdir())
    assert s3_server.secret_key not in written and s3_server.access_key not in written


@pytest.mark.s3
def test_the_train_step_names_a_missing_bucket_a_refusal_and_unsatisfiable_requests(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any, s3_server: Any, digits_dataset: Path,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rest of issue 9's bad input, through the whole train step with its own settings (no
    shortened graces): each fails within 2 minutes (no matching node: its grace and a CI allowance)
    with one line naming the cause, and leaves no job."""
    import json

    from components.training.step import TrainStepError, run_train_step
    from trainflow.common.training_spec import TrainJobSpec

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("KUBECONFIG", str(k8s_testbed.kubeconfig))
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    bucket = s3_server.make_bucket("ckpt")
    req = TrainJobSpec.build(
        dataset_path=str(digits_dataset), dataset_uri=str(digits_dataset), backend="pytorchjob", epochs=1,
        job_key="badinput/1", kfp_run_id="run-bad-1", kfp_task_name="train", checkpoint_uri=f"s3://{bucket}/ckpt",
        image="registry.example/trainflow:1", namespace=k8s_namespace, gpus_per_worker=1, nproc_per_node=1,
        worker_pod_settings=json.dumps({"node_selector": {"pool": k8s_namespace}}), poll_interval_s=2.0,
    )

    def fails(request: TrainJobSpec, name: str, within_s: float = 120) -> tuple[str, float]:
        t0 = time.monotonic()
        with pytest.raises(TrainStepError) as failed:
            run_train_step(request, model_dir=tmp_path / name / "model", work_dir=tmp_path / name / "work")
        message, elapsed = str(failed.value), time.monotonic() - t0
        assert "\n" not in message and elapsed < within_s, (elapsed, message)
        assert jobs(client, k8s_namespace) == []
        return message, elapsed

    message, elapsed = fails(req.replace(checkpoint_uri="s3://no-such-bucket-9/ckpt"), "bucket")
    assert message.startswith("checkpoint storage: S3 bucket 'no-such-bucket-9' does not exist"), message
    assert elapsed < 30

    # The step's service account may not create PyTorchJobs in the namespace (here: one with no rights).
    monkeypatch.setenv("KUBECONFIG", str(_sa_kubeconfig(k8s_testbed, k8s_namespace, "step-sa", tmp_path / "kubeconfig")))
    message, elapsed = fails(req.replace(job_key="badinput/2", kfp_run_id="run-bad-2"), "forbidden")
    assert "(403 Forbidden): the service account this step runs as may not do it in namespace" in message, message
    assert elapsed < 30
    monkeypatch.setenv("KUBECONFIG", str(k8s_testbed.kubeconfig))

    # No node matches the pods: the scheduler's own reason, after the unschedulable grace (60 s). (A node
    # short of room, "Insufficient cpu", is capacity to wait for: the step queues, tested in tests/components.)
    message, _ = fails(req.replace(job_key="badinput/3", kfp_run_id="run-bad-3",
                                   worker_pod_settings=json.dumps({"node_selector": {"pool": "nowhere"}})), "selector",
                       within_s=UNSCHEDULABLE_GRACE_S + CI_ALLOWANCE_S)
    assert "no node can run it (Unschedulable): 0/" in message, message
    assert "didn't match Pod's node affinity/selector" in message, message


def test_worker_pods_are_admitted_where_the_restricted_pod_security_standard_is_enforced(
    k8s_testbed: KubeTestBed, k8s_namespace: str
) -> None:
    """The API server's Pod Security admission (``restricted``) admits the rendered worker pod; with
    ``run_as_user: null`` (the image's own user, root) it refuses it, naming what ``restricted`` wants.
    The worker pods that really run under it: the real node's training tests (``s3_namespace``)."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Namespace, Pod

    from components.launcher.pytorchjob import render_pytorchjob
    from tests.support.k8s import RESTRICTED_NAMESPACE_LABELS

    client = k8s_testbed.client()
    client.patch(Namespace, k8s_namespace, {"metadata": {"labels": RESTRICTED_NAMESPACE_LABELS}})

    def pod(**overrides: Any) -> Any:
        template = render_pytorchjob(make_spec(k8s_namespace, "p", **overrides))["spec"]["pytorchReplicaSpecs"][
            "Worker"]["template"]
        return Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "worker", "namespace": k8s_namespace, **template["metadata"]}, "spec": template["spec"]})

    client.create(pod(), dry_run=True)  # admitted: no error
    with pytest.raises(ApiError) as refused:
        client.create(pod(run_as_user=None), dry_run=True)
    message = refused.value.status.message
    assert refused.value.status.code == 403 and 'violates PodSecurity "restricted:latest"' in message, message
    for wanted in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                   "seccompProfile"):
        assert wanted in message, message


def test_the_steps_pod_reports_its_service_accounts_image_pull_secrets(
    k8s_testbed: KubeTestBed, k8s_namespace: str, tmp_path: Path
) -> None:
    """What the train step hands its workers: the API server's ServiceAccount admission merges the
    account's ``imagePullSecrets`` (Kubeflow attaches registry credentials to ``default-editor``, the
    account KFP runs steps as) into the step's Pod, and :func:`own_pod` reads them from it."""
    from lightkube.resources.core_v1 import Pod, ServiceAccount

    from components.launcher.incluster import own_pod

    client = k8s_testbed.client()
    client.create(ServiceAccount.from_dict({"metadata": {"name": "default-editor", "namespace": k8s_namespace},
                                            "imagePullSecrets": [{"name": "regcred"}]}))
    client.create(Pod.from_dict({"metadata": {"name": "step", "namespace": k8s_namespace}, "spec": {
        "serviceAccountName": "default-editor", "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "registry.example/trainflow:1"}]}}))
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text(k8s_namespace)
    me = own_pod(client, environ={"KFP_POD_NAME": "step"}, sa_namespace_file=namespace_file)
    assert me is not None and (me.image, me.image_pull_secrets) == ("registry.example/trainflow:1", ("regcred",))
