"""trainflow's default policy (prototype 3: node-aware placement)."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import nnls

from gpu_scheduler.model import ClusterSnapshot, Decision, Job, Placement
from gpu_scheduler.policies._alloc import node_size
from gpu_scheduler.policies.base import register
from gpu_scheduler.policies.placement import FreeGpus


@lru_cache(maxsize=65536)
def _fit(points: tuple[tuple[int, float], ...], requested: int, prior_eff: float) -> tuple[float, float, float]:
    r = max(requested, 2)
    if not points:
        a = 1.0
        return a, a * (1.0 - prior_eff) / (prior_eff * r), 0.0
    rows, rhs = [], []
    for n, tp in points:
        t = 1.0 / tp
        rows.append([1.0 / n / t, (1.0 if n > 1 else 0.0) / t, (n - 1) / t])
        rhs.append(1.0)
    scale = float(np.mean([n / tp for n, tp in points]))
    lam = 0.05
    c_prior = scale * (1.0 - prior_eff) / (prior_eff * r)
    rows.append([0.0, lam / max(c_prior, 1e-12), 0.0])
    rhs.append(lam)
    rows.append([0.0, 0.0, lam * r / scale])
    rhs.append(0.0)
    x, _ = nnls(np.array(rows), np.array(rhs))
    a, c, d = (float(v) for v in x)
    if a <= 0:
        a = scale
    return a, c, d


def speedup_curve(job: Job, prior_eff: float) -> tuple[float, float, float]:
    pts = tuple(sorted((n, tp) for n, tp in job.throughput.items() if tp > 0))
    return _fit(pts, job.requested_workers, prior_eff)


def speedup(params: tuple[float, float, float], n: int) -> float:
    a, c, d = params
    if n <= 0:
        return 0.0
    if n == 1:
        return 1.0
    return a / (a / n + c + d * (n - 1))


@register("default")
@dataclass(frozen=True, slots=True, kw_only=True)
class DefaultPolicy:
    """trainflow default: elastic least-attained-service with measured speedup, restart cost and hysteresis."""

    service_base_gpu_s: float = 3600.0
    priority_exponent: float = 0.5
    prior_efficiency: float = 0.7
    explore_factor: float = 2.0
    tolerance: float = 0.5
    cooldown_s: float = 600.0
    fairness: float = 1.0
    min_marginal_eff: float = 0.0
    mode: str = "share"
    queue_base_gpu_s: float = 3600.0
    queue_factor: float = 4.0
    everyone_min: bool = False
    cooldown_age_fraction: float = 0.0
    hesrpt_c: float = 0.0
    fair_norm: bool = False
    scatter_fill: bool = False
    grow_gain: float = 0.2

    def weight(self, job: Job) -> float:
        return (1.0 + job.attained_service_gpu_s / self.service_base_gpu_s) ** (-self.priority_exponent)

    def utility(self, s: float) -> float:
        b = self.fairness
        if s <= 0:
            return -1e9
        if b == 0:
            return s
        if b == 1:
            return math.log(s)
        return (s ** (1 - b) - 1) / (1 - b)

    @staticmethod
    def next_width(n: int, per_node: int) -> int:
        return n + 1 if n < per_node else (n // per_node + 1) * per_node

    @staticmethod
    def prev_width(n: int, per_node: int) -> int:
        if n <= per_node:
            return n - 1
        return ((n - 1) // per_node) * per_node

    def queue(self, job: Job) -> int:
        k = 0
        t = self.queue_base_gpu_s
        while job.attained_service_gpu_s >= t:
            k += 1
            t *= self.queue_factor
        return k

    def efficient_width(self, j: Job, params, cap, per_node) -> int:
        n = j.min_workers
        while True:
            k = min(self.next_width(n, per_node[j.name]), cap[j.name])
            if k <= n:
                return n
            p = params[j.name]
            if (speedup(p, k) - speedup(p, n)) / (k - n) < self.min_marginal_eff:
                return n
            n = k

    def queue_ideal(self, jobs, total, params, cap, per_node) -> dict[str, int]:
        order = sorted(jobs, key=lambda j: (self.queue(j), j.submit_time_s))
        ideal = {j.name: 0 for j in jobs}
        free = total
        if self.everyone_min:
            for j in order:
                need = j.min_workers * j.gpus_per_worker
                if need <= free:
                    ideal[j.name] = j.min_workers
                    free -= need
        for j in order:
            if free <= 0:
                break
            if ideal[j.name] == 0 and j.min_workers * j.gpus_per_worker > free:
                continue
            w = self.efficient_width(j, params, cap, per_node)
            extra = max(0, min(w - ideal[j.name], free // j.gpus_per_worker))
            ideal[j.name] += extra
            free -= extra * j.gpus_per_worker
        return ideal

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        jobs = snapshot.jobs
        total = snapshot.total_gpus
        gpn = node_size(snapshot)
        weight, params, cap, cooling = {}, {}, {}, set()
        for j in jobs:
            weight[j.name] = self.weight(j)
            params[j.name] = speedup_curve(j, self.prior_efficiency)
            measured_max = max(j.throughput, default=0)
            cap[j.name] = min(j.max_workers, max(j.requested_workers, int(measured_max * self.explore_factor)))
            if j.running and j.placement_since_s is not None:
                age = now_s - (j.first_start_s if j.first_start_s is not None else now_s)
                if now_s - j.placement_since_s < max(self.cooldown_s, self.cooldown_age_fraction * age):
                    cooling.add(j.name)
        if self.hesrpt_c > 0:
            ranked = sorted(jobs, key=lambda j: (-j.attained_service_gpu_s, j.submit_time_s))
            m = len(ranked)
            for i, j in enumerate(ranked, start=1):
                weight[j.name] = (i / m) ** self.hesrpt_c - ((i - 1) / m) ** self.hesrpt_c + 1e-9
        per_node = {j.name: max(gpn // j.gpus_per_worker, 1) for j in jobs}
        if self.fair_norm:
            fair = max(1, math.ceil(total / max(len(jobs), 1)))
            for j in jobs:
                f = min(fair, j.max_workers)
                # utility (s^(1-b))/(1-b) of s/S(f): same as weight S(f)^(b-1) on s
                weight[j.name] *= speedup(params[j.name], f) ** (self.fairness - 1)
        index = {j.name: i for i, j in enumerate(jobs)}

        def value(j: Job, n: int, k: int) -> float:
            p = params[j.name]
            return weight[j.name] * (self.utility(speedup(p, k)) - self.utility(speedup(p, n))) / (
                (k - n) * j.gpus_per_worker)

        # 1. Ideal widths (capacity only): everyone's minimum in priority order, then greedy.
        order = sorted(jobs, key=lambda j: (-weight[j.name], j.submit_time_s))
        ideal = {j.name: 0 for j in jobs}
        free = total
        heap: list[tuple[float, int, int]] = []
        for j in order:
            need = j.min_workers * j.gpus_per_worker
            if need <= free:
                ideal[j.name] = j.min_workers
                free -= need
                k = min(self.next_width(j.min_workers, per_node[j.name]), cap[j.name])
                if k > j.min_workers:
                    heap.append((-value(j, j.min_workers, k), index[j.name], k))
        heapq.heapify(heap)
        deferred: list[tuple[float, int, int]] = []
        for phase in (0, 1):
            if phase == 1:
                heap = deferred
                heapq.heapify(heap)
            while heap and free > 0:
                negv, i, k = heapq.heappop(heap)
                if negv >= 0:
                    break
                j = jobs[i]
                n = ideal[j.name]
                if phase == 0 and (speedup(params[j.name], k) - speedup(params[j.name], n)) / (k - n) < self.min_marginal_eff:
                    deferred.append((negv, i, k))
                    continue
                step = (k - n) * j.gpus_per_worker
                if step > free:
                    continue
                ideal[j.name] = k
                free -= step
                k2 = min(self.next_width(k, per_node[j.name]), cap[j.name])
                if k2 > k:
                    heapq.heappush(heap, (-value(j, k, k2), i, k2))

        if self.mode == "queue":
            ideal = self.queue_ideal(jobs, total, params, cap, per_node)
            qkey = {j.name: (self.queue(j), j.submit_time_s) for j in jobs}
            rank = {name: r for r, name in enumerate(sorted(qkey, key=lambda n: qkey[n]))}
            weight = {name: 1.0 / (1 + rank[name]) for name in rank}
            order = sorted(jobs, key=lambda j: qkey[j.name])

        # 2. Hysteresis: running jobs keep their width during cooldown or when the change is small.
        targets = dict(ideal)
        for j in jobs:
            if not j.running or ideal[j.name] == 0:
                continue
            cur, want = j.workers, ideal[j.name]
            small = cur / (1 + self.tolerance) < want < cur * (1 + self.tolerance)
            if j.name in cooling or small:
                targets[j.name] = cur
        used = sum(targets[j.name] * j.gpus_per_worker for j in jobs)
        for j in sorted(jobs, key=lambda j: weight[j.name]):
            if used <= total:
                break
            if targets[j.name] > ideal[j.name]:
                used -= (targets[j.name] - ideal[j.name]) * j.gpus_per_worker
                targets[j.name] = ideal[j.name]

        # 3. Placement: keep compact running jobs, place the rest compactly (largest first),
        #    shrinking a job to the widest compact width that fits.
        ledger = FreeGpus(snapshot)
        out: dict[str, Placement] = {}
        moving: list[Job] = []
        for j in jobs:
            t = targets[j.name]
            if t <= 0:
                continue
            compact = j.running and j.placement.node_count <= -(-j.workers // per_node[j.name])
            if j.running and t == j.workers and (compact or j.name in cooling):
                ledger.hold(j.placement, j.gpus_per_worker)
                out[j.name] = j.placement
            else:
                moving.append(j)
        moving.sort(key=lambda j: (-targets[j.name] * j.gpus_per_worker, -weight[j.name]))
        for j in moving:
            k = targets[j.name]
            while k >= j.min_workers:
                p = ledger.place_compact(k, j.gpus_per_worker, gpn)
                if p is not None:
                    out[j.name] = p
                    break
                k = self.prev_width(k, per_node[j.name])

        # 4. Leftover GPUs: grow placed jobs and start waiting ones, compactly. A running job grows
        #    only by a step that speeds it up by at least grow_gain (a restart is not free).
        if ledger.total_free() > 0:
            base = {j.name: (out[j.name].workers if j.name in out else 0) for j in jobs}

            def first_step(j: Job, n: int) -> int:
                if n == 0:
                    return j.min_workers
                k = n
                while True:
                    k = min(self.next_width(k, per_node[j.name]), cap[j.name])
                    if speedup(params[j.name], k) >= speedup(params[j.name], n) * (1 + self.grow_gain):
                        return k
                    if k >= cap[j.name]:
                        return n

            heap = []
            for j in order:
                n = base[j.name]
                k = first_step(j, n)
                if k > n:
                    heap.append((-value(j, n, k) if n else -weight[j.name] * 1e6, index[j.name], k))
            heapq.heapify(heap)
            while heap and ledger.total_free() > 0:
                negv, i, k = heapq.heappop(heap)
                if negv >= 0:
                    break
                j = jobs[i]
                cur = out.get(j.name, Placement())
                gpw = j.gpus_per_worker
                grown = None
                if cur:
                    ledger.release(cur, gpw)
                    in_place = cur.node_count == 1 and k <= per_node[j.name] and ledger.free_on(cur.nodes[0]) >= k * gpw
                    if in_place:
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
                k2 = min(self.next_width(k, per_node[j.name]), cap[j.name])
                if k2 > k:
                    heapq.heappush(heap, (-value(j, k, k2), i, k2))
        # 5. Scattered leftovers: multi-node jobs (already paying inter-node synchronisation) may take
        #    single free GPUs, one worker at a time, while that still speeds them up enough.
        if self.scatter_fill and ledger.total_free() > 0:
            heap = []
            for j in order:
                n = out[j.name].workers if j.name in out else 0
                if j.name in cooling or n < per_node[j.name] or n >= cap[j.name]:
                    continue
                heap.append((-value(j, n, n + 1), index[j.name], n + 1))
            heapq.heapify(heap)
            base = {j.name: (out[j.name].workers if j.name in out else 0) for j in jobs}
            while heap and ledger.total_free() > 0:
                negv, i, k = heapq.heappop(heap)
                if negv >= 0:
                    break
                j = jobs[i]
                grown = ledger.grow(out[j.name], 1, j.gpus_per_worker)
                if grown is None:
                    continue
                out[j.name] = grown
                if k + 1 <= cap[j.name]:
                    heapq.heappush(heap, (-value(j, k, k + 1), i, k + 1))
            for j in jobs:
                if j.name in out and j.running and out[j.name].workers != base[j.name]:
                    pass
        return Decision.from_placements(snapshot, out, policy=self.name, now_s=now_s)
