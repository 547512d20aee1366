"""Unit tests of the policies on hand-built snapshots (pure logic, values asserted)."""

from __future__ import annotations

import math
import random

import pytest

from gpu_scheduler.model import ClusterSnapshot, Job, Node, Outcome, Placement
from gpu_scheduler.policies import UnknownPolicy, create, describe, names, parse_params
from gpu_scheduler.policies.default import DefaultPolicy, fit_speedup, job_speedup
from gpu_scheduler.policies.tiresias import QUEUE_KEY, SINCE_KEY


def cluster(nodes: int = 2, gpus: int = 4) -> tuple[Node, ...]:
    return tuple(Node(name=f"n{i}", gpus=gpus) for i in range(nodes))


def job(name: str, submit: float = 0.0, *, req: int = 1, max_w: int | None = None, on: dict | None = None,
        attained: float = 0.0, tp: dict | None = None, since: float | None = None, **kw) -> Job:
    placement = Placement.of(on or {})
    return Job(name=name, submit_time_s=submit, requested_workers=req, max_workers=max_w or req,
               placement=placement, attained_service_gpu_s=attained, throughput=tp or {},
               first_start_s=since if placement else None,
               placement_since_s=since if placement else None, **kw)


def workers(decision) -> dict[str, int]:
    return {d.job: d.workers for d in decision}


# ----------------------------------------------------------------------------- registry


def test_registry_lists_every_policy_with_a_summary() -> None:
    assert set(names()) >= {"fifo", "fifo_backfill", "elastic_fifo", "round_robin", "tiresias", "optimus", "default"}
    assert all(describe()[n] for n in names())
    assert create("tiresias").name == "tiresias"
    assert create("optimus").uses_oracle is True
    assert create("default").uses_oracle is False


def test_registry_errors_are_one_line_and_name_the_choices() -> None:
    with pytest.raises(UnknownPolicy, match="unknown policy 'nope'; choose one of: default, elastic_fifo"):
        create("nope")
    with pytest.raises(UnknownPolicy, match="bad parameters"):
        create("fifo", quantum_s=3)
    with pytest.raises(UnknownPolicy, match="quantum_s must be > 0"):
        create("round_robin", quantum_s=0)
    # a ConfigMap's YAML types are checked against the field (review 2026-11-30: "false" was truthy)
    with pytest.raises(UnknownPolicy, match=r"parameter use_measured_throughput must be a bool, got 'false' \(str\)"):
        create("default", use_measured_throughput="false")
    with pytest.raises(UnknownPolicy, match="parameter quantum_s must be a float, got 'soon'"):
        create("round_robin", quantum_s="soon")
    with pytest.raises(UnknownPolicy, match="queue_thresholds_gpu_s must be a list of numbers"):
        create("tiresias", queue_thresholds_gpu_s=["an hour"])
    assert create("round_robin", quantum_s=300).quantum_s == 300  # an int for a float field is a number


def test_parse_params_converts_to_the_field_types() -> None:
    assert parse_params("round_robin", ["quantum-s=300"]) == {"quantum_s": 300.0}
    assert parse_params("tiresias", ["queue_thresholds_gpu_s=3600,57600"]) == {
        "queue_thresholds_gpu_s": (3600.0, 57600.0)}
    assert parse_params("elastic_fifo", ["grow_to=max"]) == {"grow_to": "max"}
    with pytest.raises(UnknownPolicy, match="has no parameter 'bogus'"):
        parse_params("fifo", ["bogus=1"])
    with pytest.raises(UnknownPolicy, match="not a valid float"):
        parse_params("round_robin", ["quantum_s=soon"])
    with pytest.raises(UnknownPolicy, match="is not key=value"):
        parse_params("fifo", ["placement"])


# ----------------------------------------------------------------------------- FIFO family


def test_fifo_blocks_behind_the_head_and_backfill_does_not() -> None:
    snap = ClusterSnapshot(nodes=cluster(), jobs=(
        job("a", 0, req=6, on={"n0": 4, "n1": 2}, since=0),
        job("b", 10, req=4),   # needs 4, only 2 free
        job("c", 20, req=1),
    ))
    strict = create("fifo").decide(snap, 60)
    assert workers(strict) == {"a": 6, "b": 0, "c": 0}
    assert strict["a"].outcome is Outcome.KEEP and strict["c"].outcome is Outcome.WAIT
    backfill = create("fifo_backfill").decide(snap, 60)
    assert workers(backfill) == {"a": 6, "b": 0, "c": 1}
    assert backfill["c"].placement == Placement.of({"n1": 1})


