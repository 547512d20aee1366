"""The kustomize overlays apply server-side to a real API server, and their RBAC is least privilege.

Issue 5, integration test (4): ``kubectl apply --server-side -k`` for every overlay, and
``kubectl auth can-i`` for the scheduler's and the pipeline runner's service accounts. Issue 12
(review finding 9): the scheduler writes PyTorchJobs only in its namespace (standalone), and the
ValidatingAdmissionPolicy holds it to replicas, suspend, nprocPerNode, GPU limits and its own
annotations; the dev MinIO ships no credentials and only trainflow's pods may reach it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.k8s import KubeTestBed

pytestmark = pytest.mark.k8s

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (REPO / "manifests" / "overlays").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of manifests/ with dev MinIO credentials made by the script a user runs (the
    repository holds none)."""
    root = tmp_path_factory.mktemp("manifests") / "manifests"
    shutil.copytree(REPO / "manifests", root, ignore=shutil.ignore_patterns("credentials.env"))
    subprocess.run([str(REPO / "scripts" / "dev-minio-credentials.sh"),
                    str(root / "components" / "dev-minio" / "credentials.env")], check=True, capture_output=True)
    yield root


@pytest.fixture(scope="module", autouse=True)
def _leave_no_workloads(k8s_testbed: KubeTestBed) -> Iterator[None]:
    """After the module, the overlays' Deployments (and their ReplicaSets) and the PyTorchJobs and
    pods these tests made are deleted: left pending, they would land on the next test's KWOK GPU
    node. Seen on a bed with a controller manager (a real node's): the ``held`` job's workers and the
    scheduler's and MinIO's pods took the GPUs of test_testbed_k8s's node, whose 8-GPU pod then
    never ran (2026-11-27, when the KWOK-only tests first ran right after this module)."""
    yield
    for namespace in ("trainflow", "kubeflow"):
        k8s_testbed.kubectl("delete", "deployment,replicaset", "--all", "-n", namespace, "--wait=false", check=False)
        k8s_testbed.cleanup_namespace(namespace)


def build(bed: KubeTestBed, manifests: Path, overlay: str) -> list[dict]:
    return list(yaml.safe_load_all(bed.kubectl("kustomize", str(manifests / "overlays" / overlay)).stdout))

# Schema-less stand-ins for the Prometheus Operator's CRDs (not part of the test bed), so the
# monitoring component's objects can be stored; kustomize and the API server still check the rest.
MONITORING_CRDS = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules"),
                         ("PodMonitor", "podmonitors"))
]


#: Kinds the overlays hold that have no namespace.
CLUSTER_SCOPED_KINDS = frozenset({
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
})


#: What ``can_i`` reads as a subresource after ``/`` (anything else there is an object's name):
#: ``kubectl auth can-i get pods/log`` asks about a pod *named* log, not its log.
SUBRESOURCES = frozenset({"scale", "status", "log", "exec"})


