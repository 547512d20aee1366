"""The kustomize overlays apply server-side to a real API server, and their RBAC is least privilege.

Issue 5, integration test (4): ``kubectl apply --server-side -k`` for every overlay, and
``kubectl auth can-i`` for the scheduler's and the pipeline runner's service accounts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.k8s import KubeTestBed

pytestmark = pytest.mark.k8s

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
OVERLAYS = sorted(p.name for p in (MANIFESTS / "overlays").iterdir() if p.is_dir())

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
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules"))
]


def can_i(bed: KubeTestBed, verb: str, resource: str, *, sa: str, namespace: str) -> bool:
    result = bed.kubectl(
        "auth", "can-i", verb, resource, f"--as=system:serviceaccount:{sa}", "-n", namespace, check=False
    )
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


def test_every_overlay_builds_and_names_its_namespace(k8s_testbed: KubeTestBed) -> None:
    assert set(OVERLAYS) >= {"standalone", "kubeflow-platform", "standalone-monitoring"}
    for overlay in OVERLAYS:
        built = list(
            yaml.safe_load_all(k8s_testbed.kubectl("kustomize", str(MANIFESTS / "overlays" / overlay)).stdout)
        )
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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_applies_server_side(k8s_testbed: KubeTestBed, overlay: str) -> None:
    if overlay.endswith("monitoring"):
        k8s_testbed.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(MONITORING_CRDS))
        k8s_testbed.kubectl(
            "wait",
            "--for=condition=Established",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
            "--timeout=30s",
        )
    result = k8s_testbed.kubectl(
        "apply", "--server-side", "-k", str(MANIFESTS / "overlays" / overlay), check=False
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


@pytest.mark.parametrize("namespace", ["trainflow", "kubeflow"])
def test_scheduler_can_patch_pytorchjobs_but_not_read_secrets(
    k8s_testbed: KubeTestBed, namespace: str
) -> None:
    overlay = "standalone" if namespace == "trainflow" else "kubeflow-platform"
    k8s_testbed.kubectl("apply", "--server-side", "-k", str(MANIFESTS / "overlays" / overlay))
    sa = f"{namespace}:trainflow-gpu-scheduler"
    for verb, resource in [
        ("patch", "pytorchjobs.kubeflow.org"),
        ("patch", "pytorchjobs.kubeflow.org/scale"),
        ("watch", "pytorchjobs.kubeflow.org"),
        ("list", "pods"),
        ("list", "nodes"),
        ("create", "events"),
    ]:
        assert can_i(k8s_testbed, verb, resource, sa=sa, namespace="team-a"), (verb, resource)
    for verb, resource in [
        ("get", "secrets"),
        ("list", "secrets"),
        ("delete", "pods"),
        ("create", "pods"),
        ("delete", "pytorchjobs.kubeflow.org"),
        ("patch", "nodes"),
        ("create", "pods/exec"),
    ]:
        assert not can_i(k8s_testbed, verb, resource, sa=sa, namespace="team-a"), (verb, resource)
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


def test_pipeline_runner_can_run_pytorchjobs_in_its_namespace_only(k8s_testbed: KubeTestBed) -> None:
    k8s_testbed.kubectl("apply", "--server-side", "-k", str(MANIFESTS / "overlays" / "standalone"))
    for sa in ("trainflow:trainflow-pipeline-runner", "kubeflow:pipeline-runner"):
        for verb in ("create", "get", "watch", "delete"):
            assert can_i(k8s_testbed, verb, "pytorchjobs.kubeflow.org", sa=sa, namespace="trainflow"), (
                sa,
                verb,
            )
        assert can_i(k8s_testbed, "get", "pods/log", sa=sa, namespace="trainflow")
        assert not can_i(k8s_testbed, "create", "pytorchjobs.kubeflow.org", sa=sa, namespace="team-a"), sa
        assert not can_i(k8s_testbed, "get", "secrets", sa=sa, namespace="trainflow"), sa


def test_example_pytorchjob_passes_the_crd_schema_and_the_operator_webhook(k8s_testbed: KubeTestBed) -> None:
    k8s_testbed.create_namespace("trainflow")
    example = MANIFESTS / "examples" / "pytorchjob.yaml"
    result = k8s_testbed.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", str(example), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "serverside-applied (server dry run)" in result.stdout