def test_elastic_fifo_gives_everyone_one_then_grows_the_oldest() -> None:
    snap = ClusterSnapshot(nodes=cluster(), jobs=(
        job("a", 0, req=6, max_w=8), job("b", 1, req=6, max_w=8), job("c", 2, req=6, max_w=8)))
    d = create("elastic_fifo").decide(snap, 60)
    assert workers(d) == {"a": 6, "b": 1, "c": 1}
    d_max = create("elastic_fifo", grow_to="max").decide(snap, 60)
    assert workers(d_max) == {"a": 6, "b": 1, "c": 1}  # 8 GPUs: 1+1 kept for b, c
    # A newcomer takes a GPU from the most recently grown job, not from the oldest.
    running = ClusterSnapshot(nodes=cluster(), jobs=(
        job("a", 0, req=6, on={"n0": 4, "n1": 2}, since=0), job("b", 1, req=6, on={"n1": 2}, since=0),
        job("c", 2, req=6)))
    d2 = create("elastic_fifo").decide(running, 120)
    assert workers(d2) == {"a": 6, "b": 1, "c": 1}
    assert d2["b"].outcome is Outcome.SCALE_DOWN and d2["a"].outcome is Outcome.KEEP


# ----------------------------------------------------------------------------- Round Robin


def test_round_robin_rotates_after_the_quantum_and_remembers_the_queue() -> None:
    snap = ClusterSnapshot(nodes=cluster(1), jobs=(
        job("a", 0, req=4, on={"n0": 4}, since=0), job("b", 5, req=4)))
    rr = create("round_robin", quantum_s=600)
    inside = rr.decide(snap, 300)
    assert workers(inside) == {"a": 4, "b": 0}
    after = rr.decide(snap, 660)
    assert workers(after) == {"a": 0, "b": 4}
    assert after["a"].outcome is Outcome.PREEMPT and after["a"].annotations == {"rr_waiting_since_s": "660.0"}
    # Nobody waiting: an expired job keeps running.
    alone = ClusterSnapshot(nodes=cluster(1), jobs=(job("a", 0, req=4, on={"n0": 4}, since=0),))
    assert workers(rr.decide(alone, 5000)) == {"a": 4}


# ----------------------------------------------------------------------------- Tiresias


def test_tiresias_demotes_by_attained_service_and_preempts_for_queue_0() -> None:
    threshold = 16 * 3600.0
    old = job("old", 0, req=4, on={"n0": 4}, since=0, attained=threshold + 1)
    new = job("new", 100, req=4)
    snap = ClusterSnapshot(nodes=cluster(1), jobs=(old, new))
    d = create("tiresias").decide(snap, 200)
    assert workers(d) == {"old": 0, "new": 4}
    assert d["old"].outcome is Outcome.PREEMPT
    assert d["old"].annotations == {QUEUE_KEY: "1", SINCE_KEY: "200.0"}
    assert d["new"].placement == Placement.of({"n0": 4})


def test_tiresias_orders_a_lower_queue_by_demotion_time_and_backfills() -> None:
    threshold = 16 * 3600.0
    early = job("early", 500, req=3, attained=threshold, annotations={QUEUE_KEY: "1", SINCE_KEY: "1000.0"})
    late = job("late", 0, req=3, attained=threshold, annotations={QUEUE_KEY: "1", SINCE_KEY: "2000.0"})
    small = job("small", 900, req=1, attained=threshold, annotations={QUEUE_KEY: "1", SINCE_KEY: "3000.0"})
    snap = ClusterSnapshot(nodes=cluster(1), jobs=(late, early, small))
    d = create("tiresias").decide(snap, 4000)
    # Demoted first runs first although submitted later; the 1-GPU job backfills the last GPU.
    assert workers(d) == {"late": 0, "early": 3, "small": 1}


