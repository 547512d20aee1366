"""First-in-first-out baselines from the seed study (Schedulearn): FIFO, FIFO with backfill and
Elastic FIFO.

* ``fifo`` — rigid jobs (``requested_workers``) start strictly in submission order and run to
  completion; the first job that does not fit blocks every later one (head-of-line blocking).
* ``fifo_backfill`` — the same, but a later job that fits starts while an earlier one waits
  (greedy backfill without reservations: no durations are known).
* ``elastic_fifo`` — every job, in submission order, first gets ``min_workers`` while GPUs last;
  the remaining GPUs then grow jobs in submission order up to their request (or up to
  ``max_workers`` with ``grow_to="max"``). A new job therefore starts within one round by
  shrinking the most recently grown jobs, and freed GPUs go to the oldest jobs.

None of them is preemptive except Elastic FIFO's shrinking. Placement: best-fit packing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_scheduler.model import ClusterSnapshot, Decision
from gpu_scheduler.policies._alloc import realize
from gpu_scheduler.policies.base import register
from gpu_scheduler.policies.placement import FreeGpus, Strategy


def _rigid_fifo(snapshot: ClusterSnapshot, now_s: float, name: str, strategy: str, backfill: bool) -> Decision:
    ledger = FreeGpus(snapshot, strategy)
    placements = {}
    reasons = {}
    for job in snapshot.jobs:
        if job.running:
            ledger.hold(job.placement, job.gpus_per_worker)
            placements[job.name] = job.placement
            reasons[job.name] = "runs to completion"
    blocked = False
    for job in snapshot.jobs:
        if job.running:
            continue
        if blocked:
            reasons[job.name] = "waits behind an earlier job"
            continue
        p = ledger.place(job.requested_workers, job.gpus_per_worker)
        if p is None:
            reasons[job.name] = f"waits for {job.requested_workers * job.gpus_per_worker} GPUs"
            blocked = not backfill
            continue
        placements[job.name] = p
        reasons[job.name] = "starts in submission order" if not backfill else "starts (backfill)"
    return Decision.from_placements(snapshot, placements, policy=name, now_s=now_s, reasons=reasons)


@register("fifo")
@dataclass(frozen=True, slots=True, kw_only=True)
class FifoPolicy:
    """Strict FIFO: rigid jobs in submission order, head-of-line blocking, no preemption.

    Attributes:
        placement: Packing strategy (``best_fit``, ``next_fit`` or ``most_free``).
    """

    placement: str = Strategy.BEST_FIT.value

    def __post_init__(self) -> None:
        Strategy.parse(self.placement)

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        return _rigid_fifo(snapshot, now_s, self.name, self.placement, backfill=False)


@register("fifo_backfill")
@dataclass(frozen=True, slots=True, kw_only=True)
class FifoBackfillPolicy:
    """FIFO with backfill: rigid jobs in submission order; later jobs that fit start early.

    Attributes:
        placement: Packing strategy.
    """

    placement: str = Strategy.BEST_FIT.value

    def __post_init__(self) -> None:
        Strategy.parse(self.placement)

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        return _rigid_fifo(snapshot, now_s, self.name, self.placement, backfill=True)


@register("elastic_fifo")
@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticFifoPolicy:
    """Elastic FIFO (Schedulearn): every job gets its minimum, spare GPUs grow the oldest jobs.

    Attributes:
        grow_to: ``"requested"`` (grow up to the user's request, the seed study's rule) or
            ``"max"`` (up to ``max_workers``).
        placement: Packing strategy.
    """

    grow_to: str = "requested"
    placement: str = Strategy.BEST_FIT.value

    def __post_init__(self) -> None:
        if self.grow_to not in ("requested", "max"):
            raise ValueError(f"grow_to must be 'requested' or 'max', got {self.grow_to!r}")
        Strategy.parse(self.placement)

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        budget = snapshot.budget_gpus  # once: a sum over the nodes
        free = budget
        targets: dict[str, int] = {}
        # a job whose minimum exceeds the whole cluster can never start: it waits without blocking
        # the queue behind it (it left every GPU idle, running jobs preempted, for good)
        never = {j.name for j in snapshot.jobs if j.min_workers * j.gpus_per_worker > budget}
        for job in snapshot.jobs:
            if job.name in never:
                continue
            need = job.min_workers * job.gpus_per_worker
            if need > free:
                break
            targets[job.name] = job.min_workers
            free -= need
        for job in snapshot.jobs:
            if job.name in never:
                continue
            if job.name not in targets:
                break
            cap = job.requested_workers if self.grow_to == "requested" else job.max_workers
            extra = min(cap - targets[job.name], free // job.gpus_per_worker)
            if extra > 0:
                targets[job.name] += extra
                free -= extra * job.gpus_per_worker
        placements = realize(snapshot, targets, snapshot.jobs, self.placement, partial=True)
        reasons = {name: f"{p.workers} workers in submission order" for name, p in placements.items()}
        return Decision.from_placements(snapshot, placements, policy=self.name, now_s=now_s, reasons=reasons)
