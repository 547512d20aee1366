"""Small, deterministic policies for the controller's tests (registered on import).

They follow the Policy contract (pure, total, validated) but are chosen so a test knows exactly
what the controller must do: ``test-grow`` runs every job at its maximum where GPUs allow,
``test-shrink`` at its minimum, ``test-keep`` changes nothing. Usable live with
``python -m gpu_scheduler run --plugin tests.gpu_scheduler.policies_for_tests``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpu_scheduler.model import ClusterSnapshot, Decision, Placement
from gpu_scheduler.policies import FreeGpus, register


def _ledger(snapshot: ClusterSnapshot) -> FreeGpus:
    free = FreeGpus(snapshot)
    for job in snapshot.jobs:
        free.hold(job.placement, job.gpus_per_worker)
    return free


def _sized(snapshot: ClusterSnapshot, want: dict[str, int], name: str, now_s: float) -> Decision:
    """Each job as close to ``want[job]`` workers as the free GPUs allow (never below min when it runs)."""
    free = _ledger(snapshot)
    placements: dict[str, Placement] = {}
    for job in snapshot.jobs:
        target = want[job.name]
        current = job.placement
        if current.workers > target:
            new = FreeGpus.shrink(current, target)
            free.release(current, job.gpus_per_worker)
            free.hold(new, job.gpus_per_worker)
            placements[job.name] = new
            continue
        if current:
            placements[job.name] = current
            for extra in range(target - current.workers, 0, -1):
                grown = free.grow(current, extra, job.gpus_per_worker)  # ``current`` stays held; all or nothing
                if grown is not None:
                    placements[job.name] = grown
                    break
            continue
        for workers in range(target, job.min_workers - 1, -1):
            placed = free.place(workers, job.gpus_per_worker)
            if placed is not None:
                placements[job.name] = placed
                break
    return Decision.from_placements(snapshot, placements, policy=name, now_s=now_s,
                                    reasons={j.name: f"{name} wants {want[j.name]}" for j in snapshot.jobs})


@register("test-grow")
@dataclass(frozen=True)
class GrowPolicy:
    """Test policy: every job at max_workers where GPUs allow."""

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        return _sized(snapshot, {j.name: j.max_workers for j in snapshot.jobs}, self.name, now_s)  # type: ignore[attr-defined]


@register("test-shrink")
@dataclass(frozen=True)
class ShrinkPolicy:
    """Test policy: every job at min_workers."""

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        return _sized(snapshot, {j.name: j.min_workers for j in snapshot.jobs}, self.name, now_s)  # type: ignore[attr-defined]


@register("test-admit")
@dataclass(frozen=True)
class AdmitPolicy:
    """Test policy: running jobs keep their size; a job without workers gets up to its maximum
    where GPUs allow (a new job starts as submitted, even when the controller sees it before the
    kube-scheduler has bound its pods)."""

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        want = {j.name: j.placement.workers or j.max_workers for j in snapshot.jobs}
        return _sized(snapshot, want, self.name, now_s)  # type: ignore[attr-defined]


@register("test-keep")
@dataclass(frozen=True)
class KeepPolicy:
    """Test policy: every job keeps its placement (queued jobs wait)."""

    note: str = ""

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        return Decision.from_placements(snapshot, {j.name: j.placement for j in snapshot.jobs if j.placement},
                                        policy=self.name, now_s=now_s)  # type: ignore[attr-defined]


@register("test-broken")
@dataclass(frozen=True)
class BrokenPolicy:
    """Test policy: raises, as a buggy policy might."""

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        raise ValueError("broken on purpose")


@register("test-oracle")
@dataclass(frozen=True)
class OraclePolicy:
    """Test policy: claims to need perfect knowledge (simulator only)."""

    uses_oracle = True

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        return Decision.from_placements(snapshot, {}, policy=self.name, now_s=now_s)  # type: ignore[attr-defined]


@register("test-crash")
@dataclass(frozen=True)
class CrashPolicy:
    """Test policy: raises the named built-in exception (any kind a buggy policy might raise)."""

    error: str = "ZeroDivisionError"

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        import builtins

        raise getattr(builtins, self.error)(f"{self.error} on purpose")
