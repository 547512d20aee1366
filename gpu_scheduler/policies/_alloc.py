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


def realize_compact(
    snapshot: ClusterSnapshot,
    targets: Mapping[str, int],
    priority: Mapping[str, float],
    strategy: Strategy | str = Strategy.BEST_FIT,
) -> dict[str, Placement]:
    """Placements for target worker counts that keep every job on as few nodes as possible.

    Jobs whose worker count does not change keep their placement. A job that shrinks is trimmed
    in place when that still leaves it on the fewest nodes its size needs, and placed afresh
    otherwise; a job that grows first tries its own nodes and is placed afresh when that would
    spread it. Fresh placements go largest job first (classic decreasing-size bin packing),
    ties by ``priority`` (higher first). A job whose target does not fit any more gets what fits
    (at least ``min_workers``) or waits.
    """
    ledger = FreeGpus(snapshot, strategy)
    gpn = node_size(snapshot)
    out: dict[str, Placement] = {}
    pending: list[Job] = []

    def min_nodes(workers: int, gpw: int) -> int:
        return -(-workers * gpw // max(gpn, 1))

    for job in snapshot.jobs:
        t = targets.get(job.name, 0)
        if t <= 0:
            continue
        if job.running and t == job.workers:
            ledger.hold(job.placement, job.gpus_per_worker)
            out[job.name] = job.placement
        elif job.running and t < job.workers:
            trimmed = FreeGpus.shrink(job.placement, t)
            if trimmed.node_count <= min_nodes(t, job.gpus_per_worker):
                ledger.hold(trimmed, job.gpus_per_worker)
                out[job.name] = trimmed
            else:
                pending.append(job)
        else:
            pending.append(job)
    # Growing jobs hold their current GPUs while the rest is placed, so they can extend in place.
    growing = {j.name for j in pending if j.running and targets[j.name] > j.workers}
    for job in pending:
        if job.name in growing:
            ledger.hold(job.placement, job.gpus_per_worker)
    pending.sort(key=lambda j: (-targets[j.name] * j.gpus_per_worker, -priority.get(j.name, 0.0)))
    for job in pending:
        t, gpw = targets[job.name], job.gpus_per_worker
        if job.name in growing:
            grown = ledger.grow(job.placement, t - job.workers, gpw)
            if grown is not None and grown.node_count <= min_nodes(t, gpw):
                out[job.name] = grown
                continue
            if grown is not None:
                ledger.release(grown, gpw)
            else:
                ledger.release(job.placement, gpw)
            fresh = ledger.place(t, gpw)
            if fresh is not None and fresh.node_count <= (grown.node_count if grown else fresh.node_count):
                out[job.name] = fresh
                continue
            if fresh is not None:
                ledger.release(fresh, gpw)
            if grown is not None:
                ledger.hold(grown, gpw)
                out[job.name] = grown
            else:  # cannot grow at all: keep what it has
                ledger.hold(job.placement, gpw)
                out[job.name] = job.placement
            continue
        p = ledger.place(t, gpw)
        if p is None:
            fit = min(t, ledger.workers_fit(gpw))
            p = ledger.place(fit, gpw) if fit >= job.min_workers else None
        if p:
            out[job.name] = p
    return out