def can_i(bed: KubeTestBed, verb: str, resource: str, *, sa: str, namespace: str) -> bool:
    kind, _, tail = resource.partition("/")
    target = [kind, f"--subresource={tail}"] if tail in SUBRESOURCES else [resource]
    result = bed.kubectl(
        "auth", "can-i", verb, *target, f"--as=system:serviceaccount:{sa}", "-n", namespace, check=False
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def test_every_overlay_builds_and_names_its_namespace(k8s_testbed: KubeTestBed, manifests: Path) -> None:
    assert set(OVERLAYS) >= {"standalone", "kubeflow-platform", "standalone-monitoring"}
    for overlay in OVERLAYS:
        built = build(k8s_testbed, manifests, overlay)
        kinds = {d["kind"] for d in built}
        assert {"Deployment", "ServiceAccount", "ClusterRole", "ConfigMap"} <= kinds, overlay
        deployment = next(
            d
            for d in built
            if d["kind"] == "Deployment" and d["metadata"]["name"] == "trainflow-gpu-scheduler"
        )
        assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == [
            "python",
            "-m",
            "gpu_scheduler",
            "run",
        ]
        assert "Secret" not in {
            r
            for d in built
            if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "trainflow-gpu-scheduler"
            for rule in d["rules"]
            for r in rule["resources"]
        }
        # every namespaced object names its namespace: `kubectl apply -k` would put one without it
        # into the current context's namespace (the monitoring objects landed in `default`)
        unplaced = [f"{d['kind']}/{d['metadata']['name']}" for d in built
                    if d["kind"] not in CLUSTER_SCOPED_KINDS and not d["metadata"].get("namespace")]
        assert not unplaced, (overlay, unplaced)


def test_platform_overlay_refuses_a_base_whose_patched_entries_moved(
    k8s_testbed: KubeTestBed, manifests: Path, tmp_path: Path
) -> None:
    """The kubeflow-platform overlay patches the scheduler's env and args by list position; a base
    that moved them made it remove another flag silently. Its JSON-patch `test` ops refuse that."""
    built = build(k8s_testbed, manifests, "kubeflow-platform")
    (scheduler,) = [d for d in built if d["kind"] == "Deployment"]
    container = scheduler["spec"]["template"]["spec"]["containers"][0]
    assert not any(a.startswith("--watch-namespace") for a in container["args"])  # every namespace
    assert {"--policy-configmap=trainflow-gpu-scheduler-policy", "--metrics-port=9400"} <= set(container["args"])
    assert {"name": "PROMETHEUS_URL", "value": "http://prometheus-k8s.monitoring:9090"} in container["env"]
    copy = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", copy)
    deployment = copy / "base" / "scheduler" / "deployment.yaml"
    text = deployment.read_text()
    moved = text.replace("        - --metrics-addr=0.0.0.0\n", "").replace(
        "        - --policy-configmap=trainflow-gpu-scheduler-policy\n",
        "        - --policy-configmap=trainflow-gpu-scheduler-policy\n        - --metrics-addr=0.0.0.0\n",
    )
    assert moved != text
    deployment.write_text(moved)
    refused = k8s_testbed.kubectl("kustomize", str(copy / "overlays" / "kubeflow-platform"), check=False)
    assert refused.returncode != 0 and "args/2" in refused.stderr, refused.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_applies_server_side(k8s_testbed: KubeTestBed, manifests: Path, overlay: str) -> None:
    if overlay.endswith("monitoring"):
        k8s_testbed.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(MONITORING_CRDS))
        k8s_testbed.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            "--timeout=30s",
        )
    result = k8s_testbed.kubectl(
        "apply", "--server-side", "-k", str(manifests / "overlays" / overlay), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "serverside-applied" in result.stdout
    namespace = "kubeflow" if overlay == "kubeflow-platform" else "trainflow"
    got = k8s_testbed.kubectl(
        "get",
        "deployment/trainflow-gpu-scheduler",
        "configmap/trainflow-gpu-scheduler-policy",
        "-n",
        namespace,
        "-o",
        "name",
    )
    assert got.stdout.split() == [
        "deployment.apps/trainflow-gpu-scheduler",
        "configmap/trainflow-gpu-scheduler-policy",
    ]
    if overlay.endswith("monitoring"):
        # kube-prometheus' Prometheus discovers only where it has a Role: the scheduler's Service and
        # the trainer pods here, nothing more
        for verb, resource in [("list", "pods"), ("watch", "services"), ("list", "endpointslices.discovery.k8s.io")]:
            assert can_i(k8s_testbed, verb, resource, sa="monitoring:prometheus-k8s", namespace=namespace), resource
        assert not can_i(k8s_testbed, "list", "secrets", sa="monitoring:prometheus-k8s", namespace=namespace)
        assert not can_i(k8s_testbed, "list", "pods", sa="monitoring:prometheus-k8s", namespace="team-a")


@pytest.mark.parametrize("namespace", ["trainflow", "kubeflow"])
def test_scheduler_can_patch_pytorchjobs_but_not_read_secrets(
    k8s_testbed: KubeTestBed, manifests: Path, namespace: str
) -> None:
    overlay = "standalone" if namespace == "trainflow" else "kubeflow-platform"
    k8s_testbed.kubectl("apply", "--server-side", "-k", str(manifests / "overlays" / overlay))
    sa = f"{namespace}:trainflow-gpu-scheduler"
    for verb, resource in [
        ("patch", "pytorchjobs.kubeflow.org"),
        ("patch", "pytorchjobs.kubeflow.org/scale"),
        ("watch", "pytorchjobs.kubeflow.org"),
        ("create", "events"),
    ]:
        assert can_i(k8s_testbed, verb, resource, sa=sa, namespace=namespace), (verb, resource)
        # Review finding 9: the standalone scheduler writes only where its jobs are (its
        # namespace); on the Kubeflow platform, jobs live in every profile namespace.
        elsewhere = can_i(k8s_testbed, verb, resource, sa=sa, namespace="team-a")
        assert elsewhere == (namespace == "kubeflow" or verb == "watch"), (verb, resource)
    for verb, resource in [
        ("list", "pods"),
        ("list", "nodes"),
        ("create", "tokenreviews.authentication.k8s.io"),
        ("create", "subjectaccessreviews.authorization.k8s.io"),
    ]:
        assert can_i(k8s_testbed, verb, resource, sa=sa, namespace="team-a"), (verb, resource)
    for verb, resource in [
        ("get", "secrets"),
        ("list", "secrets"),
        ("delete", "pods"),
        ("create", "pods"),
        ("delete", "pytorchjobs.kubeflow.org"),
        ("create", "pytorchjobs.kubeflow.org"),
        ("patch", "nodes"),
        ("create", "pods/exec"),
    ]:
        assert not can_i(k8s_testbed, verb, resource, sa=sa, namespace="team-a"), (verb, resource)
        assert not can_i(k8s_testbed, verb, resource, sa=sa, namespace=namespace), (verb, resource)
    # least privilege: what the actuator never sends (test_controller_k8s runs it under this RBAC)
    for verb, resource in [("update", "pytorchjobs.kubeflow.org/scale"), ("get", "pytorchjobs.kubeflow.org/scale"),
                           ("patch", "events"), ("create", "events.events.k8s.io")]:
        assert not can_i(k8s_testbed, verb, resource, sa=sa, namespace=namespace), (verb, resource)
    # Its own namespace: the policy ConfigMap and the leader-election Lease, nothing more.
    assert can_i(
        k8s_testbed, "watch", "configmaps/trainflow-gpu-scheduler-policy", sa=sa, namespace=namespace
    )
    assert not can_i(k8s_testbed, "get", "configmaps/other", sa=sa, namespace=namespace)
    assert can_i(
        k8s_testbed,
        "update",
        "leases.coordination.k8s.io/trainflow-gpu-scheduler",
        sa=sa,
        namespace=namespace,
    )
    assert not can_i(
        k8s_testbed, "get", "configmaps/trainflow-gpu-scheduler-policy", sa=sa, namespace="team-a"
    )


def test_pipeline_runner_can_run_pytorchjobs_in_its_namespace_only(k8s_testbed: KubeTestBed, manifests: Path) -> None:
    k8s_testbed.kubectl("apply", "--server-side", "-k", str(manifests / "overlays" / "standalone"))
    for sa in ("trainflow:trainflow-pipeline-runner", "kubeflow:pipeline-runner"):
        for verb in ("create", "get", "list", "patch", "delete"):
            assert can_i(k8s_testbed, verb, "pytorchjobs.kubeflow.org", sa=sa, namespace="trainflow"), (
                sa,
                verb,
            )
        assert can_i(k8s_testbed, "get", "pods/log", sa=sa, namespace="trainflow")
        assert can_i(k8s_testbed, "watch", "pods", sa=sa, namespace="trainflow")
        assert can_i(k8s_testbed, "list", "events", sa=sa, namespace="trainflow")
        # least privilege: what the launcher never does (test_launcher_k8s runs it under this role)
        for verb, resource in [("watch", "pytorchjobs.kubeflow.org"), ("get", "pytorchjobs.kubeflow.org/status"),
                               ("watch", "events"), ("list", "pods/log"), ("delete", "pods")]:
            assert not can_i(k8s_testbed, verb, resource, sa=sa, namespace="trainflow"), (sa, verb, resource)
        assert not can_i(k8s_testbed, "create", "pytorchjobs.kubeflow.org", sa=sa, namespace="team-a"), sa
        assert not can_i(k8s_testbed, "get", "secrets", sa=sa, namespace="trainflow"), sa


def test_example_pytorchjob_passes_the_crd_schema_and_the_operator_webhook(k8s_testbed: KubeTestBed) -> None:
    k8s_testbed.create_namespace("trainflow")
    example = REPO / "manifests" / "examples" / "pytorchjob.yaml"
    result = k8s_testbed.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", str(example), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "serverside-applied (server dry run)" in result.stdout


def test_dev_minio_ships_no_credentials_and_admits_only_trainflow_pods(
    k8s_testbed: KubeTestBed, manifests: Path, tmp_path: Path
) -> None:
    """Review finding 9: the standalone overlay shipped MinIO with fixed root credentials and no
    NetworkPolicy."""
    assert not (REPO / "manifests" / "components" / "dev-minio" / "credentials.env").exists()
    for path in (REPO / "manifests").rglob("*.yaml"):
        assert "change-me" not in path.read_text() and "AWS_SECRET_ACCESS_KEY:" not in path.read_text(), path
    bare = tmp_path / "bare"
    shutil.copytree(REPO / "manifests", bare, ignore=shutil.ignore_patterns("credentials.env"))
    refused = k8s_testbed.kubectl("kustomize", str(bare / "overlays" / "standalone"), check=False)
    assert refused.returncode != 0 and "credentials.env" in refused.stderr  # no silent default
    other = tmp_path / "other.env"
    subprocess.run([str(REPO / "scripts" / "dev-minio-credentials.sh"), str(other)], check=True, capture_output=True)
    built = build(k8s_testbed, manifests, "standalone")
    (secret,) = [d for d in built if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "trainflow-s3-credentials"
    import base64

    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    generated = dict(line.split("=", 1) for line in other.read_text().split())
    assert set(values) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} and len(values["AWS_SECRET_ACCESS_KEY"]) >= 32
    assert values != generated  # random per installation
    (policy,) = [d for d in built if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "trainflow-minio"}}
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9000, "protocol": "TCP"}]
    allowed = [(bool(peer.get("namespaceSelector") is not None), peer["podSelector"]["matchLabels"])
               for peer in rule["from"]]
    assert allowed == [(True, {"trainflow.dev/managed": "true"}),
                       (False, {"app.kubernetes.io/name": "trainflow-minio-client"}),
                       (True, {"pipelines.kubeflow.org/v2_component": "true"}),
                       (True, {"trainflow.dev/s3-client": "true"})]
    (init,) = [d for d in built if d["kind"] == "Job"]
    assert init["spec"]["template"]["metadata"]["labels"] == {"app.kubernetes.io/name": "trainflow-minio-client"}


