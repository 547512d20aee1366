"""Round Robin gang time-slicing (the seed study's Schedulearn "Round Robin").

Rigid jobs (``requested_workers``) take turns: a job that starts runs for at least one quantum
(``quantum_s``, 10 minutes by default); when its quantum has expired it goes to the back of the
queue and keeps running only while no waiting job needs its GPUs. Waiting jobs are served in the
order they started waiting (submission, or the time they were preempted — kept in the
``rr_waiting_since_s`` annotation). The queue is strict: a waiting job that does not fit stops
the jobs behind it (so large jobs are not starved by a stream of small ones); jobs whose quantum
has expired can still continue on GPUs nobody took. Every preemption and resume pays the restart
cost. Placement: best-fit packing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Placement
from gpu_scheduler.policies.base import annotation_float, register
from gpu_scheduler.policies.placement import FreeGpus, Strategy

WAITING_KEY = "rr_waiting_since_s"


@register("round_robin")
@dataclass(frozen=True, slots=True, kw_only=True)
class RoundRobinPolicy:
    """Round Robin: rigid gang time slices of ``quantum_s`` in a strict queue.

    Attributes:
        quantum_s: Minimum run time of a slice, in seconds.
        placement: Packing strategy.
    """

    quantum_s: float = 600.0
    placement: str = Strategy.BEST_FIT.value

    def __post_init__(self) -> None:
        if self.quantum_s <= 0:
            raise ValueError(f"quantum_s must be > 0, got {self.quantum_s}")
        Strategy.parse(self.placement)

    def _waiting_since(self, job: Job) -> float:
        return annotation_float(job.annotations.get(WAITING_KEY), job.submit_time_s)

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        ledger = FreeGpus(snapshot, self.placement)
        placements: dict[str, Placement] = {}
        reasons: dict[str, str] = {}
        annotations: dict[str, dict[str, str]] = {}
        expired: list[Job] = []
        waiting: list[tuple[float, int, Job]] = []
        for index, job in enumerate(snapshot.jobs):
            if job.running:
                since = job.placement_since_s if job.placement_since_s is not None else now_s
                if now_s - since < self.quantum_s:
                    ledger.hold(job.placement, job.gpus_per_worker)
                    placements[job.name] = job.placement
                    reasons[job.name] = "inside its quantum"
                else:
                    expired.append(job)
            else:
                waiting.append((self._waiting_since(job), index, job))
        for _, _, job in sorted(waiting, key=lambda t: t[:2]):
            p = ledger.place(job.requested_workers, job.gpus_per_worker)
            if p is None:
                reasons[job.name] = "waits for its turn"
                break
            placements[job.name] = p
            reasons[job.name] = "its turn"
            annotations[job.name] = {WAITING_KEY: ""}
        for job in sorted(expired, key=lambda j: (j.placement_since_s or 0.0)):
            if ledger.fits(job.placement, job.gpus_per_worker):
                ledger.hold(job.placement, job.gpus_per_worker)
                placements[job.name] = job.placement
                reasons[job.name] = "quantum expired, nobody waiting for its GPUs"
            else:
                reasons[job.name] = "quantum expired: back of the queue"
                annotations[job.name] = {WAITING_KEY: repr(float(now_s))}
        for _, _, job in waiting:
            reasons.setdefault(job.name, "waits for its turn")
        return Decision.from_placements(snapshot, placements, policy=self.name, now_s=now_s,
                                        reasons=reasons, annotations=annotations)
