"""Helpers shared by policies: turning target worker counts into placements."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpu_scheduler.model import ClusterSnapshot, Job, Placement
from gpu_scheduler.policies.placement import FreeGpus, Strategy


def realize(
    snapshot: ClusterSnapshot,
    targets: Mapping[str, int],
    order: Iterable[Job],
    strategy: Strategy | str,
    *,
    partial: bool = False,
) -> dict[str, Placement]:
    """Placements for target worker counts, moving as few workers as possible.

    Running jobs keep their placement (trimmed from their smallest shares when the target is
    lower). Then, in ``order``, jobs whose target is higher grow onto their own nodes first and
    then onto new nodes, and jobs that hold nothing are placed by ``strategy``.

    Args:
        snapshot: The cluster.
        targets: Target workers by job name (missing or 0 = hold nothing).
        order: Jobs in the order they may claim free GPUs (priority order).
        strategy: Packing strategy for new workers.
        partial: If True, a job that cannot get its full target takes what fits (at least its
            ``min_workers``); if False it keeps its current placement (growth) or waits (start).

    Returns:
        Placement by job name, only for jobs that hold GPUs.
    """
    ledger = FreeGpus(snapshot, strategy)
    out: dict[str, Placement] = {}
    for job in snapshot.jobs:
        t = targets.get(job.name, 0)
        if job.running and t > 0:
            p = job.placement if t >= job.workers else FreeGpus.shrink(job.placement, t)
            ledger.hold(p, job.gpus_per_worker)
            out[job.name] = p
    for job in order:
        t = targets.get(job.name, 0)
        if t <= 0:
            continue
        gpw = job.gpus_per_worker
        cur = out.get(job.name)
        if cur is not None:
            extra = t - cur.workers
            if extra <= 0:
                continue
            if partial:
                extra = min(extra, ledger.workers_fit(gpw))
            grown = ledger.grow(cur, extra, gpw) if extra > 0 else None
            if grown is not None:
                out[job.name] = grown
            continue
        p = ledger.place(t, gpw)
        if p is None and partial:
            fit = min(t, ledger.workers_fit(gpw))
            if fit >= job.min_workers:
                p = ledger.place(fit, gpw)
        if p is not None and p:
            out[job.name] = p
    return out


def node_size(snapshot: ClusterSnapshot) -> int:
    """The most common per-node GPU capacity (the packing unit for multi-node jobs)."""
    counts: dict[int, int] = {}
    for n in snapshot.nodes:
        if n.gpus_for_jobs > 0:
            counts[n.gpus] = counts.get(n.gpus, 0) + 1
    return max(counts, key=lambda g: (counts[g], g)) if counts else 1
