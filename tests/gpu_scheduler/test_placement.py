"""Unit tests of the free-GPU ledger and packing strategies."""

from __future__ import annotations

import pytest

from gpu_scheduler.model import ClusterSnapshot, Node, Placement, SchedulerError
from gpu_scheduler.policies.placement import FreeGpus, Strategy


def ledger(free: list[int], strategy: str = "best_fit", capacity: int = 4) -> FreeGpus:
    snap = ClusterSnapshot(nodes=tuple(Node(name=f"n{i}", gpus=capacity) for i in range(len(free))), jobs=())
    led = FreeGpus(snap, strategy)
    for i, f in enumerate(free):
        if capacity - f:
            led.hold(Placement.of({f"n{i}": capacity - f}), 1)
    return led


def test_best_fit_uses_the_tightest_node_that_holds_the_job() -> None:
    led = ledger([4, 2, 3, 1])
    assert led.place(2) == Placement.of({"n1": 2})
    assert led.place(1) == Placement.of({"n3": 1})
    assert led.by_node() == {"n0": 4, "n1": 0, "n2": 3, "n3": 0}


def test_best_fit_spans_fewest_nodes_for_large_jobs() -> None:
    led = ledger([4, 2, 4, 1])
    assert led.place(7) == Placement.of({"n0": 4, "n2": 3})
    assert led.total_free() == 4


def test_most_free_spreads_like_the_pollux_baselines() -> None:
    led = ledger([4, 2, 4, 1], "most_free")
    assert led.place(1) == Placement.of({"n0": 1})
    assert led.place(1) == Placement.of({"n2": 1})
    assert led.place(5) == Placement.of({"n0": 3, "n2": 2})


def test_next_fit_keeps_a_cursor() -> None:
    led = ledger([4, 4, 4], "next_fit")
    assert led.place(3) == Placement.of({"n0": 3})
    assert led.place(2) == Placement.of({"n1": 2})  # does not fit in n0's last GPU: move on
    assert led.place(1) == Placement.of({"n1": 1})  # stays at the cursor
    assert led.place(6) == Placement.of({"n1": 1, "n2": 4, "n0": 1})


def test_gpus_per_worker_respects_node_boundaries() -> None:
    led = ledger([3, 3, 4])
    assert led.workers_fit(2) == 4
    assert led.place(2, gpus_per_worker=2) == Placement.of({"n2": 2})
    assert led.place(3, gpus_per_worker=2) is None  # 2 workers fit (one per node), not 3
    assert led.by_node() == {"n0": 3, "n1": 3, "n2": 0}


def test_grow_fills_own_nodes_first_and_shrink_drops_small_shares() -> None:
    led = ledger([4, 4, 4])
    cur = led.place(3)
    assert cur == Placement.of({"n0": 3})
    grown = led.grow(cur, 3)
    assert grown == Placement.of({"n0": 4, "n1": 2})
    assert FreeGpus.shrink(grown, 4) == Placement.of({"n0": 4})
    assert FreeGpus.shrink(grown, 5) == Placement.of({"n0": 4, "n1": 1})
    assert FreeGpus.shrink(grown, 0) == Placement()


def test_place_that_does_not_fit_takes_nothing() -> None:
    led = ledger([1, 1])
    assert led.place(3) is None
    assert led.total_free() == 2


def test_unknown_strategy_is_a_clear_error() -> None:
    with pytest.raises(SchedulerError, match="unknown placement strategy 'worst'; choose one of: best_fit"):
        Strategy.parse("worst")


def test_total_free_stays_the_sum_of_free_gpus_through_holds_and_releases() -> None:
    """total_free() is kept as a running total (O(1)); it must equal the sum over nodes."""
    import random

    from gpu_scheduler.model import ClusterSnapshot, Node, Placement
    from gpu_scheduler.policies.placement import FreeGpus

    rng = random.Random(7)
    snapshot = ClusterSnapshot(nodes=tuple(Node(name=f"n{i}", gpus=8) for i in range(6)), jobs=())
    free = FreeGpus(snapshot)
    for _ in range(500):
        node, workers, gpw = f"n{rng.randrange(6)}", rng.randint(1, 3), rng.choice((1, 2, 4))
        (free.hold if rng.random() < 0.55 else free.release)(Placement.of({node: workers}), gpw)
        assert free.total_free() == sum(max(f, 0) for f in free.by_node().values())
