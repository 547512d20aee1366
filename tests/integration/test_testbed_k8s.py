"""The Kubernetes test bed behaves like a cluster: the real scheduler counts GPUs, KWOK plays the
kubelet on demand, and PyTorchJobs get the API server's real patch and scale semantics."""

from __future__ import annotations

from typing import Any

import pytest

from components.launcher.runner import JOB_NAME_LABEL, pytorchjob_resource
from tests.support.k8s import KubeTestBed, wait_until

pytestmark = pytest.mark.k8s


def gpu_pod(name: str, gpus: int, pool: str) -> Any:
    from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    return Pod(
        metadata=ObjectMeta(name=name),
        spec=PodSpec(
            nodeSelector={"pool": pool},
            containers=[
                Container(
                    name="main",
                    image="trainflow:test",
                    resources=ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
                )
            ],
        ),
    )


def pod(client: Any, namespace: str, name: str) -> Any:
    from lightkube.resources.core_v1 import Pod

    return client.get(Pod, name, namespace=namespace)


def test_scheduler_binds_within_gpu_capacity_and_leaves_the_rest_pending(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    client = k8s_testbed.client()
    (node,) = kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    client.create(gpu_pod("fits", 8, k8s_namespace), namespace=k8s_namespace)
    client.create(gpu_pod("too-many", 1, k8s_namespace), namespace=k8s_namespace)
    running = wait_until(
        lambda: (p := pod(client, k8s_namespace, "fits")).status.phase == "Running" and p,
        timeout_s=60,
        what="the 8-GPU pod to run",
    )
    assert running.spec.nodeName == node
    assert running.status.podIP

    def unschedulable() -> Any:
        conditions = pod(client, k8s_namespace, "too-many").status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    condition = wait_until(unschedulable, timeout_s=60, what="the 9th GPU to be refused")
    assert condition.reason == "Unschedulable"
    assert "nvidia.com/gpu" in condition.message
    assert pod(client, k8s_namespace, "too-many").status.phase == "Pending"


def test_kwok_terminates_a_pod_with_the_requested_exit_code(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    client = k8s_testbed.client()
    kwok_gpu_nodes(1, 8, labels={"pool": k8s_namespace})
    client.create(gpu_pod("victim", 2, k8s_namespace), namespace=k8s_namespace)
    wait_until(
        lambda: pod(client, k8s_namespace, "victim").status.phase == "Running", timeout_s=60, what="Running"
    )
    k8s_testbed.set_pod_outcome(k8s_namespace, "victim", "Failed", exit_code=137)
    failed = wait_until(
        lambda: (p := pod(client, k8s_namespace, "victim")).status.phase == "Failed" and p,
        timeout_s=30,
        what="Failed",
    )
    assert failed.status.containerStatuses[0].state.terminated.exitCode == 137
    with pytest.raises(ValueError, match="Succeeded"):
        k8s_testbed.set_pod_outcome(k8s_namespace, "victim", "Exploded")


def test_pytorchjob_patch_semantics_and_scale_subresource(
    k8s_testbed: KubeTestBed, k8s_namespace: str, kwok_gpu_nodes: Any
) -> None:
    from lightkube.core.exceptions import ApiError
    from lightkube.types import PatchType

    client = k8s_testbed.client()
    kwok_gpu_nodes(2, 8, labels={"pool": k8s_namespace})
    (name,) = k8s_testbed.create_pytorchjobs(
        k8s_namespace,
        1,
        min_replicas=1,
        max_replicas=2,
        gpus_per_worker=8,
        node_selector={"pool": k8s_namespace},
    )
    resource = pytorchjob_resource()

    def workers() -> list[Any]:
        from lightkube.resources.core_v1 import Pod

        return [
            p
            for p in client.list(Pod, namespace=k8s_namespace, labels={JOB_NAME_LABEL: name})
            if p.status.phase == "Running" and p.metadata.deletionTimestamp is None
        ]

    wait_until(lambda: len(workers()) == 2, timeout_s=60, what="2 Running workers")
    # Custom resources take merge and JSON patches, never strategic-merge patches.
    with pytest.raises(ApiError) as strategic:
        client.patch(resource, name, {"metadata": {"labels": {"x": "y"}}}, namespace=k8s_namespace)
    assert strategic.value.status.code == 415
    client.patch(
        resource,
        name,
        {"metadata": {"labels": {"x": "y"}}},
        namespace=k8s_namespace,
        patch_type=PatchType.MERGE,
    )
    # Shrink through the scale subresource, as the GPU scheduler does: the operator drops worker 1.
    scaled = client.patch(
        resource.Scale, name, {"spec": {"replicas": 1}}, namespace=k8s_namespace, patch_type=PatchType.MERGE
    )
    assert scaled.spec.replicas == 1
    job = client.get(resource, name, namespace=k8s_namespace)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    remaining = wait_until(
        lambda: (w := workers()) and len(w) == 1 and w, timeout_s=60, what="worker 1 to go"
    )
    assert remaining[0].metadata.name == f"{name}-worker-0"
