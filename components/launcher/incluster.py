"""Who the launcher is when it runs in a pod: its namespace, its Pod (for ownerReferences), its image.

A KFP task pod gets ``KFP_POD_NAME`` and ``KFP_POD_UID`` from the downward API (kubeflow/pipelines
``backend/src/v2/compiler/argocompiler/container.go``); any pod has its namespace in the mounted
ServiceAccount token folder. Outside a pod (``trainflow run`` on a laptop) there is no own Pod, and
the namespace comes from the kubeconfig context.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: The container KFP runs a component's code in (the others are KFP's own).
KFP_MAIN_CONTAINER = "main"


@dataclass(frozen=True)
class PodIdentity:
    """The launcher's own Pod."""

    namespace: str
    name: str
    uid: str
    image: str = ""
    ip: str = ""
    """The Pod's IP (``status.podIP``), the address other pods reach this process at; empty if unknown."""
    image_pull_secrets: tuple[str, ...] = ()
    """Names of the Pod's ``imagePullSecrets`` (its own and, merged in at admission, its
    ServiceAccount's): what pulled ``image``; empty if unknown."""
    image_digest: str = ""
    """``sha256:<hex>``: the registry digest the container runtime pulled ``image`` at (from the
    container status' ``imageID``, ``<repository>@sha256:<hex>``); empty if unknown or the image has
    none (built or imported on the node)."""

    def pinned_image(self) -> str:
        """``image`` by digest (``<repository>@sha256:<hex>``) when its digest is known, else ``image``:
        pods started later from a tag may get another image, if the tag was pushed again meanwhile."""
        if not self.image or not self.image_digest or "@" in self.image:
            return self.image
        return f"{image_repository(self.image)}@{self.image_digest}"

    def owner_reference(self) -> dict[str, Any]:
        """An ownerReference to this Pod: what it owns is garbage-collected when the Pod is deleted.

        Not ``controller`` (the training operator controls the job's pods, nobody controls the job)
        and not ``blockOwnerDeletion`` (that needs update rights on the Pod's finalizers).
        """
        return {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}


def image_repository(image: str) -> str:
    """``image`` without its tag or digest: ``reg:5000/team/app:1.2`` -> ``reg:5000/team/app``."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def _digest_of(image_id: str) -> str:
    """The ``sha256:<hex>`` of a container status' ``imageID`` that names a registry digest
    (``docker.io/team/app@sha256:<hex>``, Docker's ``docker-pullable://…@sha256:<hex>``), else ``""``
    (a bare ``sha256:<hex>`` is the image's local id, not pullable)."""
    digest = image_id.rpartition("@")[2] if "@" in image_id else ""
    algorithm, _, hexdigits = digest.partition(":")
    ok = algorithm == "sha256" and len(hexdigits) == 64 and all(c in "0123456789abcdef" for c in hexdigits)
    return digest if ok else ""


def own_namespace(sa_namespace_file: Path = SA_NAMESPACE_FILE) -> str | None:
    """The namespace of the pod this process runs in, or ``None`` outside a pod."""
    try:
        value = sa_namespace_file.read_text().strip()
    except OSError:
        return None
    return value or None


def own_pod(client: Any | None = None, *, environ: dict[str, str] | None = None,
            sa_namespace_file: Path = SA_NAMESPACE_FILE) -> PodIdentity | None:
    """This process's Pod, or ``None`` when not in a pod (or its uid cannot be learned).

    Name and uid from ``KFP_POD_NAME``/``KFP_POD_UID`` (or ``POD_NAME``/``POD_UID``); the name
    falls back to the hostname, and a missing uid, the image, its digest and its pull secrets are read
    with ``GET pod`` through ``client`` if given (best effort: RBAC may refuse it). The IP is the Pod's ``status.podIP``, or,
    when it cannot be read, what the pod's host name resolves to (the kubelet's ``/etc/hosts`` maps
    it to the pod IP), unless that is a loopback address.
    """
    env = os.environ if environ is None else environ
    namespace = own_namespace(sa_namespace_file)
    if namespace is None:
        return None
    name = env.get("KFP_POD_NAME") or env.get("POD_NAME") or env.get("HOSTNAME") or socket.gethostname()
    uid = env.get("KFP_POD_UID") or env.get("POD_UID") or ""
    image = ip = digest = ""
    pull_secrets: tuple[str, ...] = ()
    if client is not None:
        from lightkube.resources.core_v1 import Pod

        try:
            pod = client.get(Pod, name, namespace=namespace)
        except Exception:  # RBAC or a transient error: go on with what the environment said
            pod = None
        if pod is not None:
            uid = uid or pod.metadata.uid
            containers = pod.spec.containers if pod.spec else []
            main = [c for c in containers if c.name == KFP_MAIN_CONTAINER] or containers[:1]
            image = main[0].image if main else ""
            statuses = (pod.status.containerStatuses if pod.status else None) or []
            digest = next((_digest_of(c.imageID or "") for c in statuses if main and c.name == main[0].name), "")
            ip = (pod.status.podIP if pod.status else None) or ""
            refs = (pod.spec.imagePullSecrets if pod.spec else None) or []
            pull_secrets = tuple(r.name for r in refs if r.name)
    if not uid:
        return None
    return PodIdentity(namespace=namespace, name=name, uid=uid, image=image or "", ip=ip or _resolved_own_ip(),
                       image_pull_secrets=pull_secrets, image_digest=digest)


def _resolved_own_ip() -> str:
    """This host name's address, or ``""`` if it does not resolve or is a loopback address."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""
    return "" if ipaddress.ip_address(address).is_loopback else address