@pytest.mark.parametrize("overlay", ["standalone", "kubeflow-platform"])
def test_scheduler_deployment_probes_and_serves_authenticated_metrics(
    k8s_testbed: KubeTestBed, manifests: Path, overlay: str
) -> None:
    """Review item 4 (probes) and finding 10 (/metrics on 0.0.0.0 only with authentication)."""
    built = build(k8s_testbed, manifests, overlay)
    (deployment,) = [d for d in built if d["kind"] == "Deployment" and d["metadata"]["name"] == "trainflow-gpu-scheduler"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert "--metrics-addr=0.0.0.0" in args and not any(a.startswith("--metrics-auth") for a in args)  # auto: kubernetes
    assert ("--watch-namespace=$(POD_NAMESPACE)" in args) == (overlay == "standalone")
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["livenessProbe"]["periodSeconds"] * container["livenessProbe"]["failureThreshold"] >= 60


def _patch_as_scheduler(bed: KubeTestBed, namespace: str, name: str, kind: str, patch: str) -> subprocess.CompletedProcess:
    return bed.kubectl("patch", "pytorchjob", name, "-n", namespace, f"--type={kind}", "-p", patch,
                       f"--as=system:serviceaccount:{namespace}:trainflow-gpu-scheduler", check=False)


def test_admission_policy_holds_the_scheduler_to_replicas_suspend_gpus_and_its_annotations(
    k8s_testbed: KubeTestBed, manifests: Path
) -> None:
    """Review finding 9: RBAC lets the scheduler patch a PyTorchJob's pod template (image, service
    account, env, ...); the ValidatingAdmissionPolicy lets through only what the scheduler writes."""
    import json

    from components.launcher.pytorchjob import PyTorchJobSpec, render_pytorchjob

    k8s_testbed.kubectl("apply", "--server-side", "-k", str(manifests / "overlays" / "standalone"))
    ns = "trainflow"
    spec = PyTorchJobSpec(run_id="vap", task_name="held", namespace=ns, image="trainflow:test", min_replicas=1,
                          max_replicas=4, replicas=2, gpus_per_worker=1, nproc_per_node=1, cpu="10m", memory="64Mi")
    k8s_testbed.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(render_pytorchjob(spec)))
    pod = "/spec/pytorchReplicaSpecs/Worker/template/spec"
    allowed = [
        ("merge", {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}, "runPolicy": {"suspend": True}},
                   "metadata": {"annotations": {"gpu-scheduler.trainflow.dev/scale-up": "{}",
                                                "policy.gpu-scheduler.trainflow.dev/queue": "1"}}}),
        ("merge", {"metadata": {"annotations": {"gpu-scheduler.trainflow.dev/scale-up": None}}}),
        ("json", [{"op": "test", "path": "/spec/runPolicy/suspend", "value": True},
                  {"op": "add", "path": f"{pod}/containers/0/resources",
                   "value": {"limits": {"nvidia.com/gpu": "2", "memory": "64Mi"},
                             "requests": {"cpu": "10m", "memory": "64Mi"}}},
                  {"op": "replace", "path": "/spec/nprocPerNode", "value": "2"}]),
        ("merge", {"spec": {"runPolicy": {"suspend": False}}}),
    ]
    for kind, patch in allowed:
        result = _patch_as_scheduler(k8s_testbed, ns, spec.name, kind, json.dumps(patch))
        assert result.returncode == 0, (patch, result.stderr)
    denied = [
        ("json", [{"op": "replace", "path": f"{pod}/containers/0/image", "value": "evil:latest"}], "container"),
        ("json", [{"op": "replace", "path": f"{pod}/containers/0/command", "value": ["sh", "-c", "id"]}], "container"),
        ("json", [{"op": "add", "path": f"{pod}/containers/0/env/-", "value": {"name": "X", "value": "1"}}], "container"),
        ("json", [{"op": "add", "path": f"{pod}/containers/0/resources/limits/memory", "value": "1Ti"}], "container"),
        ("json", [{"op": "add", "path": f"{pod}/containers/-", "value": {"name": "sidecar", "image": "evil"}}],
         "container"),
        ("json", [{"op": "add", "path": f"{pod}/serviceAccountName", "value": "admin"}], "Worker"),
        ("json", [{"op": "add", "path": f"{pod}/volumes", "value": [{"name": "host", "hostPath": {"path": "/"}}]}],
         "Worker"),
        ("json", [{"op": "add", "path": f"{pod}/nodeSelector", "value": {"gpu": "a100"}}], "Worker"),
        ("json", [{"op": "add", "path": "/spec/pytorchReplicaSpecs/Worker/template/metadata/labels/x", "value": "1"}],
         "Worker"),
        ("json", [{"op": "replace", "path": "/spec/pytorchReplicaSpecs/Worker/restartPolicy", "value": "Never"}],
         "Worker"),
        ("merge", {"spec": {"elasticPolicy": {"maxReplicas": 64}}}, "spec"),
        ("merge", {"spec": {"runPolicy": {"cleanPodPolicy": "All"}}}, "spec"),
        ("merge", {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
            "containers": [{"name": "pytorch", "image": "evil"}]}}}}}}, "Worker replica spec"),
        ("merge", {"metadata": {"labels": {"trainflow.dev/managed": "false"}}}, "metadata"),
        ("merge", {"metadata": {"annotations": {"trainflow.dev/job-key": "someone/else"}}}, "annotations"),
    ]
    before = k8s_testbed.kubectl("get", "pytorchjob", spec.name, "-n", ns, "-o", "json").stdout
    for kind, patch, what in denied:
        result = _patch_as_scheduler(k8s_testbed, ns, spec.name, kind, json.dumps(patch))
        assert result.returncode != 0 and "trainflow-gpu-scheduler-writes" in result.stderr, (patch, result.stderr)
        assert what in result.stderr, (patch, result.stderr)
    after = k8s_testbed.kubectl("get", "pytorchjob", spec.name, "-n", ns, "-o", "json").stdout

    def written(doc: str) -> tuple:
        # What a denied patch could have changed. Not resourceVersion: the job was resumed above, so
        # the training operator keeps updating its status meanwhile (status subresource).
        meta = json.loads(doc)["metadata"]
        return json.loads(doc)["spec"], meta["generation"], meta.get("labels"), meta.get("annotations")

    assert written(after) == written(before)
    # Only the scheduler is held to it: the job's owner may still change its image.
    k8s_testbed.kubectl("patch", "pytorchjob", spec.name, "-n", ns, "--type=json", "-p",
                        json.dumps(denied[0][1]))


