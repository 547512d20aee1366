"""trainflow's default policy: elastic, throughput-aware, least-attained-service with hysteresis.

Inputs are only what the live controller observes: each job's worker bounds and request, its
placement, attained GPU-seconds, restarts, when its placement last changed, and the samples/s the
trainer reported at the worker counts it has run at. No job durations, no oracle.

One decision, in five steps:

1. **Speedup model per job** from measured throughput. Seconds per sample are modelled as
   ``T(n) = a/n + c·[n > 1] + d·(n − 1)`` (compute shared by ``n`` workers, a fixed
   synchronisation cost once distributed, and a cost growing with the number of workers — the
   shape of Pollux's throughput model, Qiao et al., OSDI'21 §3.2, without its batch-size terms
   because trainflow keeps the global batch fixed). ``a, c, d >= 0`` are fitted by non-negative
   least squares on the measured points, pulled weakly towards a prior of ``prior_efficiency``
   parallel efficiency at the requested size; speedup ``S(n) = T(1) / T(n)``. At worker counts
   the job has actually run at, the measured samples/s replace the model
   (``use_measured_throughput``): real curves have bumps the smooth model cannot have (gradient
   accumulation steps, node boundaries), and a job that has run at a width knows its speed there.
2. **Ideal widths.** Every job first gets ``min_workers`` (in priority order, while GPUs last);
   the remaining GPUs go one step at a time to the largest marginal gain of
   ``Σ w_j · U(S_j(n_j) / S_j(f))`` with ``U(x) = (x^(1−β) − 1)/(1 − β)`` — β = 2 is the harmonic
   mean of fair-share-normalised speedups that Pollux maximises (``f`` = the cluster's fair share
   per job), so no job is starved and GPUs flow to jobs that speed up. ``w_j =
   (1 + attained_j / service_base_gpu_s)^(−priority_exponent)`` favours jobs with little
   attained service (least-attained-service, Tiresias NSDI'19), so short jobs finish first
   without knowing durations (with ``remaining_replaces_attained``, only jobs that do not report
   their remaining work are weighted so; see 6). Widths step by one worker up to a node, then by
   whole nodes. A job never grows beyond ``max(requested, largest measured)`` here: the request
   is the user's tuned size and growing past it was measured to cost more (restarts,
   node-crossing slowdowns) than it gains. A trainer that adapts its batch reports predictions
   at 2× and 3× the widest width it has run at beside its measured rates, so such a job may grow
   to those (docs/scheduler.md, "Predicted widths").
3. **Hysteresis.** A running job keeps its width while in cooldown (``cooldown_s``, or
   ``cooldown_age_fraction`` of its running age if longer) or when the ideal width is within a
   factor ``1 + tolerance`` of it; if that over-commits the cluster, the lowest-priority kept jobs
   give back down to their ideal.
4. **Compact placement.** Jobs keep their placement when their width does not change; the rest
   are placed largest first on the fewest nodes (whole free nodes, then best fit); a job that
   does not fit compactly gets the widest width that does.
5. **Idle GPUs** go to jobs that speed up by at least ``grow_gain`` (``cooling_grow_gain`` for a job
   in cooldown), since every resize costs a restart. A job whose placement changes in this
   decision anyway pays that restart already, so it grows at ``grow_gain`` even in cooldown
   (``grow_when_moving``). Here a multi-node job may grow to ``idle_explore_factor`` × its
   request and a single-node job to the full nodes its request uses.

6. **Remaining work** (``use_remaining_work``, where the trainer reports ``remaining_samples``).
   The weight ``w_j`` is multiplied by ``(1 + min(left_j, 10 GPU-h) / 1 GPU-h)^(−0.5)``, ``left_j``
   the one-worker seconds of work left: among jobs of similar attained service, the one closer to
   its end goes first (shortest-remaining-processing-time, capped so that the long jobs still
   progress while the cluster is busy). With ``remaining_replaces_attained`` a job that reports
   its work left is weighted by this factor alone, not by its attained service as well:
   least-attained-service stands in for a remaining time nobody knows (Tiresias), and
   shortest-remaining-processing-time is what it stands in for. When only long jobs are left
   (every active job running, ≥ 40 GPU-h attained) the policy **drains**: it gives the jobs
   widths (any worker count) that minimise the expected finish of the last one — greedy min-max
   on ``left_j / S_j(n)`` — so they end together instead of the last one running alone on the
   whole cluster at poor efficiency, and changes placements only if that end comes ≥ 5 % earlier.

7. **heSRPT weights** (``hesrpt_speedup_exponent`` = p > 0; 0.7 in the class defaults, 0 = off).
   Instead of the factors of 2 and 6, a job that reports its work left is weighted by its *rank* by work
   left among such jobs: with ``m`` of them, ranked ``i = 1`` (most work left) to ``m`` (least),
   heSRPT gives job ``i`` the share ``θ_i = (i/m)^(1/(1−p)) − ((i−1)/m)^(1/(1−p))`` of the
   cluster, the allocation that minimises the total flow time of jobs with speedup ``k^p`` all
   present at once (Berg, Vesilo, Harchol-Balter, "heSRPT: Optimal Parallel Scheduling of Jobs
   With Known Sizes", arXiv:1903.09346, 2019). Maximising ``Σ w_j · k_j^p`` gives
   ``k_j ∝ w_j^(1/(1−p))``, so ``w_i = (m · θ_i)^(1−p)`` is that allocation written as a weight
   (1 for every job as p → 0; the least-work job's grows with ``m``). Only the order of the work
   left counts, not its size. Steps 2-5 then use ``w_j`` with the jobs' fitted speedups, the
   utility ``U`` and compact placement, so the result is a blend, not heSRPT itself
   (docs/scheduler.md, "heSRPT weights").

Parameters were chosen on the 8 Pollux workloads at 1.0x load (docs/scheduler.md records the
search); the same values are used at every load. The other loads' workloads (0.5x, 1.5x, 2.0x:
other jobs and arrivals) and jittered submit times check a choice.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Placement
from gpu_scheduler.policies._alloc import node_size
from gpu_scheduler.policies.base import register
from gpu_scheduler.policies.placement import FreeGpus

__all__ = ["FAST_RESTART_PARAMS", "DefaultPolicy", "JobSpeedup", "SpeedupModel", "fit_speedup", "job_speedup"]

#: Lighter hysteresis for clusters where a restart costs seconds, not tens of seconds: chosen on
#: the 8 Pollux workloads at 1.0x with 4.4 s restarts (a local trainflow restart, docs/scheduler.md,
#: "Pollux and Sia"); the report uses it below the artifact's 30 s, so with the resize measured on
#: the real node (9.9 s, ``MEASURED_RESTART_COST_S``) too. The class defaults stay tuned for 30 s.
#: Both weight a job that reports its work left by its heSRPT rank by that work (the class
#: default p = 0.7, step 7 of the module docstring); the preset adds fairness β = 1.5 and starts
#: the drain at 60 GPU-hours attained instead of 40 (chosen on 2026-11-28 at 9.9 s restarts,
#: replacing the work-left factor with exponent 0.75: lower mean JCT at every load with adaptive
#: jobs and at three of four with fixed batches; docs/scheduler.md, "heSRPT weights").
FAST_RESTART_PARAMS: Mapping[str, float | bool] = {
    "cooldown_s": 120.0, "cooldown_age_fraction": 0.05, "tolerance": 0.3, "cooling_grow_gain": 0.2,
    "grow_gain": 0.05, "fairness": 1.5, "drain_attained_gpu_s": 216_000.0,
}


@dataclass(frozen=True, slots=True)
class SpeedupModel:
    """``T(n) = a/n + c·[n>1] + d·(n−1)`` seconds per sample (any consistent unit)."""

    a: float
    c: float
    d: float

    def speedup(self, n: int) -> float:
        """Throughput at ``n`` workers relative to one worker (0 for n <= 0)."""
        if n <= 0:
            return 0.0
        if n == 1:
            return 1.0
        return self.a / (self.a / n + self.c + self.d * (n - 1))


def _nnls3(matrix: np.ndarray, rhs: np.ndarray) -> tuple[float, float, float]:
    """Non-negative least squares for three unknowns: the best of the least-squares solutions on
    every subset of free variables (the others fixed at 0) that stays non-negative."""
    best, best_err = (0.0, 0.0, 0.0), float(np.dot(rhs, rhs))
    for size in (1, 2, 3):
        for cols in itertools.combinations(range(3), size):
            sub = matrix[:, cols]
            x, *_ = np.linalg.lstsq(sub, rhs, rcond=None)
            if np.any(x < 0):
                continue
            err = float(np.sum((sub @ x - rhs) ** 2))
            if err < best_err - 1e-15:
                full = [0.0, 0.0, 0.0]
                for col, v in zip(cols, x, strict=True):
                    full[col] = float(v)
                best, best_err = (full[0], full[1], full[2]), err
    return best


@lru_cache(maxsize=65536)
def _fit(points: tuple[tuple[int, float], ...], requested: int, prior_efficiency: float) -> SpeedupModel:
    r = max(requested, 2)
    if not points:
        return SpeedupModel(1.0, (1.0 - prior_efficiency) / (prior_efficiency * r), 0.0)
    rows, rhs = [], []
    for n, tp in points:
        # Row scaled by the measured time so that every point weighs the same relative error.
        t = 1.0 / tp
        rows.append([1.0 / (n * t), (1.0 if n > 1 else 0.0) / t, (n - 1) / t])
        rhs.append(1.0)
    scale = float(np.mean([n / tp for n, tp in points]))  # ~ a
    weight = 0.05
    c_prior = scale * (1.0 - prior_efficiency) / (prior_efficiency * r)
    rows.append([0.0, weight / max(c_prior, 1e-12), 0.0])
    rhs.append(weight)
    rows.append([0.0, 0.0, weight * r / scale])
    rhs.append(0.0)
    a, c, d = _nnls3(np.array(rows), np.array(rhs))
    return SpeedupModel(a if a > 0 else scale, c, d)


def fit_speedup(job: Job, prior_efficiency: float = 0.7) -> SpeedupModel:
    """Speedup model of ``job`` from its measured throughput (see the module docstring).

    With no measurement the prior alone is used: ``prior_efficiency`` parallel efficiency at the
    requested size. Results are memoised on the measurements.
    """
    points = tuple(sorted((n, tp) for n, tp in job.throughput.items() if tp > 0))
    return _fit(points, job.requested_workers, prior_efficiency)


@dataclass(frozen=True, slots=True)
class JobSpeedup:
    """One job's speedup: measured where the job has run, the fitted model elsewhere.

    Attributes:
        model: The fitted :class:`SpeedupModel`.
        measured: Speedup by worker count at the counts with a measurement
            (``model.a × samples/s``: the model's one-worker time per sample over the measured one).
    """

    model: SpeedupModel
    measured: Mapping[int, float]

    def speedup(self, n: int) -> float:
        """Throughput at ``n`` workers relative to the model's one worker (0 for n <= 0)."""
        if n <= 0:
            return 0.0
        s = self.measured.get(n)
        return s if s is not None else self.model.speedup(n)


@lru_cache(maxsize=65536)
def _job_speedup(points: tuple[tuple[int, float], ...], requested: int, prior_efficiency: float) -> JobSpeedup:
    model = _fit(points, requested, prior_efficiency)
    return JobSpeedup(model, {n: model.a * tp for n, tp in points})


def job_speedup(job: Job, prior_efficiency: float = 0.7) -> JobSpeedup:
    """:func:`fit_speedup`'s model with the job's measured samples/s substituted at measured counts.

    Memoised on the measurements.
    """
    points = tuple(sorted((n, tp) for n, tp in job.throughput.items() if tp > 0))
    return _job_speedup(points, job.requested_workers, prior_efficiency)


@dataclass(frozen=True, slots=True)
class _JobTerms:
    """One job's terms of the decision that change only with its measurements and bounds (the
    inputs they were derived from first, to check a reuse)."""

    throughput: Mapping[int, float]
    requested_workers: int
    max_workers: int
    gpus_per_worker: int
    model: JobSpeedup | SpeedupModel
    per_node: int
    fair_term: float  # S(min(fair share, max_workers)) ** (β − 1)
    cap: int
    fill_cap: int
    one_worker_s: float | None  # the model's one-worker seconds per sample; None before any measurement
    # (n, k) -> (U(S(k)) − U(S(n)), GPUs from n to k workers): a step's marginal gain is its weight
    # times the first over the second (filled as the decisions need them).
    gains: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)


