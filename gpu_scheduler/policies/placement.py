"""Placing workers on nodes: a free-GPU ledger with packing strategies.

Policies decide *how many* workers each job gets; this module decides *where*. One
:class:`FreeGpus` ledger lives for one ``decide`` call: a policy first holds what it keeps, then
asks for new placements, and the ledger guarantees no node is over-committed.

Strategies (:class:`Strategy`):

* ``best_fit`` (default) — a job that fits on one node goes to the node with the *fewest* free GPUs
  that still holds it (classic best-fit bin packing, which keeps large holes free for large jobs).
  A job that needs several nodes takes the nodes with the most free GPUs first (fewest nodes, whole
  nodes first), then best-fits the remainder.
* ``next_fit`` — next-fit bin packing (the seed study's homework): a cursor walks the nodes in order;
  a job goes on the cursor node if it fits, else the cursor moves to the next node that holds it;
  jobs larger than any node spill across consecutive nodes from the cursor.
* ``most_free`` — repeatedly the node with the most free GPUs (ties: first in node order). This is
  what the Pollux artifact's Tiresias and Optimus baselines do (``Counter.most_common`` in
  petuum/adaptdl@osdi21-artifact ``simulator/tiresias.py``); it spreads jobs (worst-fit) and is kept
  for fidelity with the published numbers.

Ties between nodes always go to the node listed first in the snapshot, so placements are
deterministic. Every operation is O(log nodes) per node touched (free counts are bucketed), so
one decision for thousands of jobs on thousands of GPUs stays fast.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable

from gpu_scheduler.model import ClusterSnapshot, Placement, SchedulerError

__all__ = ["FreeGpus", "Strategy"]


class Strategy(enum.StrEnum):
    """Packing strategy for new workers (see the module docstring)."""

    BEST_FIT = "best_fit"
    NEXT_FIT = "next_fit"
    MOST_FREE = "most_free"

    @classmethod
    def parse(cls, value: str | Strategy) -> Strategy:
        """Parse a strategy name. Raises SchedulerError naming the valid choices."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(s.value for s in cls)
            raise SchedulerError(f"unknown placement strategy {value!r}; choose one of: {choices}") from None