def test_the_schedulers_own_patches_pass_its_admission_policy(
    k8s_testbed: KubeTestBed, manifests: Path, tmp_path: Path
) -> None:
    """The planner's patches (scale, suspend/resume, the GPUs-per-worker template patch), sent by
    the real actuator as the scheduler's ServiceAccount, pass the policy above."""
    import json

    from components.launcher.pytorchjob import PyTorchJobSpec, render_pytorchjob
    from gpu_scheduler.actuate.apply import Actuator
    from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST, ActionKind, PlanSettings, plan_safety
    from gpu_scheduler.kube import JobView
    from gpu_scheduler.model import Placement
    from gpu_scheduler.observe.kubernetes import KubeConnector, pytorchjob_state
    from tests.support.k8s import pytorchjob_resource

    k8s_testbed.kubectl("apply", "--server-side", "-k", str(manifests / "overlays" / "standalone"))
    ns = "trainflow"
    spec = PyTorchJobSpec(run_id="vap", task_name="planned", namespace=ns, image="trainflow:test", min_replicas=1,
                          max_replicas=4, replicas=2, gpus_per_worker=1, nproc_per_node=1, cpu="10m", memory="64Mi")
    manifest = render_pytorchjob(spec)
    manifest["metadata"]["annotations"][GPUS_PER_WORKER_REQUEST] = "2"
    k8s_testbed.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(manifest))
    client = k8s_testbed.client()
    kubeconfig = k8s_testbed.service_account_kubeconfig(ns, "trainflow-gpu-scheduler", tmp_path / "scheduler.kubeconfig")
    actuator = Actuator(KubeConnector(kubeconfig).client(), record_events=False, async_events=False)

    def step(now_s: float, pods: tuple[str, ...] = (), before_apply=lambda: None) -> list:
        obj = client.get(pytorchjob_resource(), spec.name, namespace=ns)
        job = pytorchjob_state(obj.to_dict() if hasattr(obj, "to_dict") else dict(obj))
        view = JobView(job=job, placement=Placement.of({"n0": len(pods)}) if pods else Placement(), pods=pods)
        actions = plan_safety({job.key: view}, now_s, PlanSettings())
        before_apply()
        return [(r.action.kind, r.status, r.message) for r in actuator.apply(actions)]

    def users_edit() -> None:  # the Worker's memory limit, between the planner's read and its patch
        path = "/spec/pytorchReplicaSpecs/Worker/template/spec/containers/0/resources/limits/memory"
        k8s_testbed.kubectl("patch", "pytorchjob", spec.name, "-n", ns, "--type=json",
                            "-p", json.dumps([{"op": "replace", "path": path, "value": "96Mi"}]))

    assert step(1.0, pods=("w-0", "w-1")) == [(ActionKind.RESHAPE_SUSPEND, "applied", "")]
    # the template patch tests the container's resources are those it read: a user's edit is kept
    ((kind, status, message),) = step(1.5, before_apply=users_edit)
    assert (kind, status) == (ActionKind.RESHAPE_RESUME, "invalid"), message
    assert message.endswith(": /spec/runPolicy/suspend, /spec/pytorchReplicaSpecs/Worker/template/spec/containers/0/"
                            "resources changed since it was observed (or the patch is invalid)"), message
    assert step(2.0) == [(ActionKind.RESHAPE_RESUME, "applied", "")]  # template JSON patch, then resume
    job = client.get(pytorchjob_resource(), spec.name, namespace=ns)
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in ("2", 2)
    assert worker["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "96Mi"
    assert not job["spec"]["runPolicy"].get("suspend")
    actuator.close()
