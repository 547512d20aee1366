"""Who the launcher is inside a pod: namespace from the ServiceAccount mount, Pod from KFP's env."""

from __future__ import annotations

from pathlib import Path

from components.launcher.incluster import PodIdentity, own_namespace, own_pod


def test_outside_a_pod_there_is_no_own_pod(tmp_path: Path) -> None:
    missing = tmp_path / "namespace"
    assert own_namespace(missing) is None
    assert own_pod(environ={"KFP_POD_NAME": "p", "KFP_POD_UID": "u"}, sa_namespace_file=missing) is None


def test_a_kfp_task_pod_names_itself_through_the_downward_api(tmp_path: Path) -> None:
    ns = tmp_path / "namespace"
    ns.write_text("team-ml\n")
    me = own_pod(environ={"KFP_POD_NAME": "training-pipeline-abc-system-container-impl-123",
                          "KFP_POD_UID": "3c1e-uid", "HOSTNAME": "ignored"}, sa_namespace_file=ns)
    assert me == PodIdentity(namespace="team-ml", name="training-pipeline-abc-system-container-impl-123",
                             uid="3c1e-uid")
    assert me.owner_reference() == {"apiVersion": "v1", "kind": "Pod",
                                    "name": "training-pipeline-abc-system-container-impl-123", "uid": "3c1e-uid"}
    # Without a uid (and no API to ask) no owner can be named: better none than a wrong one.
    assert own_pod(environ={"HOSTNAME": "pod-x"}, sa_namespace_file=ns) is None
