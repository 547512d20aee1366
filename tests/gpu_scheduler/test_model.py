"""Unit tests of the scheduler's value types (pure logic, no servers)."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_scheduler.model import (
    ClusterSnapshot,
    Decision,
    InvalidDecision,
    Job,
    Node,
    Outcome,
    Placement,
)


def nodes(count: int = 2, gpus: int = 4) -> tuple[Node, ...]:
    return tuple(Node(name=f"n{i}", gpus=gpus) for i in range(count))


def test_placement_counts_and_merging() -> None:
    p = Placement.of([("n1", 2), ("n0", 1), ("n1", 1), ("n2", 0)])
    assert p.shares == (("n1", 3), ("n0", 1))
    assert p.workers == 4 and p.node_count == 2 and p.nodes == ("n1", "n0")
    assert p.on("n1") == 3 and p.on("n9") == 0
    assert p.gpus(2) == 8
    assert str(p) == "n1:3,n0:1" and str(Placement()) == "-"
    assert not Placement() and p


def test_placement_rejects_bad_shares() -> None:
    with pytest.raises(ValueError, match="twice"):
        Placement((("n0", 1), ("n0", 2)))
    with pytest.raises(ValueError, match=">= 1 worker"):
        Placement((("n0", 0),))


def test_job_validates_bounds_and_freezes_mappings() -> None:
    job = Job(name="a", submit_time_s=5.0, max_workers=8, throughput={1: 10.0, 2: 19.0})
    assert job.requested_workers == 8  # defaults to max
    assert job.throughput_at(2) == 19.0 and job.throughput_at(3) is None
    with pytest.raises(TypeError):
        job.throughput[4] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.max_workers = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="requested_workers=9 outside"):
        Job(name="b", submit_time_s=0, max_workers=8, requested_workers=9)
    with pytest.raises(ValueError, match="max_workers=1 < min_workers=2"):
        Job(name="c", submit_time_s=0, min_workers=2, max_workers=1)
    with pytest.raises(ValueError, match="gpus_unavailable=5 exceeds"):
        Node(name="n", gpus=4, gpus_unavailable=5)


def test_snapshot_free_gpus_account_for_placements_and_unmanaged_pods() -> None:
    ns = (Node(name="n0", gpus=4, gpus_unavailable=1), Node(name="n1", gpus=4, schedulable=False))
    job = Job(name="a", submit_time_s=0, max_workers=4, gpus_per_worker=2,
              placement=Placement.of({"n0": 1}))
    snap = ClusterSnapshot(nodes=ns, jobs=(job,), taken_at_s=1.0)
    assert snap.total_gpus == 3
    assert snap.used_gpus_by_node() == {"n0": 2, "n1": 0}
    assert snap.free_gpus_by_node() == {"n0": 1, "n1": 0}
    with pytest.raises(ValueError, match="duplicate job"):
        ClusterSnapshot(nodes=ns, jobs=(job, job))


@pytest.mark.parametrize(
    ("current", "target", "outcome"),
    [
        ({}, {}, Outcome.WAIT),
        ({}, {"n0": 1}, Outcome.START),
        ({"n0": 1}, {}, Outcome.PREEMPT),
        ({"n0": 1}, {"n0": 2}, Outcome.SCALE_UP),
        ({"n0": 2}, {"n0": 1}, Outcome.SCALE_DOWN),
        ({"n0": 2}, {"n1": 2}, Outcome.MIGRATE),
        ({"n0": 1, "n1": 1}, {"n1": 1, "n0": 1}, Outcome.KEEP),
    ],
)
def test_outcome_between(current: dict, target: dict, outcome: Outcome) -> None:
    assert Outcome.between(Placement.of(current), Placement.of(target)) is outcome


def test_decision_from_placements_fills_outcomes_and_validates() -> None:
    a = Job(name="a", submit_time_s=0, max_workers=4, placement=Placement.of({"n0": 2}))
    b = Job(name="b", submit_time_s=1, max_workers=4)
    snap = ClusterSnapshot(nodes=nodes(), jobs=(a, b))
    d = Decision.from_placements(snap, {"b": Placement.of({"n1": 4})}, policy="t", now_s=3.0,
                                 reasons={"a": "lowest priority"}, annotations={"b": {"q": "0"}})
    assert [j.job for j in d] == ["a", "b"]
    assert d["a"].outcome is Outcome.PREEMPT and d["a"].reason == "lowest priority"
    assert d["b"].outcome is Outcome.START and d["b"].annotations == {"q": "0"}
    assert [c.job for c in d.changes()] == ["a", "b"]
    assert d.gpus_by_node(snap) == {"n0": 0, "n1": 4}
    d.validate(snap)


def test_validate_reports_every_broken_invariant() -> None:
    a = Job(name="a", submit_time_s=0, max_workers=2)
    b = Job(name="b", submit_time_s=0, max_workers=8)
    snap = ClusterSnapshot(nodes=nodes(1), jobs=(a, b))
    bad = Decision.from_placements(
        snap, {"a": Placement.of({"n0": 3}), "b": Placement.of({"n0": 2, "zz": 1})}, policy="t", now_s=0)
    with pytest.raises(InvalidDecision) as err:
        bad.validate(snap)
    problems = err.value.problems
    assert "job a: 3 workers outside [1, 2]" in problems
    assert "job b: unknown node 'zz'" in problems
    assert "node n0: 5 GPUs placed, capacity 4" in problems
    with pytest.raises(InvalidDecision, match="unknown job 'x'"):
        Decision.from_placements(snap, {"x": Placement()}, policy="t", now_s=0)
    partial = Decision(policy="t", made_at_s=0, jobs=bad.jobs[:1])
    with pytest.raises(InvalidDecision, match=r"no target for jobs \['b'\]"):
        partial.validate(snap)


def test_invalid_decision_survives_pickling_between_processes() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(InvalidDecision(["a broke", "b broke"])))
    assert err.problems == ("a broke", "b broke") and str(err) == "a broke; b broke"