@pytest.mark.parametrize("value", ["soon", "inf", "nan", "1e999"])
def test_a_hand_edited_policy_annotation_falls_back_to_the_submit_time(value: str) -> None:
    """Review (2026-11-30): ``float()`` of a policy annotation that is not a finite number raised
    inside ``decide``, so every job was left as it was on every tick. Such a value reads as absent."""
    early = job("early", 500, req=3, attained=16 * 3600.0, annotations={QUEUE_KEY: "1", SINCE_KEY: value})
    late = job("late", 0, req=3, attained=16 * 3600.0, annotations={QUEUE_KEY: "1", SINCE_KEY: "2000.0"})
    d = create("tiresias").decide(ClusterSnapshot(nodes=cluster(1), jobs=(late, early)), 4000)
    assert workers(d) == {"late": 0, "early": 3}  # early enters the queue at its submit time, 500: before late
    rr = job("a", 0, req=4, on={"n0": 4}, annotations={"rr_waiting_since_s": value})
    assert workers(create("round_robin", quantum_s=600).decide(
        ClusterSnapshot(nodes=cluster(1), jobs=(rr, job("b", 5, req=4))), 300)) == {"a": 4, "b": 0}


def test_tiresias_rejects_bad_thresholds() -> None:
    with pytest.raises(UnknownPolicy, match="ascending"):
        create("tiresias", queue_thresholds_gpu_s=(10.0, 5.0))


# ----------------------------------------------------------------------------- Optimus


def test_optimus_gives_gpus_by_largest_remaining_time_reduction() -> None:
    # Job a: linear speedup, lots of work; job b: no speedup beyond one worker.
    a = job("a", 0, req=1, max_w=8, tp={n: 100.0 * n for n in range(1, 9)}, remaining_samples=1e6)
    b = job("b", 1, req=1, max_w=8, tp={n: 100.0 for n in range(1, 9)}, remaining_samples=1e6)
    snap = ClusterSnapshot(nodes=cluster(), jobs=(a, b))
    d = create("optimus").decide(snap, 60)
    assert workers(d) == {"a": 7, "b": 1}
    # Gains are weighted by remaining work: a nearly finished job gets less.
    c = job("c", 0, req=1, max_w=4, tp={n: 100.0 * n for n in range(1, 5)}, remaining_samples=1e3)
    e = job("e", 1, req=1, max_w=4, tp={n: 100.0 * n for n in range(1, 5)}, remaining_samples=1e6)
    d2 = create("optimus").decide(ClusterSnapshot(nodes=cluster(1, 6), jobs=(c, e)), 60)
    assert workers(d2) == {"c": 2, "e": 4}


# ----------------------------------------------------------------------------- default


def test_speedup_fit_recovers_an_amdahl_curve_and_uses_the_prior_without_data() -> None:
    true = {n: 1000.0 / (1.0 / n + 0.02 * (n > 1) + 0.001 * (n - 1)) / 1000.0 for n in (1, 2, 4, 8)}
    model = fit_speedup(job("x", req=4, max_w=16, tp=true))
    for n in (2, 4, 8, 12):
        expected = 1.0 / (1.0 / n + 0.02 + 0.001 * (n - 1))
        assert model.speedup(n) == pytest.approx(expected, rel=0.03)
    prior = fit_speedup(job("y", req=4, max_w=16), prior_efficiency=0.7)
    assert prior.speedup(4) == pytest.approx(0.7 * 4, rel=1e-6)
    assert prior.speedup(1) == 1.0 and prior.speedup(0) == 0.0


def test_job_speedup_uses_the_measurement_where_there_is_one_and_the_model_elsewhere() -> None:
    # A bump the smooth model cannot have: 4 workers are measured barely faster than 3.
    measured = {1: 100.0, 2: 200.0, 3: 300.0, 4: 310.0}
    j = job("x", req=4, max_w=8, tp=measured)
    curve, model = job_speedup(j), fit_speedup(j)
    for n, tp in measured.items():
        assert curve.speedup(n) / curve.speedup(1) == pytest.approx(tp / 100.0, rel=1e-9)
    assert curve.speedup(4) < model.speedup(4) * 0.95  # the model smooths the bump away
    assert curve.speedup(6) == model.speedup(6) and curve.speedup(0) == 0.0
    # No measurement: the prior alone, as fit_speedup.
    fresh = job("y", req=4, max_w=8)
    assert job_speedup(fresh).speedup(4) == fit_speedup(fresh).speedup(4)


