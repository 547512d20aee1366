"""The literal copies in manifests/ agree with the code that is their home (one home per concept;
YAML cannot import Python). The manifests' behaviour against kube-apiserver is tested in
tests/integration/test_manifests_k8s.py."""

from __future__ import annotations

from pathlib import Path

import yaml

from components.launcher.pytorchjob import MANAGED_LABEL as LAUNCHER_MANAGED_LABEL
from components.launcher.pytorchjob import METRICS_PORT_NAME
from gpu_scheduler.kube import ANNOTATION_PREFIX, GPU_RESOURCE, MANAGED_LABEL, POLICY_ANNOTATION_PREFIX

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def docs(path: str) -> list[dict]:
    return list(yaml.safe_load_all((MANIFESTS / path).read_text()))


def test_the_role_and_the_cluster_role_grant_the_same_writes_to_pytorchjobs() -> None:
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs("base/scheduler/rbac.yaml")}
    cluster = by_name[("ClusterRole", "trainflow-gpu-scheduler-jobs")]["rules"]
    own = by_name[("Role", "trainflow-gpu-scheduler")]["rules"]
    assert own[: len(cluster)] == cluster
    reads = by_name[("ClusterRole", "trainflow-gpu-scheduler")]["rules"]
    assert not any("patch" in rule["verbs"] or "create" in rule["verbs"] for rule in reads
                   if "kubeflow.org" in rule.get("apiGroups", ()))


def test_the_admission_policy_names_the_schedulers_own_prefixes_and_the_gpu_resource() -> None:
    policy, binding = docs("base/scheduler/admission-policy.yaml")
    spec = policy["spec"]
    (own,) = [v["expression"] for v in spec["variables"] if v["name"] == "ownAnnotation"]
    assert yaml.safe_load(own) == [ANNOTATION_PREFIX, POLICY_ANNOTATION_PREFIX]
    (account,) = docs("base/scheduler/serviceaccount.yaml")
    assert f"':{account['metadata']['name']}'" in spec["matchConditions"][0]["expression"]
    assert f"'{GPU_RESOURCE}'" in spec["validations"][-1]["expression"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_pod_monitor_selects_the_launchers_pods_and_port() -> None:
    (monitor,) = docs("components/monitoring/podmonitor.yaml")
    assert LAUNCHER_MANAGED_LABEL == MANAGED_LABEL
    assert monitor["spec"]["selector"] == {"matchLabels": {MANAGED_LABEL: "true"}}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == [METRICS_PORT_NAME]
    (policy,) = docs("components/dev-minio/networkpolicy.yaml")
    assert {MANAGED_LABEL: "true"} in [p["podSelector"]["matchLabels"] for p in policy["spec"]["ingress"][0]["from"]]


def test_dev_minio_admits_the_launchers_workers_from_any_namespace() -> None:
    """The train step's pre-flight reaches MinIO as a KFP step (any namespace); its workers run in
    the job's namespace (``kubeflow`` under KFP standalone, not MinIO's), so their rule needs the
    same ``namespaceSelector: {}`` — without it only workers in MinIO's own namespace get through."""
    (policy,) = docs("components/dev-minio/networkpolicy.yaml")
    (managed,) = [p for p in policy["spec"]["ingress"][0]["from"]
                  if p["podSelector"]["matchLabels"] == {MANAGED_LABEL: "true"}]
    assert managed == {"namespaceSelector": {}, "podSelector": {"matchLabels": {MANAGED_LABEL: "true"}}}


def test_the_recording_rules_record_the_controllers_queries() -> None:
    """One home: the monitoring component's recording rules are the observer's QUERIES at the
    rules' window, recorded under the names the observer reads with ``recorded=True``."""
    from gpu_scheduler.observe.prometheus import QUERIES, RECORDED, RULES_WINDOW

    (rule,) = docs("components/monitoring/prometheusrule.yaml")
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "trainflow-gpu-scheduler-inputs"]
    assert {r["record"]: r["expr"] for r in group["rules"]} == {
        RECORDED[key]: query.format(window=RULES_WINDOW) for key, query in QUERIES.items()}


def test_the_role_grants_the_lease_of_the_controller_and_of_a_dry_run_preview() -> None:
    """Review 2026-11-30: ``run --dry-run`` competed for the real Lease and could win it (the real
    controller then stood still); a preview holds a Lease of its own, which the Role must grant."""
    from gpu_scheduler.settings import ControllerSettings

    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs("base/scheduler/rbac.yaml")}
    granted = {name for rule in by_name[("Role", "trainflow-gpu-scheduler")]["rules"]
               if "leases" in rule["resources"] for name in rule.get("resourceNames", ())}
    url = "http://prometheus:9090"
    real, preview = ControllerSettings(prometheus_url=url), ControllerSettings(prometheus_url=url, dry_run=True)
    assert real.election_lease_name == real.lease_name != preview.election_lease_name
    assert granted == {real.election_lease_name, preview.election_lease_name}
