"""Optimus-style marginal-gain elastic allocation (Peng et al., EuroSys'18, §5.1).

Every job first gets one worker (``min_workers``), in submission order, while GPUs last. The
remaining GPUs go one worker at a time to the job whose *remaining time* drops the most from one
more worker::

    gain(j, n) = remaining_samples_j / throughput_j(n) - remaining_samples_j / throughput_j(n + 1)

until no GPU is left or no job gains. Jobs whose worker count is unchanged keep their placement;
the others are placed afresh, smallest first.

As "Optimus+Oracle" in the Pollux study (petuum/adaptdl@osdi21-artifact
``simulator/optimus.py``), the policy is given perfect knowledge — the true throughput at every
worker count and the true remaining work — so ``uses_oracle = True`` (simulator only). The
defaults (one worker minimum, most-free placement) follow that artifact.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Placement
from gpu_scheduler.policies.base import register
from gpu_scheduler.policies.placement import FreeGpus, Strategy


def _remaining_time_s(job: Job, workers: int) -> float:
    tp = job.throughput.get(workers)
    if not tp:
        return float("inf")
    return (job.remaining_samples or 0.0) / tp


@register("optimus")
@dataclass(frozen=True, slots=True, kw_only=True)
class OptimusPolicy:
    """Optimus+Oracle: greedy marginal reduction of remaining time, elastic workers (oracle).

    Attributes:
        placement: Packing strategy for resized jobs (``most_free`` as in the artifact).
    """

    uses_oracle = True
    placement: str = Strategy.MOST_FREE.value

    def __post_init__(self) -> None:
        Strategy.parse(self.placement)

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        free = snapshot.budget_gpus
        workers: dict[str, int] = {}
        heap: list[tuple[float, int, str]] = []
        jobs = {job.name: job for job in snapshot.jobs}
        index = {job.name: i for i, job in enumerate(snapshot.jobs)}

        def push(job: Job) -> None:
            n = workers[job.name]
            if n + 1 > job.max_workers or free < job.gpus_per_worker:
                return
            gain = _remaining_time_s(job, n) - _remaining_time_s(job, n + 1)
            if gain > 0:
                heapq.heappush(heap, (-gain, index[job.name], job.name))

        for job in snapshot.jobs:
            need = job.min_workers * job.gpus_per_worker
            if need <= free:
                workers[job.name] = job.min_workers
                free -= need
            else:
                workers[job.name] = 0
        for job in snapshot.jobs:
            if workers[job.name]:
                push(job)
        while free > 0 and heap:
            _, _, name = heapq.heappop(heap)
            job = jobs[name]
            if job.gpus_per_worker > free:
                continue
            workers[name] += 1
            free -= job.gpus_per_worker
            push(job)

        ledger = FreeGpus(snapshot, self.placement)
        placements: dict[str, Placement] = {}
        for job in snapshot.jobs:
            if job.running and job.workers == workers[job.name]:
                ledger.hold(job.placement, job.gpus_per_worker)
                placements[job.name] = job.placement
        resized = sorted((j for j in snapshot.jobs if workers[j.name] and j.name not in placements),
                         key=lambda j: (workers[j.name], index[j.name]))
        for job in resized:
            p = ledger.place(workers[job.name], job.gpus_per_worker)
            if p is not None:
                placements[job.name] = p
        reasons = {name: f"{n} workers by marginal gain" for name, n in workers.items() if n}
        return Decision.from_placements(snapshot, placements, policy=self.name, now_s=now_s, reasons=reasons)