def test_default_starts_a_lone_job_at_its_request_on_one_node() -> None:
    snap = ClusterSnapshot(nodes=cluster(2), jobs=(job("a", 0, req=4, max_w=16),))
    d = create("default").decide(snap, 60)
    assert d["a"].outcome is Outcome.START
    assert d["a"].placement.workers == 4 and d["a"].placement.node_count == 1


def test_default_prefers_jobs_with_little_attained_service() -> None:
    curve = {n: 100.0 * n for n in range(1, 9)}
    long_running = job("long", 0, req=8, max_w=8, on={"n0": 8}, since=0, attained=400 * 3600.0, tp=curve)
    newcomer = job("new", 50_000, req=8, max_w=8, tp=curve)
    snap = ClusterSnapshot(nodes=cluster(1, 8), jobs=(long_running, newcomer))
    d = create("default").decide(snap, 50_040)
    assert workers(d) == {"long": 2, "new": 6}  # nobody starves, the newcomer gets most
    assert d["long"].outcome is Outcome.SCALE_DOWN and d["new"].outcome is Outcome.START
    # Without the least-attained-service weight both get the same share.
    flat = DefaultPolicy(priority_exponent=0.0).decide(snap, 50_040)
    assert workers(flat) == {"long": 4, "new": 4}


def test_default_hysteresis_keeps_a_recent_width() -> None:
    curve = {n: 100.0 * n for n in range(1, 5)}
    a = job("a", 0, req=4, max_w=4, on={"n0": 2}, since=1000, tp=curve)
    snap = ClusterSnapshot(nodes=cluster(1), jobs=(a,))
    policy = create("default")
    # 60 s after its last change, 2 -> 4 workers doubles its speed: worth a restart onto idle GPUs ...
    early = policy.decide(snap, 1060)
    assert early["a"].workers == 4 and early["a"].outcome is Outcome.SCALE_UP
    # ... but not when the required gain is higher: it keeps its width during the cooldown.
    strict = DefaultPolicy(cooling_grow_gain=10.0)
    assert strict.decide(snap, 1060)["a"].outcome is Outcome.KEEP
    assert strict.decide(snap, 1000 + 1300)["a"].workers == 4  # after the cooldown it grows


def test_default_job_that_restarts_anyway_takes_idle_gpus_during_its_cooldown() -> None:
    # j0 (cooling, 100 s after its start) must give one GPU back for j1; the GPU it frees stays idle
    # because j1's compact placement goes to n1. Growing back onto it is then free: j0 keeps its
    # width and its placement, so the decision restarts nobody but j1.
    linear = {n: 100.0 * n for n in range(1, 5)}
    j0 = job("j0", 0, req=4, max_w=4, on={"n0": 4}, since=900, tp=linear)
    j1 = job("j1", 1, req=4, max_w=4, attained=3600.0, tp=linear)
    j2 = job("j2", 2, req=1, max_w=2, on={"n1": 2}, since=900, tp={1: 100.0, 2: 200.0})
    snap = ClusterSnapshot(nodes=cluster(2), jobs=(j0, j1, j2), taken_at_s=1000.0)
    d = DefaultPolicy().decide(snap, 1000.0)
    assert d["j0"].outcome is Outcome.KEEP and d["j0"].workers == 4
    assert workers(d) == {"j0": 4, "j1": 2, "j2": 2}
    # Without it, the cooling job needs +60 % to grow back: it shrinks to 3 and a GPU stays idle.
    strict = DefaultPolicy(grow_when_moving=False).decide(snap, 1000.0)
    assert strict["j0"].outcome is Outcome.SCALE_DOWN and workers(strict) == {"j0": 3, "j1": 2, "j2": 2}


