"""Hand the PyTorchJobs back before the controller is removed (``python -m gpu_scheduler release``).

A job the controller suspended (to queue or preempt it, or during a GPUs-per-worker change) is
resumed only by the controller (:attr:`gpu_scheduler.kube.JobMemo.suspended_by_scheduler`): once the
controller is uninstalled, such a job would stay suspended for good. :func:`release_jobs` resumes
every job the controller suspended and removes the controller's state annotations
(:attr:`~gpu_scheduler.kube.JobMemo.KEYS` under :data:`~gpu_scheduler.kube.ANNOTATION_PREFIX`, and
everything under :data:`~gpu_scheduler.kube.POLICY_ANNOTATION_PREFIX`), so a later install starts
from a clean slate. It leaves alone what users set: worker counts stay as they are, a job suspended
by someone else stays suspended. A GPUs-per-worker change still in progress is abandoned (the job
resumes with the template it has) and its ``gpus-per-worker`` request annotation, which the
controller consumed when it began, is put back, so a later install carries it out.

Run it after the controller's Deployment is scaled to 0 (a running controller would suspend
the jobs again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import Client
from lightkube.types import PatchType

from gpu_scheduler.actuate.apply import PyTorchJob
from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST
from gpu_scheduler.kube import ANNOTATION_PREFIX, FIELD_MANAGER, POLICY_ANNOTATION_PREFIX, JobMemo

__all__ = ["Released", "release_jobs"]

_STATE_ANNOTATIONS = frozenset(ANNOTATION_PREFIX + key for key in JobMemo.KEYS)


@dataclass(frozen=True, slots=True)
class Released:
    """One job :func:`release_jobs` changed: ``resumed`` if it was suspended by the controller;
    ``annotations_removed``: how many of the controller's annotations it dropped."""

    namespace: str
    name: str
    resumed: bool
    annotations_removed: int


def _ours(annotations: dict[str, str]) -> list[str]:
    return sorted(k for k in annotations if k in _STATE_ANNOTATIONS or k.startswith(POLICY_ANNOTATION_PREFIX))


def release_jobs(client: Client, namespaces: Sequence[str] | None = None, *, dry_run: bool = False) -> list[Released]:
    """Resume the jobs the controller suspended and drop its annotations from every PyTorchJob.

    Args:
        client: a lightkube client allowed to list and patch ``pytorchjobs``.
        namespaces: the namespaces to clean (None: all namespaces).
        dry_run: send the patches as server-side dry runs (validated, nothing stored).

    Returns:
        The jobs changed, in listing order (jobs with nothing of the controller's are skipped).

    Raises:
        lightkube.ApiError: listing or a patch failed (jobs patched before stay released; running
            the command again finishes the rest).
    """
    out: list[Released] = []
    for ns in namespaces if namespaces else ["*"]:
        for job in client.list(PyTorchJob, namespace=ns):
            meta: Any = job.metadata
            annotations = dict(meta.annotations or {})
            ours = _ours(annotations)
            if not ours:
                continue
            memo = JobMemo.parse(annotations)
            resume = memo.suspended_by_scheduler
            restored: dict[str, str | None] = dict.fromkeys(ours)
            if memo.reshape is not None and GPUS_PER_WORKER_REQUEST not in annotations:
                restored[GPUS_PER_WORKER_REQUEST] = str(memo.reshape[0])
            body: dict[str, Any] = {"metadata": {"annotations": restored}}
            if resume:
                body["spec"] = {"runPolicy": {"suspend": False}}
            client.patch(PyTorchJob, meta.name, body, namespace=meta.namespace, patch_type=PatchType.MERGE,
                         field_manager=FIELD_MANAGER, dry_run=dry_run)
            out.append(Released(meta.namespace, meta.name, resume, len(ours)))
    return out