@register("default")
@dataclass(frozen=True, slots=True, kw_only=True)
class DefaultPolicy:
    """trainflow default: elastic least-attained-service with measured speedup, restart cost and hysteresis.

    Attributes:
        service_base_gpu_s: Attained service (GPU-seconds) at which a job's priority weight has
            dropped by ``2^priority_exponent``.
        priority_exponent: Steepness of the least-attained-service weight (0 = no priority).
        fairness: β of the utility ``U`` (1 = proportional fairness, 2 = Pollux's harmonic mean).
        prior_efficiency: Assumed parallel efficiency at the requested size before any measurement.
        tolerance: A running job's width changes only if the ideal differs by more than this factor.
        cooldown_s: Minimum seconds between two changes of one job.
        cooldown_age_fraction: Cooldown is at least this fraction of the job's running age.
        grow_gain: Minimum relative speedup for growing a running job onto idle GPUs.
        cooling_grow_gain: Same, for a job in cooldown.
        idle_explore_factor: Multi-node jobs may grow up to this multiple of their request onto
            otherwise idle GPUs.
        use_measured_throughput: Use measured samples/s instead of the model at worker counts
            the job has run at.
        grow_when_moving: A job whose placement changes in this decision may take idle GPUs at
            ``grow_gain`` even during its cooldown (it restarts anyway).
        use_remaining_work: Use ``Job.remaining_samples`` where reported (trainflow's trainer:
            steps left × global batch): the remaining-work priority factor and the balanced drain.
            Jobs without it (None) are treated exactly as with False.
        remaining_exponent: Steepness of the remaining-work factor ``(1 + min(left, cap) /
            remaining_base_gpu_s)^(−remaining_exponent)`` on a job's weight; ``left`` = one-worker
            seconds of work left (remaining samples × the fitted one-worker seconds per sample).
            This and the next three apply only with ``hesrpt_speedup_exponent=0``.
        remaining_base_gpu_s: Work left (one-worker seconds) at which that factor is 2^−exponent.
        remaining_cap_gpu_s: Work left beyond this counts as this much (long jobs are not pushed
            further back than a 10-hour job, so their work is not all left for the end).
        remaining_replaces_attained: A job that reports its work left is weighted by the
            remaining-work factor alone (shortest remaining processing time); the
            least-attained-service factor then weights only the jobs that do not report it.
        drain_attained_gpu_s: The drain starts when every active job is running, reports its
            remaining work and has attained at least this much service (no short job is left).
        drain_gain: In the drain, the placements change only if the expected end of the last job
            comes at least this fraction earlier.
        drain_any_width: Drain widths step by one worker (else as in step 2: whole nodes past one).
        cap_at_request: Step 2 never grows a job past ``max(requested, largest measured)``
            workers. False lets it grow to ``max_workers`` — meant for jobs that adapt their
            batch size to the allocation (the simulator's ``adaptive_batch`` experiment), whose
            measured speedup keeps rising past the request; measured worse for fixed-batch jobs.
        hesrpt_speedup_exponent: p of heSRPT's speedup ``k^p`` (0 ≤ p < 1; 0 = off): a job that
            reports its work left is weighted by its rank by work left (step 7) instead of by
            the remaining-work and attained-service factors. 0.7 since 2026-11-28: at 30 s
            restarts, lower mean JCT than p = 0 at 7 of 8 loads and job models and 6-17 % fewer
            restarts, for 0.05-0.8 % more makespan (docs/scheduler.md, "heSRPT in the class
            defaults").
    """

    service_base_gpu_s: float = 3600.0
    priority_exponent: float = 0.5
    fairness: float = 2.0
    prior_efficiency: float = 0.7
    tolerance: float = 1.0
    cooldown_s: float = 1200.0
    cooldown_age_fraction: float = 0.1
    grow_gain: float = 0.1
    cooling_grow_gain: float = 0.6
    idle_explore_factor: float = 2.0
    use_measured_throughput: bool = True
    grow_when_moving: bool = True
    use_remaining_work: bool = True
    remaining_exponent: float = 0.5
    remaining_base_gpu_s: float = 3600.0
    remaining_cap_gpu_s: float = 36000.0
    remaining_replaces_attained: bool = False
    drain_attained_gpu_s: float = 144000.0
    drain_gain: float = 0.05
    drain_any_width: bool = True
    cap_at_request: bool = True
    hesrpt_speedup_exponent: float = 0.7
    # What the last decision derived per job (:meth:`_terms`); not a parameter.
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for field_name in ("service_base_gpu_s", "prior_efficiency", "remaining_base_gpu_s", "remaining_cap_gpu_s"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{field_name} must be > 0")
        if not 0 < self.prior_efficiency <= 1:
            raise ValueError("prior_efficiency must be in (0, 1]")
        for field_name in ("priority_exponent", "fairness", "tolerance", "cooldown_s", "cooldown_age_fraction",
                           "grow_gain", "cooling_grow_gain", "remaining_exponent", "drain_attained_gpu_s",
                           "drain_gain"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"{field_name} must be >= 0")
        if not 0 <= self.hesrpt_speedup_exponent < 1:
            raise ValueError("hesrpt_speedup_exponent must be in [0, 1)")
        if self.idle_explore_factor < 1:
            raise ValueError("idle_explore_factor must be >= 1")

    # ------------------------------------------------------------------ pieces

    def priority(self, job: Job) -> float:
        """Least-attained-service weight in (0, 1]."""
        return (1.0 + job.attained_service_gpu_s / self.service_base_gpu_s) ** (-self.priority_exponent)

    def utility(self, x: float) -> float:
        """``U(x) = (x^(1−β) − 1)/(1 − β)`` (``log x`` for β = 1)."""
        if x <= 0:
            return -1e18
        b = self.fairness
        if b == 1:
            return math.log(x)
        return (x ** (1.0 - b) - 1.0) / (1.0 - b)

    @staticmethod
    def next_width(n: int, per_node: int) -> int:
        """Next allowed width: +1 up to a node, then whole nodes."""
        return n + 1 if n < per_node else (n // per_node + 1) * per_node

    @staticmethod
    def prev_width(n: int, per_node: int) -> int:
        """Previous allowed width."""
        return n - 1 if n <= per_node else ((n - 1) // per_node) * per_node

    def _cooling(self, job: Job, now_s: float) -> bool:
        if not job.running or job.placement_since_s is None:
            return False
        age = now_s - (job.first_start_s if job.first_start_s is not None else job.placement_since_s)
        return now_s - job.placement_since_s < max(self.cooldown_s, self.cooldown_age_fraction * age)

    # ------------------------------------------------------------------ decide

    def _job_terms(self, j: Job, gpn: int, fair: int) -> _JobTerms:
        """What the decision derives from ``j`` without its attained service, work left or clock."""
        m = job_speedup(j, self.prior_efficiency) if self.use_measured_throughput else fit_speedup(
            j, self.prior_efficiency)
        per_node = max(gpn // j.gpus_per_worker, 1)
        measured_max = max(j.throughput, default=0)
        cap = (min(j.max_workers, max(j.requested_workers, measured_max)) if self.cap_at_request
               else j.max_workers)
        nodes_of_request = -(-j.requested_workers // per_node) * per_node
        if j.requested_workers > per_node:
            explore = int(max(measured_max, j.requested_workers) * self.idle_explore_factor)
            fill_cap = min(j.max_workers, max(cap, nodes_of_request, explore))
        else:
            fill_cap = min(j.max_workers, max(cap, nodes_of_request))
        return _JobTerms(
            throughput=j.throughput, requested_workers=j.requested_workers, max_workers=j.max_workers,
            gpus_per_worker=j.gpus_per_worker, model=m, per_node=per_node,
            # Fair-share normalisation: U(S/S_f) ranks like S_f^(β−1) · U(S).
            fair_term=m.speedup(min(fair, j.max_workers)) ** (self.fairness - 1.0),
            cap=cap, fill_cap=fill_cap,
            one_worker_s=(m.model.a if isinstance(m, JobSpeedup) else m.a) if j.throughput else None,
        )

    def _terms(self, jobs: tuple[Job, ...], gpn: int, fair: int) -> dict[str, _JobTerms]:
        """:meth:`_job_terms` of every job, reused from the previous decision for a job whose
        measurements (the same mapping object: a job's mappings are read-only) and bounds are the
        same, at the same node size and fair share."""
        at, previous = self._memo.get("last", (None, None))  # one tuple: a concurrent call sees a consistent pair
        if at != (gpn, fair):
            previous = None
        terms: dict[str, _JobTerms] = {}
        for j in jobs:
            t = previous.get(j.name) if previous else None
            if t is None or t.throughput is not j.throughput or t.requested_workers != j.requested_workers \
                    or t.max_workers != j.max_workers or t.gpus_per_worker != j.gpus_per_worker:
                t = self._job_terms(j, gpn, fair)
            terms[j.name] = t
        self._memo["last"] = ((gpn, fair), terms)
        return terms

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        jobs = snapshot.jobs
        total = snapshot.budget_gpus
        gpn = node_size(snapshot)
        fair = max(1, math.ceil(total / max(len(jobs), 1)))
        index = {j.name: i for i, j in enumerate(jobs)}
        terms = self._terms(jobs, gpn, fair)
        model, weight, cap, fill_cap, per_node = {}, {}, {}, {}, {}
        cooling: set[str] = set()
        base, exponent = self.service_base_gpu_s, -self.priority_exponent
        use_left = self.use_remaining_work
        hesrpt = self.hesrpt_speedup_exponent > 0
        left_of: dict[str, float] = {}  # one-worker seconds of work left, of jobs that report it (heSRPT)
        for j in jobs:
            name, t = j.name, terms[j.name]
            model[name], per_node[name], cap[name], fill_cap[name] = t.model, t.per_node, t.cap, t.fill_cap
            if j.placement and j.placement_since_s is not None and self._cooling(j, now_s):
                cooling.add(name)
            w = t.fair_term
            knows_left = use_left and j.remaining_samples is not None and t.one_worker_s is not None
            left = j.remaining_samples * t.one_worker_s if knows_left else 0.0  # one-worker seconds
            if knows_left and hesrpt:
                left_of[name] = left  # w × its rank weight, below
            else:
                if knows_left:
                    w *= (1.0 + min(left, self.remaining_cap_gpu_s) / self.remaining_base_gpu_s) ** (
                        -self.remaining_exponent)
                if not (knows_left and self.remaining_replaces_attained):
                    w *= (1.0 + j.attained_service_gpu_s / base) ** exponent  # priority(j)
            weight[name] = w
        if left_of:
            self._rank_weights(left_of, weight)

        def value(j: Job, n: int, k: int) -> float:
            gains = terms[j.name].gains
            gain = gains.get((n, k))
            if gain is None:
                m = model[j.name]
                gain = gains[n, k] = (self.utility(m.speedup(k)) - self.utility(m.speedup(n)),
                                      (k - n) * j.gpus_per_worker)
            return weight[j.name] * gain[0] / gain[1]

        order = sorted(jobs, key=lambda j: (-weight[j.name], j.submit_time_s))
        ideal = self._ideal(jobs, order, total, cap, per_node, index, value)
        targets = self._with_hysteresis(jobs, ideal, cooling, weight, total)
        out, ledger = self._place(snapshot, jobs, targets, cooling, weight, per_node, gpn)
        self._fill_idle(ledger, jobs, order, out, cooling, fill_cap, per_node, gpn, index, value, model)
        if self._draining(jobs, total):
            drain = self._drain(snapshot, jobs, model, fill_cap, per_node, gpn, weight)
            if drain is None:
                drain = {j.name: j.placement for j in jobs}
                reasons = {j.name: "keeps its width (drain)" for j in jobs}
            else:
                reasons = {j.name: f"{drain[j.name].workers} workers: balanced drain (all finish together)"
                           for j in jobs}
            if drain is not None:
                return Decision.from_placements(snapshot, drain, policy=self.name, now_s=now_s, reasons=reasons)
        reasons = {j.name: self._reason(j, out.get(j.name), ideal[j.name], j.name in cooling) for j in jobs}
        return Decision.from_placements(snapshot, out, policy=self.name, now_s=now_s, reasons=reasons)

    def _rank_weights(self, left_of: Mapping[str, float], weight: dict[str, float]) -> None:
        """Multiply ``weight`` of each job in ``left_of`` (one-worker seconds of work left) by its
        heSRPT rank weight (step 7). Jobs with equal work left keep the snapshot's order."""
        p = self.hesrpt_speedup_exponent
        q, m = 1.0 / (1.0 - p), len(left_of)
        ranked = sorted(left_of, key=left_of.__getitem__, reverse=True)  # i = 1: the most work left
        prev = 0.0
        for i, name in enumerate(ranked, start=1):
            cum = (i / m) ** q
            weight[name] *= (m * (cum - prev)) ** (1.0 - p)
            prev = cum

    def _draining(self, jobs, total) -> bool:
        if not self.use_remaining_work or not jobs:
            return False
        need = 0
        for j in jobs:
            if j.remaining_samples is None or not j.running or j.workers not in j.throughput:
                return False
            if j.attained_service_gpu_s < self.drain_attained_gpu_s:
                return False
            need += j.min_workers * j.gpus_per_worker
        return need <= total

    def _drain(self, snapshot, jobs, model, fill_cap, per_node, gpn, weight) -> dict[str, Placement] | None:
        """Balanced drain: widths that minimise the latest expected finish of the active jobs.

        Returns the new placements, or None to keep every job where it is (the plan does not
        shorten the drain by the fraction ``drain_gain``).
        """

        def left_s(j: Job, n: int) -> float:
            # Measured speedups are model.a × samples/s, so samples/s at n = S(n) / a.
            m = model[j.name]
            a = m.model.a if isinstance(m, JobSpeedup) else m.a
            s = m.speedup(n)
            return j.remaining_samples * a / s if s > 0 else math.inf

        cap = {j.name: fill_cap[j.name] for j in jobs}
        keep = {j.name for j in jobs}

        out: dict[str, Placement] = {}
        for _ in range(3):
            widths = self._drain_widths(jobs, cap, snapshot.budget_gpus, per_node, left_s)
            out, _ledger = self._place(snapshot, jobs, widths, keep, weight, per_node, gpn)
            short = {j.name: out[j.name].workers if j.name in out else 0 for j in jobs
                     if (out[j.name].workers if j.name in out else 0) < widths[j.name]}
            if not short:
                break
            cap.update(short)  # not placeable compactly: plan again without that width
        cur_end = max(left_s(j, j.workers) for j in jobs)
        new_end = max(left_s(j, out[j.name].workers if j.name in out else 0) for j in jobs)
        if new_end >= cur_end * (1.0 - self.drain_gain):
            return None
        return out

    def _drain_widths(self, jobs, cap, total, per_node, left_s) -> dict[str, int]:
        """Greedy min-max: repeatedly widen the job expected to finish last (to the next width
        that makes it faster), while GPUs last."""
        widths = {j.name: j.min_workers for j in jobs}
        free = total - sum(j.min_workers * j.gpus_per_worker for j in jobs)
        heap = [(-left_s(j, widths[j.name]), i) for i, j in enumerate(jobs)]
        heapq.heapify(heap)
        while heap and free > 0:
            negt, i = heapq.heappop(heap)
            j = jobs[i]
            n = k = widths[j.name]
            while True:
                nxt = k + 1 if self.drain_any_width else self.next_width(k, per_node[j.name])
                k = min(nxt, cap[j.name])
                if k <= n or (k - n) * j.gpus_per_worker > free:
                    k = n
                    break
                if left_s(j, k) < -negt:
                    break
                if k >= cap[j.name]:
                    k = n
                    break
            if k == n:
                continue
            free -= (k - n) * j.gpus_per_worker
            widths[j.name] = k
            heapq.heappush(heap, (-left_s(j, k), i))
        return widths

    def _ideal(self, jobs, order, total, cap, per_node, index, value) -> dict[str, int]:
        ideal = {j.name: 0 for j in jobs}
        free = total
        heap: list[tuple[float, int, int]] = []
        for j in order:
            need = j.min_workers * j.gpus_per_worker
            if need > free:
                continue
            ideal[j.name] = j.min_workers
            free -= need
            k = min(self.next_width(j.min_workers, per_node[j.name]), cap[j.name])
            if k > j.min_workers:
                heap.append((-value(j, j.min_workers, k), index[j.name], k))
        heapq.heapify(heap)
        while heap and free > 0:
            negv, i, k = heapq.heappop(heap)
            if negv >= 0:
                break
            j = jobs[i]
            step = (k - ideal[j.name]) * j.gpus_per_worker
            if step > free:
                continue
            ideal[j.name] = k
            free -= step
            k2 = min(self.next_width(k, per_node[j.name]), cap[j.name])
            if k2 > k:
                heapq.heappush(heap, (-value(j, k, k2), i, k2))
        return ideal

    def _with_hysteresis(self, jobs, ideal, cooling, weight, total) -> dict[str, int]:
        targets = dict(ideal)
        for j in jobs:
            want = ideal[j.name]
            if not j.placement or want == 0:
                continue
            cur = j.placement.workers
            if not j.min_workers <= cur <= j.max_workers:
                continue  # bounds changed under it (a user lowered max_workers): never kept out of them
            if j.name in cooling or cur / (1 + self.tolerance) < want < cur * (1 + self.tolerance):
                targets[j.name] = cur
        used = sum(targets[j.name] * j.gpus_per_worker for j in jobs)
        if used <= total:
            return targets
        for j in sorted(jobs, key=lambda j: weight[j.name]):
            if used <= total:
                break
            if targets[j.name] > ideal[j.name]:
                used -= (targets[j.name] - ideal[j.name]) * j.gpus_per_worker
                targets[j.name] = ideal[j.name]
        return targets

    def _place(self, snapshot, jobs, targets, cooling, weight, per_node, gpn) -> tuple[dict[str, Placement], FreeGpus]:
        ledger = FreeGpus(snapshot)
        out: dict[str, Placement] = {}
        moving: list[Job] = []
        kept: list[tuple[Placement, int]] = []
        for j in jobs:
            t = targets[j.name]
            if t <= 0:
                continue
            p = j.placement
            if p and t == p.workers and (len(p.shares) <= -(-t // per_node[j.name]) or j.name in cooling):
                kept.append((p, j.gpus_per_worker))  # compact or cooling: it stays
                out[j.name] = p
            else:
                moving.append(j)
        ledger.hold_all(kept)
        moving.sort(key=lambda j: (-targets[j.name] * j.gpus_per_worker, -weight[j.name]))
        for j in moving:
            k = targets[j.name]
            while k >= j.min_workers:
                p = ledger.place_compact(k, j.gpus_per_worker, gpn)
                if p is not None:
                    out[j.name] = p
                    break
                k = self.prev_width(k, per_node[j.name])
        return out, ledger

    def _fill_idle(self, ledger: FreeGpus, jobs, order, out, cooling, fill_cap, per_node, gpn, index, value,
                   model) -> None:
        if ledger.total_free() <= 0:
            return
        base = {j.name: (out[j.name].workers if j.name in out else 0) for j in jobs}

        def first_step(j: Job, n: int) -> int:
            if n == 0:
                return j.min_workers
            gain = self.cooling_grow_gain if j.name in cooling else self.grow_gain
            if self.grow_when_moving and j.running and not out[j.name].same_nodes_as(j.placement):
                gain = self.grow_gain  # it restarts in this decision anyway
            k = n
            while k < fill_cap[j.name]:
                k = min(self.next_width(k, per_node[j.name]), fill_cap[j.name])
                if model[j.name].speedup(k) >= model[j.name].speedup(n) * (1 + gain):
                    return k
            return n

        heap = []
        for j in order:
            n = base[j.name]
            k = first_step(j, n)
            if k > n:
                heap.append((-value(j, n, k) if n else -1e18, index[j.name], k))
        heapq.heapify(heap)
        while heap and ledger.total_free() > 0:
            negv, i, k = heapq.heappop(heap)
            if negv >= 0:
                break
            j = jobs[i]
            gpw = j.gpus_per_worker
            cur = out.get(j.name, Placement())
            grown = None
            if cur:
                ledger.release(cur, gpw)
                if cur.node_count == 1 and k <= per_node[j.name] and ledger.free_on(cur.nodes[0]) >= k * gpw:
                    ledger.hold(cur, gpw)
                    grown = ledger.grow(cur, k - cur.workers, gpw)
                else:
                    grown = ledger.place_compact(k, gpw, gpn)
                    if grown is None:
                        ledger.hold(cur, gpw)
            else:
                grown = ledger.place_compact(k, gpw, gpn)
            if grown is None:
                continue
            out[j.name] = grown
            k2 = min(self.next_width(k, per_node[j.name]), fill_cap[j.name])
            if k2 > k:
                heapq.heappush(heap, (-value(j, k, k2), i, k2))

    @staticmethod
    def _reason(job: Job, placement: Placement | None, ideal: int, cooling: bool) -> str:
        n = placement.workers if placement else 0
        if n == 0:
            return "waits: no GPU left at its priority"
        if job.running and n == job.workers:
            return "keeps its width (cooldown)" if cooling and ideal != n else "keeps its width"
        return f"{n} workers (ideal {ideal}) by marginal speedup at its priority"