def test_default_drain_gives_widths_so_the_last_long_jobs_finish_together() -> None:
    linear = {n: 100.0 * n for n in range(1, 9)}
    long_ago = 200 * 3600.0  # both far past drain_attained_gpu_s: no short job is left
    a = job("a", 0, req=4, max_w=8, on={"n0": 4}, since=0, attained=long_ago, tp=linear,
            remaining_samples=3.0e6)
    b = job("b", 1, req=4, max_w=8, on={"n1": 4}, since=0, attained=long_ago, tp=linear,
            remaining_samples=1.0e6)
    snap = ClusterSnapshot(nodes=cluster(2), jobs=(a, b), taken_at_s=90_000.0)
    d = DefaultPolicy().decide(snap, 90_000.0)
    # 3e6 samples at 600/s and 1e6 at 200/s: both 5,000 s, instead of 7,500 s for a at 4 workers.
    assert workers(d) == {"a": 6, "b": 2}
    assert "drain" in d["a"].reason and d["b"].outcome is Outcome.SCALE_DOWN
    # Nearly balanced already (less than drain_gain to win): nobody restarts.
    even = ClusterSnapshot(nodes=snap.nodes, jobs=(a, Job(**{**_fields(b), "remaining_samples": 2.9e6})),
                          taken_at_s=90_000.0)
    kept = DefaultPolicy().decide(even, 90_000.0)
    assert all(x.outcome is Outcome.KEEP for x in kept)
    # Without the observable (or switched off) the policy is what it was without it.
    blind = ClusterSnapshot(nodes=snap.nodes, jobs=tuple(Job(**{**_fields(j), "remaining_samples": None})
                                                          for j in snap.jobs), taken_at_s=90_000.0)
    assert workers(DefaultPolicy().decide(blind, 90_000.0)) == workers(
        DefaultPolicy(use_remaining_work=False).decide(snap, 90_000.0)) == {"a": 4, "b": 4}


def _fields(j: Job) -> dict:
    return {f: getattr(j, f) for f in Job.__dataclass_fields__}


def test_default_remaining_work_lets_a_nearly_finished_job_go_first() -> None:
    curve = {n: 100.0 * n / (1 + 0.05 * (n - 1)) for n in range(1, 9)}
    near = job("near", 0, req=8, max_w=8, attained=3600.0, tp=curve, remaining_samples=2.0e4)
    far = job("far", 0, req=8, max_w=8, attained=3600.0, tp=curve, remaining_samples=2.0e7)
    snap = ClusterSnapshot(nodes=cluster(1, 8), jobs=(far, near), taken_at_s=5000.0)
    d = DefaultPolicy().decide(snap, 5000.0)
    assert d["near"].workers > d["far"].workers >= 1
    off = DefaultPolicy(use_remaining_work=False).decide(snap, 5000.0)
    assert workers(off) == {"near": 4, "far": 4}


def test_default_weights_by_remaining_work_alone_where_it_replaces_attained_service() -> None:
    # "old" has run 20 GPU-hours and is nearly done; "young" has just started, with 100x more left.
    curve = {n: 100.0 * n / (1 + 0.05 * (n - 1)) for n in range(1, 9)}
    old = job("old", 0, req=8, max_w=8, attained=20 * 3600.0, tp=curve, remaining_samples=2.0e5)
    young = job("young", 0, req=8, max_w=8, attained=0.0, tp=curve, remaining_samples=2.0e7)
    snap = ClusterSnapshot(nodes=cluster(1, 8), jobs=(old, young), taken_at_s=5000.0)
    factor = {"hesrpt_speedup_exponent": 0.0}  # the work-left factor of step 6, not heSRPT's rank (step 7)
    both = DefaultPolicy(**factor).decide(snap, 5000.0)  # attained service outweighs the capped work left
    assert both["young"].workers > both["old"].workers >= 1
    srpt = DefaultPolicy(remaining_replaces_attained=True, remaining_cap_gpu_s=math.inf, **factor).decide(snap, 5000.0)
    assert srpt["old"].workers > srpt["young"].workers >= 1
    # The class defaults weight by heSRPT's rank by work left: attained service does not count.
    ranked = DefaultPolicy().decide(snap, 5000.0)
    assert ranked["old"].workers > ranked["young"].workers >= 1
    # A job that reports no work left is still weighted by its attained service.
    blind = ClusterSnapshot(nodes=snap.nodes, jobs=tuple(Job(**{**_fields(j), "remaining_samples": None})
                                                          for j in snap.jobs), taken_at_s=5000.0)
    unknown = DefaultPolicy(remaining_replaces_attained=True, **factor).decide(blind, 5000.0)
    assert workers(unknown) == workers(DefaultPolicy(use_remaining_work=False).decide(snap, 5000.0))
    assert workers(DefaultPolicy().decide(blind, 5000.0)) == workers(unknown)
    assert unknown["young"].workers > unknown["old"].workers


