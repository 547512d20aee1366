"""Tiresias-style discretized 2D-LAS (Gu et al., NSDI'19, §3.2 and §4.1).

Jobs are rigid (they run at ``requested_workers`` or not at all) and preemptible. Priority comes
from *attained service* — GPUs × time already received (``Job.attained_service_gpu_s``) — so the
policy needs no knowledge of job durations: a job starts in queue 0 and is demoted to queue ``k``
once its attained service crosses ``queue_thresholds_gpu_s[k-1]``. Queues are served in order;
within a queue jobs are served first-come-first-served by the time they *entered* the queue
(submission for queue 0, demotion time for the others). Walking that order, each job whose
request still fits in the remaining GPU count runs (later, smaller jobs may pass a large one that
does not fit); running jobs that keep running are not moved; the rest are preempted.

Defaults follow the configuration that produced the published Tiresias+TunedJobs results on the
Pollux workloads (petuum/adaptdl@osdi21-artifact ``simulator/tiresias.py``): two queues, one
threshold of 16 GPU-hours, no starvation promotion, and new jobs placed on the node with the most
free GPUs (``most_free``).

State across rounds: the time a job entered its current queue is kept in the annotations
``las_queue`` and ``las_queue_since_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_scheduler.model import ClusterSnapshot, Decision, Job
from gpu_scheduler.policies._alloc import realize
from gpu_scheduler.policies.base import annotation_float, register
from gpu_scheduler.policies.placement import Strategy

QUEUE_KEY = "las_queue"
SINCE_KEY = "las_queue_since_s"


@register("tiresias")
@dataclass(frozen=True, slots=True, kw_only=True)
class TiresiasPolicy:
    """Tiresias discretized 2D-LAS: rigid, preemptive, multi-level queues by attained GPU-time.

    Attributes:
        queue_thresholds_gpu_s: Attained-service thresholds (GPU-seconds, ascending) between
            queues; ``(57600.0,)`` = two queues split at 16 GPU-hours.
        placement: Packing strategy for jobs that start (``most_free`` as in the artifact).
    """

    queue_thresholds_gpu_s: tuple[float, ...] = (16 * 3600.0,)
    placement: str = Strategy.MOST_FREE.value

    def __post_init__(self) -> None:
        if list(self.queue_thresholds_gpu_s) != sorted(self.queue_thresholds_gpu_s) or any(
                t <= 0 for t in self.queue_thresholds_gpu_s):
            raise ValueError("queue_thresholds_gpu_s must be positive and ascending")
        Strategy.parse(self.placement)

    def queue_of(self, job: Job) -> int:
        """Queue index from attained service (0 = highest priority)."""
        k = 0
        for threshold in self.queue_thresholds_gpu_s:
            if job.attained_service_gpu_s >= threshold:
                k += 1
        return k

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        annotations: dict[str, dict[str, str]] = {}
        keyed = []
        for index, job in enumerate(snapshot.jobs):
            queue = self.queue_of(job)
            since = job.annotations.get(SINCE_KEY)
            if str(queue) != job.annotations.get(QUEUE_KEY, "0"):
                since = repr(float(now_s))
                annotations[job.name] = {QUEUE_KEY: str(queue), SINCE_KEY: since}
            entered = annotation_float(since, job.submit_time_s) if queue else job.submit_time_s
            keyed.append(((queue, entered, index), job))
        order = [job for _, job in sorted(keyed, key=lambda kv: kv[0])]
        free = snapshot.budget_gpus
        targets: dict[str, int] = {}
        reasons: dict[str, str] = {}
        for job in order:
            need = job.requested_workers * job.gpus_per_worker
            queue = self.queue_of(job)
            if need <= free:
                free -= need
                targets[job.name] = job.requested_workers
                reasons[job.name] = f"queue {queue}: runs"
            else:
                reasons[job.name] = f"queue {queue}: waits for {need} GPUs"
        placements = realize(snapshot, targets, order, self.placement)
        return Decision.from_placements(snapshot, placements, policy=self.name, now_s=now_s,
                                        reasons=reasons, annotations=annotations)