class FreeGpus:
    """Free GPUs per node during one decision, with packing.

    Args:
        snapshot: The cluster; capacity per node is ``Node.gpus_for_jobs``.
        strategy: How :meth:`place` and :meth:`grow` choose nodes for new workers.

    Nothing is held initially: callers :meth:`hold` the placements they keep.
    """

    __slots__ = ("_buckets", "_cap", "_cursor", "_free", "_names", "_pos", "_total", "strategy")

    def __init__(self, snapshot: ClusterSnapshot, strategy: Strategy | str = Strategy.BEST_FIT) -> None:
        self.strategy = Strategy.parse(strategy)
        self._names = [n.name for n in snapshot.nodes]
        self._pos = {name: i for i, name in enumerate(self._names)}
        self._free = [max(n.gpus_for_jobs, 0) for n in snapshot.nodes]
        self._total = sum(self._free)  # kept equal to total_free() by _set (O(1) reads)
        self._cap = max(self._free, default=0)
        # One min-heap of node positions per free count (lazy deletion: an entry is live only
        # while the node's free count still equals its bucket), so the first node in snapshot
        # order wins ties in both directions (fewest-fitting and most-free).
        self._buckets: list[list[int]] = [[] for _ in range(self._cap + 1)]
        for i, f in enumerate(self._free):
            self._buckets[f].append(i)
        self._cursor = 0

    # ------------------------------------------------------------------ bookkeeping

    def _set(self, i: int, free: int) -> None:
        self._total += max(free, 0) - max(self._free[i], 0)
        self._free[i] = free
        if free > self._cap:  # more than any node had at the start (a release of unheld GPUs)
            self._buckets.extend([] for _ in range(free - self._cap))
            self._cap = free
        if free >= 0:
            heapq.heappush(self._buckets[free], i)

    def _first_in_bucket(self, free: int) -> int | None:
        heap = self._buckets[free]
        while heap:
            i = heap[0]
            if self._free[i] == free:
                return i
            heapq.heappop(heap)  # stale entry
        return None

    def free_on(self, node: str) -> int:
        """Free GPUs on ``node``."""
        return self._free[self._pos[node]]

    def total_free(self) -> int:
        """Free GPUs summed over nodes (negative entries ignored); O(1)."""
        return self._total

    def by_node(self) -> dict[str, int]:
        """Free GPUs by node name."""
        return dict(zip(self._names, self._free, strict=True))

    def workers_fit(self, gpus_per_worker: int) -> int:
        """How many more workers of ``gpus_per_worker`` GPUs fit, over all nodes."""
        if gpus_per_worker == 1:
            return self.total_free()
        return sum(f // gpus_per_worker for f in self._free if f > 0)

    def hold(self, placement: Placement, gpus_per_worker: int) -> None:
        """Mark an existing placement as taken (may drive a node negative if it was over-committed;
        such a node then has no room for anything new)."""
        for node, workers in placement:
            i = self._pos[node]
            self._set(i, self._free[i] - workers * gpus_per_worker)

    def hold_all(self, placements: Iterable[tuple[Placement, int]]) -> None:
        """:meth:`hold` of every ``(placement, gpus_per_worker)``, each node's count set once."""
        free, pos = self._free, self._pos
        before: dict[int, int] = {}
        for placement, gpus_per_worker in placements:
            for node, workers in placement.shares:
                i = pos[node]
                if i not in before:
                    before[i] = free[i]
                free[i] -= workers * gpus_per_worker
        for i, old in before.items():
            new, free[i] = free[i], old
            self._set(i, new)

    def release(self, placement: Placement, gpus_per_worker: int) -> None:
        """Return a placement's GPUs to the pool."""
        for node, workers in placement:
            i = self._pos[node]
            self._set(i, self._free[i] + workers * gpus_per_worker)

    # ------------------------------------------------------------------ choosing nodes

    def _smallest_fitting(self, gpus: int) -> int | None:
        """First node (snapshot order) among those with the fewest free GPUs >= gpus."""
        for free in range(max(gpus, 1), self._cap + 1):
            i = self._first_in_bucket(free)
            if i is not None:
                return i
        return None

    def _most_free(self) -> int | None:
        for free in range(self._cap, 0, -1):
            i = self._first_in_bucket(free)
            if i is not None:
                return i
        return None

    def _take(self, shares: dict[str, int], i: int, workers: int, gpw: int) -> None:
        name = self._names[i]
        shares[name] = shares.get(name, 0) + workers
        self._set(i, self._free[i] - workers * gpw)

    def _spill_most_free(self, shares: dict[str, int], workers: int, gpw: int, *, best_fit_tail: bool) -> int:
        """Fill nodes with the most free GPUs first; returns workers still unplaced."""
        while workers > 0:
            if best_fit_tail:
                i = self._smallest_fitting(workers * gpw)
                if i is not None:
                    self._take(shares, i, workers, gpw)
                    return 0
            i = self._most_free()
            if i is None or self._free[i] < gpw:
                return workers
            n = min(self._free[i] // gpw, workers)
            self._take(shares, i, n, gpw)
            workers -= n
        return 0

    def _next_fit(self, shares: dict[str, int], workers: int, gpw: int) -> int:
        count = len(self._names)
        if count == 0:
            return workers
        need = workers * gpw
        # Whole job on one node: from the cursor onwards, first node that holds it.
        if need <= self._cap:
            for step in range(count):
                i = (self._cursor + step) % count
                if self._free[i] >= need:
                    self._cursor = i
                    self._take(shares, i, workers, gpw)
                    return 0
        # Spill over consecutive nodes from the cursor.
        start = self._cursor
        for step in range(count):
            if workers == 0:
                break
            i = (start + step) % count
            n = min(self._free[i] // gpw, workers) if self._free[i] > 0 else 0
            if n:
                self._take(shares, i, n, gpw)
                workers -= n
                self._cursor = i
        return workers

    def _allocate(self, workers: int, gpw: int, shares: dict[str, int]) -> int:
        if self.strategy is Strategy.BEST_FIT:
            return self._spill_most_free(shares, workers, gpw, best_fit_tail=True)
        if self.strategy is Strategy.MOST_FREE:
            return self._spill_most_free(shares, workers, gpw, best_fit_tail=False)
        return self._next_fit(shares, workers, gpw)

    def place(self, workers: int, gpus_per_worker: int = 1) -> Placement | None:
        """Place ``workers`` new workers and take their GPUs.

        Returns:
            The placement, or None (and nothing taken) if they do not fit.
        """
        if workers <= 0:
            return Placement()
        if self.workers_fit(gpus_per_worker) < workers:
            return None
        shares: dict[str, int] = {}
        left = self._allocate(workers, gpus_per_worker, shares)
        if left:  # cannot happen after the capacity check; undo to stay consistent
            self.release(Placement.of(shares), gpus_per_worker)
            return None
        return Placement.of(shares)

    def grow(self, current: Placement, extra: int, gpus_per_worker: int = 1) -> Placement | None:
        """Add ``extra`` workers to a job already holding ``current`` (held in this ledger).

        New workers go first onto the nodes the job already uses (in rank order), then onto new
        nodes by the strategy, so a job spans as few nodes as possible.

        Returns:
            The grown placement (existing shares first, rank order kept), or None (nothing
            taken) if the extra workers do not fit.
        """
        if extra <= 0:
            return current
        if self.workers_fit(gpus_per_worker) < extra:
            return None
        shares = dict(current.shares)
        left = extra
        for node, _ in current.shares:
            i = self._pos[node]
            n = min(max(self._free[i], 0) // gpus_per_worker, left)
            if n:
                self._take(shares, i, n, gpus_per_worker)
                left -= n
            if not left:
                break
        if left:
            left = self._allocate(left, gpus_per_worker, shares)
        return Placement.of(shares)

    @staticmethod
    def shrink(current: Placement, workers: int) -> Placement:
        """``current`` reduced to ``workers`` workers, emptying the smallest shares first (fewest
        nodes remain). Pure: the caller releases/holds GPUs in the ledger."""
        if workers >= current.workers:
            return current
        if workers <= 0:
            return Placement()
        drop = current.workers - workers
        order = sorted(range(len(current.shares)), key=lambda k: (current.shares[k][1], -k))
        counts = [w for _, w in current.shares]
        for k in order:
            if not drop:
                break
            n = min(counts[k], drop)
            counts[k] -= n
            drop -= n
        return Placement.of((node, c) for (node, _), c in zip(current.shares, counts, strict=True))

    def place_compact(self, workers: int, gpus_per_worker: int, node_gpus: int) -> Placement | None:
        """Place ``workers`` on the fewest nodes possible, or not at all.

        With ``node_gpus`` GPUs per node, a job needs ``ceil(workers / (node_gpus // gpus_per_worker))``
        nodes. A job that fits on one node goes to the fullest node that holds it (best fit); a
        larger one takes completely free nodes for its full chunks and best-fits the remainder.

        Returns:
            The placement (GPUs taken), or None (nothing taken) if no compact placement exists now.
        """
        per_node = max(node_gpus // gpus_per_worker, 1)
        if workers <= 0:
            return Placement()
        if workers <= per_node:
            i = self._smallest_fitting(workers * gpus_per_worker)
            if i is None:
                return None
            shares: dict[str, int] = {}
            self._take(shares, i, workers, gpus_per_worker)
            return Placement.of(shares)
        full, rest = divmod(workers, per_node)
        chosen: list[int] = []
        whole = per_node * gpus_per_worker
        for free in range(self._cap, whole - 1, -1):
            heap = self._buckets[free] if free < len(self._buckets) else []
            for i in sorted(heap):
                if self._free[i] == free and i not in chosen:
                    chosen.append(i)
                    if len(chosen) == full:
                        break
            if len(chosen) == full:
                break
        if len(chosen) < full:
            return None
        shares = {}
        for i in chosen:
            self._take(shares, i, per_node, gpus_per_worker)
        if rest:
            i = self._smallest_fitting(rest * gpus_per_worker)
            if i is None:
                self.release(Placement.of(shares), gpus_per_worker)
                return None
            self._take(shares, i, rest, gpus_per_worker)
        return Placement.of(shares)

    def fits(self, placement: Placement, gpus_per_worker: int) -> bool:
        """True if ``placement`` could be held now without over-committing a node."""
        return all(self._free[self._pos[node]] >= w * gpus_per_worker for node, w in placement)