def test_default_hesrpt_weights_split_the_cluster_as_hesrpt_does() -> None:
    # Two jobs with speedup k^0.5 (measured at every width), linear utility (fairness 0): heSRPT
    # with p = 0.5 gives the job with less work left 1 − (1/2)^2 = 3/4 of the cluster
    # (Berg et al., arXiv:1903.09346), here 12 of 16 GPUs, whatever the sizes of the work left.
    curve = {n: 100.0 * n ** 0.5 for n in range(1, 17)}
    small = job("small", 0, req=16, max_w=16, tp=curve, remaining_samples=1.0e5)
    large = job("large", 0, req=16, max_w=16, tp=curve, remaining_samples=3.0e5)
    snap = ClusterSnapshot(nodes=cluster(4, 4), jobs=(large, small), taken_at_s=5000.0)
    policy = DefaultPolicy(hesrpt_speedup_exponent=0.5, fairness=0.0)
    assert workers(policy.decide(snap, 5000.0)) == {"small": 12, "large": 4}
    # Only the order of the work left counts: 1,000x more left for the large job changes nothing.
    far = ClusterSnapshot(nodes=snap.nodes, jobs=(Job(**{**_fields(large), "remaining_samples": 3.0e8}), small),
                          taken_at_s=5000.0)
    assert workers(policy.decide(far, 5000.0)) == {"small": 12, "large": 4}
    # Off (p = 0), the remaining-work factor weights them: a different split.
    assert workers(DefaultPolicy(fairness=0.0, hesrpt_speedup_exponent=0.0).decide(snap, 5000.0)) != {
        "small": 12, "large": 4}


def test_default_hesrpt_rank_weights_follow_the_closed_form() -> None:
    p = 0.7
    policy = DefaultPolicy(hesrpt_speedup_exponent=p)
    left = {"a": 50.0, "b": 10.0, "c": 30.0}  # ranks by work left: a 1, c 2, b 3
    weight = {name: 2.0 for name in left}
    policy._rank_weights(left, weight)
    q, m = 1 / (1 - p), 3
    theta = {name: (i / m) ** q - ((i - 1) / m) ** q for i, name in enumerate(("a", "c", "b"), start=1)}
    assert sum(theta.values()) == pytest.approx(1.0)
    assert weight == pytest.approx({name: 2.0 * (m * theta[name]) ** (1 - p) for name in left})
    assert weight["b"] > weight["c"] > weight["a"]
    with pytest.raises(ValueError, match="hesrpt_speedup_exponent"):
        DefaultPolicy(hesrpt_speedup_exponent=1.0)


def test_default_validates_its_parameters() -> None:
    with pytest.raises(UnknownPolicy, match="prior_efficiency must be in"):
        create("default", prior_efficiency=1.5)
    with pytest.raises(UnknownPolicy, match="tolerance must be >= 0"):
        create("default", tolerance=-1)
    with pytest.raises(UnknownPolicy, match="drain_gain must be >= 0"):
        create("default", drain_gain=-0.1)
    with pytest.raises(UnknownPolicy, match="remaining_base_gpu_s must be > 0"):
        create("default", remaining_base_gpu_s=0)


# ----------------------------------------------------------------------------- every policy


