"""Sia (Jayaram Subramanya et al., SOSP'23), homogeneous-cluster configuration: one ILP per round.

Our own re-implementation, read (not copied) from the artifact siasosp23/artifacts
``sia-simulator/sia.py`` (``SiaPolicy.optimize_mip``) with its defaults
(``simulator_config.py``: ``p = −0.5``, ``lambda_n = 1.1``, relative gap 1e-4, the Pollux
restart factor). On one GPU type Sia is the same goodput model as Pollux
(:mod:`gpu_scheduler.policies.goodput`, from the job's ``Job.goodput_model``) with a different
optimizer:

* **Configurations**: 1, 2, 4 … GPUs on one node (powers of two up to a node), then whole nodes
  (2 × node … ``max_nodes_per_job`` nodes) — the artifact's ``CONFIGS_4GPU`` / ``CONFIGS_8GPU``.
  A job may take a configuration with at most ``max(2 × most workers profiled, 1)`` workers (and
  its ``max_workers``), at least ``min_workers``.
* **Value** of configuration ``c`` for job ``i``: goodput there (batch size tuned, or the fixed
  batch) ÷ the job's smallest goodput over its valid configurations; a job without a goodput
  model (it has not run) is worth 1 on its smallest configuration only. Invalid configurations
  are worth 1e-4. A running job's values on every configuration but its current one are
  multiplied by the restart factor ``max(age − restarts × penalty, 0) / (age + penalty)`` (1 while
  ``age < penalty``); a job still inside its restart keeps its configuration.
* **ILP** (scipy's HiGHS ``milp``; the artifact calls cvxpy with CBC/GLPK): binary ``x[i, c]``,
  at most one configuration per job, GPUs used ≤ the cluster's GPUs; minimise
  ``Σ x[i, c] · round(value^p, 2) + lambda_n · (jobs − Σ x)`` (``p < 0``: every job prefers a
  larger value and pays ``lambda_n`` if it gets nothing; values^p clipped at 3000).
* **Placement**: jobs whose configuration is unchanged keep their nodes; the others are placed
  largest first, compactly (whole free nodes first). (The artifact's simulator re-packs every
  job each round, which can move — and restart — a job whose GPU count did not change; a live
  scheduler would not, so neither does this one.)

Pure and deterministic (HiGHS with a fixed configuration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Placement
from gpu_scheduler.policies._alloc import node_size
from gpu_scheduler.policies.base import register
from gpu_scheduler.policies.goodput import GoodputFunction
from gpu_scheduler.policies.placement import FreeGpus

__all__ = ["ZERO_ALLOC_GAIN", "SiaPolicy", "configurations"]

ZERO_ALLOC_GAIN = 1e-4
"""Value of a configuration a job cannot use (the artifact's ``ZERO_ALLOC_GAIN``)."""


def configurations(gpus_per_node: int, nodes: int, max_nodes: int) -> list[tuple[int, int]]:
    """Sia's allocation configurations ``(nodes, GPUs)`` on a homogeneous cluster: powers of two
    up to one node, then whole nodes up to ``min(nodes, max_nodes)``."""
    out, g = [], 1
    while g < gpus_per_node:
        out.append((1, g))
        g *= 2
    out.append((1, gpus_per_node))
    out.extend((k, k * gpus_per_node) for k in range(2, min(nodes, max_nodes) + 1))
    return out


@register("sia")
@dataclass(frozen=True, slots=True, kw_only=True)
class SiaPolicy:
    """Sia (SOSP'23), one GPU type: ILP over (job, configuration) with goodput values, p = −0.5.

    Attributes:
        fairness_p: Exponent on the normalised goodput (−0.5; the artifact's ``p``).
        lambda_n: Penalty for leaving a job without GPUs (1.1).
        restart_penalty_s: Seconds a restart costs in the restart factor, and how long a restart
            lasts (jobs inside it keep their configuration). The artifact uses per-application
            measurements (25–250 s); set it to the harness's restart cost.
        max_replicas_factor: A job may use this many times its most-profiled worker count (2).
        max_nodes_per_job: Largest configuration in nodes (16: the artifact's 64 GPUs of 4-GPU nodes).
        mip_rel_gap: Relative optimality gap of the ILP solver (1e-4, the artifact's threshold).
        value_clip: Largest ``value^p`` (3000).
    """

    uses_goodput_model = True
    fairness_p: float = -0.5
    lambda_n: float = 1.1
    restart_penalty_s: float = 30.0
    max_replicas_factor: int = 2
    max_nodes_per_job: int = 16
    mip_rel_gap: float = 1e-4
    value_clip: float = 3000.0

    def __post_init__(self) -> None:
        if self.fairness_p == 0:
            raise ValueError("fairness_p must not be 0")
        if self.restart_penalty_s < 0 or self.max_replicas_factor < 1 or self.max_nodes_per_job < 1:
            raise ValueError("restart_penalty_s must be >= 0, max_replicas_factor and max_nodes_per_job >= 1")
        if not 0 <= self.mip_rel_gap < 1 or self.value_clip <= 0:
            raise ValueError("mip_rel_gap must be in [0, 1) and value_clip > 0")

    # ------------------------------------------------------------------ values

    def _values(self, job: Job, configs: list[tuple[int, int]], now_s: float) -> tuple[np.ndarray, int | None, bool]:
        """Normalised, restart-penalised values of every configuration; the index of the job's
        current configuration (None if it holds none or an unlisted one); whether it must keep it."""
        m = job.goodput_model
        profiled = m.max_profiled_workers if m is not None else 0
        cap = max(min(max(self.max_replicas_factor * profiled, 1), job.max_workers), job.min_workers)
        nodes = np.array([c[0] for c in configs])
        gpus = np.array([c[1] for c in configs])
        replicas = gpus // job.gpus_per_worker
        valid = (gpus % job.gpus_per_worker == 0) & (replicas >= job.min_workers) & (replicas <= cap)
        values = np.full(len(configs), ZERO_ALLOC_GAIN)
        if m is None:
            first = np.flatnonzero(valid)
            if first.size:
                values[first[0]] = 1.0
        elif valid.any():
            gf = GoodputFunction(m.perf_params, m.grad_sqr, m.grad_var, m.init_batch_size)
            good, _, _ = gf.optimize(np.minimum(nodes[valid], replicas[valid]), replicas[valid], m.max_batch_size,
                                     (m.min_local_batch, m.max_local_batch), accumulation=True,
                                     fixed_batch=m.fixed_batch)
            good = np.asarray(good, dtype=float)
            positive = good[good > ZERO_ALLOC_GAIN]
            if positive.size:
                values[valid] = good / positive.min()
            else:
                values[np.flatnonzero(valid)[0]] = 1.0
        values[values <= ZERO_ALLOC_GAIN] = ZERO_ALLOC_GAIN
        current = None
        if job.running:
            key = (job.placement.node_count, job.gpus)
            current = next((i for i, c in enumerate(configs) if c == key), None)
            pen = self.restart_penalty_s
            age = max(now_s - job.submit_time_s, 0.0)
            factor = 1.0 if age < pen else max(age - job.restarts * pen, 0.0) / (age + pen)
            keep = values[current] if current is not None else None
            values = values * factor
            if current is not None:
                values[current] = keep
        underway = (job.running and current is not None and job.placement_since_s is not None
                    and now_s - job.placement_since_s < self.restart_penalty_s)
        return values, current, underway

    # ------------------------------------------------------------------ decide

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_array

        jobs = snapshot.jobs
        if not jobs:
            return Decision.from_placements(snapshot, {}, policy=self.name, now_s=now_s)
        gpn = node_size(snapshot)
        nodes_usable = sum(1 for n in snapshot.nodes if n.gpus_for_jobs > 0)
        configs = configurations(gpn, max(nodes_usable, 1), self.max_nodes_per_job)
        total = snapshot.budget_gpus
        p = self.fairness_p
        cost_rows, var_job, var_cfg, forced = [], [], [], []
        currents = {}
        for i, job in enumerate(jobs):
            values, current, underway = self._values(job, configs, now_s)
            currents[job.name] = current
            powered = np.minimum(np.round(np.power(values, p), 2), self.value_clip)
            # minimise Σ x·(A − lambda_n) for p < 0 (maximise Σ x·(A − lambda_n) for p > 0)
            cost = powered - self.lambda_n if p < 0 else self.lambda_n - powered
            for c in range(len(configs)):
                must = underway and c == current
                if cost[c] < 0 or must:  # a variable that can never be chosen is left out
                    var_job.append(i)
                    var_cfg.append(c)
                    cost_rows.append(float(cost[c]))
                    forced.append(must)
        chosen: dict[str, int] = {}
        if var_job:
            n_var = len(var_job)
            cgpus = np.array([configs[c][1] for c in var_cfg], dtype=float)
            rows = np.concatenate([np.array(var_job), np.full(n_var, len(jobs))])
            cols = np.concatenate([np.arange(n_var), np.arange(n_var)])
            vals = np.concatenate([np.ones(n_var), cgpus])
            a = coo_array((vals, (rows, cols)), shape=(len(jobs) + 1, n_var)).tocsr()
            ub = np.concatenate([np.ones(len(jobs)), [float(total)]])
            lb_x = np.array([1.0 if f else 0.0 for f in forced])
            res = milp(np.array(cost_rows), integrality=np.ones(n_var), bounds=Bounds(lb_x, np.ones(n_var)),
                       constraints=[LinearConstraint(a, -np.inf, ub)],
                       options={"mip_rel_gap": self.mip_rel_gap, "presolve": True})
            if res.x is None:
                # No solution: the jobs still in their restart window, which must keep their
                # configuration, hold more GPUs than the nodes offer (a node's allocatable GPUs shrank
                # under them; GPUs kept on a cordoned or NotReady node are in the budget). Preempting
                # every job would be the worst answer: keep them.
                kept = {j.name: j.placement for j in jobs if j.running}
                return Decision.from_placements(snapshot, kept, policy=self.name, now_s=now_s, reasons={
                    j.name: ("keeps its GPUs" if j.name in kept else "waits") + ": the Sia ILP has no solution "
                    "(jobs in their restart window hold more GPUs than the nodes offer)" for j in jobs})
            for k in np.flatnonzero(np.round(res.x) >= 1):
                chosen[jobs[var_job[k]].name] = var_cfg[k]
        placements = self._place(snapshot, jobs, configs, chosen, currents, gpn)
        reasons = {j.name: (f"{configs[chosen[j.name]][1]} GPUs on {configs[chosen[j.name]][0]} node(s): Sia ILP"
                            if j.name in chosen else "waits: Sia ILP gave it no configuration") for j in jobs}
        return Decision.from_placements(snapshot, placements, policy=self.name, now_s=now_s, reasons=reasons)

    @staticmethod
    def _place(snapshot: ClusterSnapshot, jobs, configs, chosen, currents, gpn) -> dict[str, Placement]:
        ledger = FreeGpus(snapshot)
        out: dict[str, Placement] = {}
        moving = []
        for job in jobs:
            c = chosen.get(job.name)
            if c is None:
                continue
            if job.running and currents[job.name] == c:
                ledger.hold(job.placement, job.gpus_per_worker)
                out[job.name] = job.placement
            else:
                moving.append(job)
        moving.sort(key=lambda j: (-configs[chosen[j.name]][1], j.submit_time_s))
        for job in moving:
            workers = configs[chosen[job.name]][1] // job.gpus_per_worker
            placed = ledger.place_compact(workers, job.gpus_per_worker, gpn)
            if placed is not None:
                out[job.name] = placed
        return out
