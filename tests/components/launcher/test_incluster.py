"""Who the launcher is inside a pod: namespace from the ServiceAccount mount, Pod from KFP's env."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.launcher import incluster
from components.launcher.incluster import PodIdentity, own_namespace, own_pod


@pytest.fixture(autouse=True)
def _no_resolvable_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The IP fallback resolves this machine's host name: make it resolve to nothing by default."""

    def unresolvable(name: str) -> str:
        raise OSError(f"{name}: unknown host")

    monkeypatch.setattr(incluster.socket, "gethostbyname", unresolvable)


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


class _Client:
    """``client.get(Pod, name, namespace=)`` of lightkube, answering one Pod or refusing (403)."""

    def __init__(self, pod: Any | None) -> None:
        self.pod, self.asked = pod, []

    def get(self, kind: Any, name: str, *, namespace: str) -> Any:
        self.asked.append((kind.__name__, name, namespace))
        if self.pod is None:
            raise RuntimeError("403 Forbidden")
        return self.pod


def _pod(ip: str | None, pull_secrets: tuple[str, ...] = ()) -> Any:
    from lightkube.models.core_v1 import Container, LocalObjectReference, PodSpec, PodStatus
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    return Pod(metadata=ObjectMeta(name="p", uid="u-from-api"),
               spec=PodSpec(containers=[Container(name="wait"), Container(name="main", image="img:1")],
                            imagePullSecrets=[LocalObjectReference(name=n) for n in pull_secrets] or None),
               status=PodStatus(podIP=ip))


def test_the_pod_ip_is_read_from_the_pods_status(tmp_path: Path) -> None:
    ns = tmp_path / "namespace"
    ns.write_text("team-ml")
    client = _Client(_pod("10.244.1.17"))
    me = own_pod(client, environ={"KFP_POD_NAME": "p"}, sa_namespace_file=ns)
    assert me == PodIdentity(namespace="team-ml", name="p", uid="u-from-api", image="img:1", ip="10.244.1.17")
    assert client.asked == [("Pod", "p", "team-ml")]


def test_without_get_pod_the_ip_is_what_the_host_name_resolves_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = tmp_path / "namespace"
    ns.write_text("team-ml")
    env = {"KFP_POD_NAME": "p", "KFP_POD_UID": "u"}
    monkeypatch.setattr(incluster.socket, "gethostname", lambda: "p")
    monkeypatch.setattr(incluster.socket, "gethostbyname", {"p": "10.244.1.18"}.__getitem__)
    assert own_pod(_Client(None), environ=env, sa_namespace_file=ns).ip == "10.244.1.18"  # RBAC refused GET pod
    assert own_pod(_Client(_pod(None)), environ=env, sa_namespace_file=ns).ip == "10.244.1.18"  # no IP yet
    # A host name mapped to loopback (a laptop's /etc/hosts) is no address another pod can reach.
    monkeypatch.setattr(incluster.socket, "gethostbyname", {"p": "127.0.1.1"}.__getitem__)
    assert own_pod(_Client(None), environ=env, sa_namespace_file=ns).ip == ""


def test_the_pods_image_pull_secrets_are_read_with_its_image(tmp_path: Path) -> None:
    ns = tmp_path / "namespace"
    ns.write_text("team-ml")
    me = own_pod(_Client(_pod("10.244.1.17", ("regcred", "mirror"))), environ={"KFP_POD_NAME": "p"},
                 sa_namespace_file=ns)
    assert me is not None and me.image_pull_secrets == ("regcred", "mirror")


HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize(("image", "image_id", "pinned"), [
    ("img:1", f"docker.io/library/img@sha256:{HEX}", f"img@sha256:{HEX}"),
    ("reg.example:5000/team/app:2.0", f"reg.example:5000/team/app@sha256:{HEX}",
     f"reg.example:5000/team/app@sha256:{HEX}"),
    ("reg.example:5000/team/app", f"docker-pullable://reg.example:5000/team/app@sha256:{HEX}",
     f"reg.example:5000/team/app@sha256:{HEX}"),
    ("img:1", f"sha256:{HEX}", "img:1"),  # the image's local id (built or imported on the node): no digest
    ("img:1", "", "img:1"),  # not started yet
    (f"img@sha256:{'f' * 64}", f"docker.io/library/img@sha256:{HEX}", f"img@sha256:{'f' * 64}"),  # as written
])
def test_the_workers_get_the_pods_image_by_the_digest_it_was_pulled_at(tmp_path: Path, image: str, image_id: str,
                                                                      pinned: str) -> None:
    """Review: the workers got the step's image by tag, so a tag pushed again while the job ran
    (``:latest``) gave them, and every restarted worker, other code than the step's."""
    from lightkube.models.core_v1 import ContainerStatus

    ns = tmp_path / "namespace"
    ns.write_text("team-ml")
    pod = _pod("10.244.1.17")
    pod.spec.containers[1].image = image
    pod.status.containerStatuses = [
        ContainerStatus(name="wait", image="kfp-launcher", imageID=f"ghcr.io/kfp/launcher@sha256:{'e' * 64}", ready=True,
                        restartCount=0),
        ContainerStatus(name="main", image=image, imageID=image_id, ready=True, restartCount=0)]
    me = own_pod(_Client(pod), environ={"KFP_POD_NAME": "p"}, sa_namespace_file=ns)
    assert me is not None and me.image == image and me.pinned_image() == pinned