def random_snapshot(seed: int, gpus_per_worker: int = 1) -> ClusterSnapshot:
    rng = random.Random(seed)
    nodes = tuple(Node(name=f"n{i}", gpus=rng.choice((4, 4, 8)), gpus_unavailable=rng.choice((0, 0, 1)))
                  for i in range(6))
    snap0 = ClusterSnapshot(nodes=nodes, jobs=())
    from gpu_scheduler.policies.placement import FreeGpus

    ledger = FreeGpus(snap0)
    jobs = []
    for i in range(25):
        req = rng.choice((1, 1, 2, 3, 4, 6, 8))
        placement = ledger.place(req, gpus_per_worker) if rng.random() < 0.5 else None
        tp = {n: 10.0 * n / (1 + 0.05 * (n - 1)) for n in range(1, 2 * req + 1)}
        jobs.append(Job(
            name=f"j{i}", submit_time_s=float(i * 30), requested_workers=req, max_workers=2 * req,
            gpus_per_worker=gpus_per_worker, placement=placement or Placement(),
            attained_service_gpu_s=rng.uniform(0, 1e5), throughput=tp, restarts=rng.randint(0, 2),
            first_start_s=0.0 if placement else None, placement_since_s=rng.uniform(0, 800) if placement else None,
            remaining_samples=rng.uniform(1e3, 1e6)))
    return ClusterSnapshot(nodes=nodes, jobs=tuple(jobs), taken_at_s=1000.0)


@pytest.mark.parametrize("name", ["fifo", "fifo_backfill", "elastic_fifo", "round_robin", "tiresias", "optimus",
                                  "default"])
@pytest.mark.parametrize("gpw", [1, 2])
def test_every_policy_returns_a_valid_decision(name: str, gpw: int) -> None:
    for seed in range(15):
        snap = random_snapshot(seed, gpw)
        d = create(name).decide(snap, 1000.0)
        d.validate(snap)  # capacity, bounds, outcomes, one target per job
        assert d.policy == name and d.made_at_s == 1000.0
        # Pure: the same input gives the same decision.
        assert create(name).decide(snap, 1000.0).placements() == d.placements()


def test_default_keeps_no_job_above_a_lowered_max_workers() -> None:
    """Review 2026-11-30: a job running 4 workers (2 + 2 over two nodes) whose max_workers was lowered
    to 3 was kept at 4 by the hysteresis; its move then failed Decision.validate ("outside [1, 3]")
    on every tick, so the controller changed nothing for any job until that job ended."""
    snap = ClusterSnapshot(nodes=cluster(), jobs=(
        job("a", 0, req=3, max_w=3, on={"n0": 2, "n1": 2}, since=0),
    ))
    decision = DefaultPolicy().decide(snap, 600)
    decision.validate(snap)
    assert 1 <= workers(decision)["a"] <= 3


def test_elastic_fifo_does_not_idle_the_cluster_behind_a_job_that_can_never_fit() -> None:
    """Review 2026-11-30: a job whose minimum (8 GPUs) exceeds the cluster (4) blocked the queue for
    good: the running job behind it was preempted and every GPU stayed idle."""
    snap = ClusterSnapshot(nodes=cluster(1, 4), jobs=(
        job("huge", 0, req=8, min_workers=8),
        job("b", 10, req=2, on={"n0": 2}, since=0),
        job("c", 20, req=4),
    ))
    d = create("elastic_fifo").decide(snap, 60)
    d.validate(snap)
    assert workers(d) == {"huge": 0, "b": 2, "c": 2}  # b keeps its request, c gets the rest


@pytest.mark.parametrize("name", ["elastic_fifo", "tiresias", "optimus", "default"])
def test_a_job_kept_on_a_cordoned_node_does_not_use_up_the_schedulable_nodes_gpus(name: str) -> None:
    """Review 2026-11-30 (left alone then): policies budgeted with the schedulable nodes' GPUs alone
    while a job kept on a cordoned node counted against them; the queued job then got 1 of n1's 4
    GPUs (elastic_fifo), or none (tiresias), and the rest stood idle."""
    tp = {n: 100.0 * n for n in range(1, 5)}
    nodes = (Node(name="n0", gpus=4, schedulable=False), Node(name="n1", gpus=4))
    a = job("a", 0, req=4, on={"n0": 4}, since=0, tp=tp, remaining_samples=1e6)
    b = job("b", 10, req=4, tp=tp, remaining_samples=1e6)
    snap = ClusterSnapshot(nodes=nodes, jobs=(a, b))
    assert snap.total_gpus == 4 and snap.budget_gpus == 8
    d = create(name).decide(snap, 600)
    d.validate(snap)
    assert d["a"].placement == a.placement  # kept: nothing may move onto the cordoned node, nothing must
    assert d["b"].placement == Placement.of({"n1": 4})
