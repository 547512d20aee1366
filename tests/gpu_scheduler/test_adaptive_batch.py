"""Adaptive batch size in the simulator (``SimConfig.adaptive_batch``, an experiment): the goodput
choice, progress accounting across a batch change, what the policy is shown, and that the flag
off leaves every result as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_scheduler.model import Placement
from gpu_scheduler.policies import create
from gpu_scheduler.simulator import simulate_file
from gpu_scheduler.simulator.data import find_pollux_dir
from gpu_scheduler.simulator.engine import SimConfig, SimulationError, Simulator, _SimJob
from gpu_scheduler.simulator.jobmodel import Application, JobModelError, load_applications
from gpu_scheduler.simulator.stepfit import (
    EXPLORE_FACTOR,
    PREDICTED_WIDTH_MULTIPLES,
    LinearStepTime,
    StepTimeObservations,
    fit_linear_step_time,
)
from gpu_scheduler.simulator.workload import WorkloadJob
from tests.gpu_scheduler.test_simulator import TOY, write_toy_traces

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy_apps(tmp_path: Path):
    return load_applications(write_toy_traces(tmp_path / "traces"), settings=TOY)


@pytest.fixture(scope="module")
def pollux_apps():
    return load_applications(find_pollux_dir() / "traces")


def test_goodput_choice_picks_a_larger_batch_on_more_gpus(pollux_apps) -> None:
    app = pollux_apps["imagenet"]
    epoch = 45
    chosen = {pn: app.best_step_config(pn, epoch) for pn in ((1,), (4,), (4, 4), (4, 4, 4, 4))}
    sizes = [cfg.batch_size for cfg in chosen.values()]
    assert sizes == sorted(sizes) and sizes[0] == app.init_batch_size and sizes[-1] > 4 * sizes[0]
    for pn, cfg in chosen.items():
        best = app.goodput(pn, cfg, epoch)
        # Nothing on the grid or at a measured batch size is better.
        for b in app.batch_candidates(sum(pn)):
            other = app.step_config(b, sum(pn))
            if app.min_local_bsz <= other.atomic_bsz <= app.max_local_bsz and other.batch_size >= app.init_batch_size:
                assert app.goodput(pn, other, epoch) <= best * (1 + 1e-9)
    # On 16 GPUs the chosen batch beats the workloads' fixed 3,200 by goodput.
    fixed = app.step_config(3200, 16)
    assert app.goodput((4, 4, 4, 4), chosen[(4, 4, 4, 4)], epoch) > app.goodput((4, 4, 4, 4), fixed, epoch)
    # Early in training a small batch is best even on many GPUs (low gradient noise scale).
    assert app.best_step_config((4, 4, 4, 4), 0).batch_size < chosen[(4, 4, 4, 4)].batch_size


def test_candidates_respect_the_per_gpu_minimum_and_no_fit_is_an_error(toy_apps) -> None:
    app = toy_apps["toy"]  # batches 32..64, per-GPU batch 8..32
    assert app.batch_candidates(1)[0] == 32 and app.batch_candidates(1)[-1] == 64
    assert app.batch_candidates(8) == (64,)  # 8 GPUs × 8 samples at least
    assert app.batch_candidates(9) == ()
    with pytest.raises(JobModelError, match="no batch size in \\[32, 64\\] fits 9 GPUs"):
        app.best_step_config((4, 4, 1), 0)


def test_progress_is_accounted_across_a_batch_change(toy_apps) -> None:
    app = toy_apps["toy"]
    spec = WorkloadJob(name="a", submit_time_s=0.0, application="toy", requested_workers=1, batch_size=64)
    job = _SimJob(spec, app, cluster_gpus=16, adaptive_batch=True, gpus_per_node=4)
    assert job.max_workers == 8  # max batch 64 / per-GPU minimum 8, not the workload's batch alone
    job.reallocate(Placement.of({"node-0": 1}), 0.0, 30)
    # One GPU: batch 32 (0.32 s per step, gain 1) beats 64 (two passes, 0.64 s, gain 1.5).
    assert job.cfg.batch_size == 32
    rate_one = app.goodput((1,), job.cfg, 0)
    assert rate_one == pytest.approx(1 / 0.32)
    job.advance(0.0, 60.0)  # 30 s restart, 30 s training
    assert job.progress == pytest.approx(30 * rate_one) and job.epoch == 0
    # Goodput in samples/s at the initial batch, as the trainer exports it: one local batch timed at
    # this width, so the choice's constant model (the same step time up to 2x the batch) rates it:
    # batch 64 in 0.32 s, gain 1.5.
    assert job.throughput[1] == pytest.approx(1.5 / 0.32 * 32)
    assert job.remaining_samples() == pytest.approx((300 - 30 * rate_one) * 32)

    job.reallocate(Placement.of({"node-0": 4, "node-1": 4}), 60.0, 30)
    # Eight GPUs need at least 8 samples each: batch 64, one pass of 8 per GPU, 0.08 + 0.02 s.
    assert job.cfg.batch_size == 64
    rate_eight = app.goodput((4, 4), job.cfg, 0)
    assert rate_eight == pytest.approx(1.5 / 0.10)
    before = job.progress
    job.advance(60.0, 40.0)  # 30 s restart, 10 s at the new rate; crosses epoch ends (whole seconds)
    assert job.progress == pytest.approx(before + 10 * rate_eight, abs=rate_eight * 1.0)
    assert job.epoch == 2
    assert job.record.batch_sizes == [(0.0, 32), (60.0, 64)]
    assert job.remaining_samples() == pytest.approx((300 - job.progress) * 32)  # same unit as throughput
    assert job.throughput[8] >= rate_eight * 32 - 1e-9  # at least what it runs at now


def test_the_batch_is_retuned_at_epoch_ends_without_a_restart(pollux_apps) -> None:
    spec = WorkloadJob(name="c", submit_time_s=0.0, application="cifar10", requested_workers=4, batch_size=2048)
    fixed = Simulator([spec], pollux_apps, create("fifo"), SimConfig(nodes=1)).run().jobs[0]
    result = Simulator([spec], pollux_apps, create("fifo"), SimConfig(nodes=1, adaptive_batch=True)).run()
    rec = result.jobs[0]
    assert rec.restarts == 0 and len(rec.allocations) == 1
    sizes = [b for _, b in rec.batch_sizes]
    assert len(sizes) >= 3 and sizes[0] < 2048 and max(sizes) > sizes[0]
    # Choosing the batch of largest goodput every epoch beats the fixed tuned batch.
    assert rec.jct_s < fixed.jct_s
    assert fixed.batch_sizes == []


def test_ncf_keeps_its_batch_and_the_policy_sees_goodput(pollux_apps) -> None:
    jobs = [WorkloadJob(name="n", submit_time_s=0.0, application="ncf", requested_workers=1, batch_size=32768),
            WorkloadJob(name="y", submit_time_s=0.0, application="yolov3", requested_workers=4, batch_size=64)]
    seen = []

    class Recording:
        name, uses_oracle = "fifo", False

        def __init__(self) -> None:
            self.inner = create("fifo")

        def decide(self, snapshot, now_s):
            seen.append(snapshot)
            return self.inner.decide(snapshot, now_s)

    result = Simulator(jobs, pollux_apps, Recording(), SimConfig(nodes=2, adaptive_batch=True)).run()
    ncf, yolo = result.jobs
    assert ncf.batch_sizes == [] and yolo.batch_sizes
    views = {j.name: j for j in seen[1].jobs}
    assert views["n"].global_batch_size == 32768 and views["y"].global_batch_size is None
    assert views["y"].max_workers == 8  # two nodes; the max batch 512 alone would allow 128


@pytest.mark.parametrize("policy", ["default", "tiresias"])
def test_flag_off_reproduces_the_committed_report(policy) -> None:
    """With ``adaptive_batch`` off (the default) the simulator gives the committed report's numbers
    (its side-by-side run: the report's restart cost and parameters, no jitter)."""
    from gpu_scheduler.simulator.report import report_params

    committed = json.loads((REPO / "docs" / "scheduler-report.json").read_text())
    restart = committed["restart_cost_s"]
    want = next(r["summary"] for r in committed["runs"]
                if r["policy"] == policy and r["load"] == "1.0" and r["workload"] == 6
                and r.get("job_model", "fixed") == "fixed" and r["restart_cost_s"] == restart and r["seed"] is None)
    path, params = find_pollux_dir() / "workloads" / "workload-6.csv", report_params(policy, restart)
    got = simulate_file(path, policy, params=params, config=SimConfig(restart_cost_s=restart))["summary"]
    for metric in ("avg_jct_s", "p99_jct_s", "makespan_s", "restarts_per_job", "gpu_allocation"):
        assert got[metric] == pytest.approx(want[metric], rel=1e-9), metric
    on = simulate_file(path, policy, params=params, config=SimConfig(adaptive_batch=True, restart_cost_s=restart))
    assert on["summary"]["avg_jct_s"] != got["avg_jct_s"]


# ------------------------------------------------------------------ fitted step times (default)

def test_fit_recovers_a_linear_truth_and_handles_degenerate_points() -> None:
    truth = LinearStepTime(0.05, 0.002, 0.0)
    fit = fit_linear_step_time({b: (n, n * truth.step_time_s(b)) for b, n in ((8, 10), (16, 3), (64, 1))})
    assert fit is not None
    assert fit.alpha_s == pytest.approx(0.05) and fit.beta_s_per_sample == pytest.approx(0.002)
    assert fit.max_observed_local_batch == 64 and fit.max_trusted_local_batch == EXPLORE_FACTOR * 64
    # One local batch: proportional; slower at larger batches: constant at the weighted mean.
    one = fit_linear_step_time({32: (4, 4 * 0.64)})
    assert (one.alpha_s, one.beta_s_per_sample) == (0.0, pytest.approx(0.02))
    flat = fit_linear_step_time({8: (1, 1.0), 16: (3, 3 * 0.6)})
    assert (flat.alpha_s, flat.beta_s_per_sample) == (pytest.approx(0.7), 0.0)
    # A negative intercept: the least-squares proportional model.
    prop = fit_linear_step_time({10: (1, 0.5), 20: (1, 1.5)})
    assert prop.alpha_s == 0.0 and prop.beta_s_per_sample == pytest.approx((5 + 30) / (100 + 400))
    assert fit_linear_step_time({}) is None and fit_linear_step_time({8: (0, 0.0)}) is None


def test_observations_borrow_the_nearest_width_and_explore_from_one_point() -> None:
    obs = StepTimeObservations()
    assert obs.choice_model(4) is None
    obs.add(4, 50, 10, 10 * 0.4)
    v = obs.version
    obs.add(4, 50, 5, 5 * 0.4)  # same mean: no new version
    assert obs.version == v
    # One local batch: the choice assumes a constant step time up to 2x.
    m = obs.choice_model(4)
    assert (m.alpha_s, m.beta_s_per_sample, m.max_observed_local_batch) == (pytest.approx(0.4), 0.0, 50)
    obs.add(1, 100, 2, 2 * 0.5)
    obs.add(1, 200, 2, 2 * 0.9)
    assert obs.nearest_width(2) == 1  # |log 2| ties between 1 and 4: the smaller
    assert obs.nearest_width(16) == 4
    borrowed = obs.choice_model(2)
    assert borrowed.alpha_s == pytest.approx(0.1) and borrowed.beta_s_per_sample == pytest.approx(0.004)


def test_fitted_choice_never_exceeds_twice_the_largest_observed_local_batch(pollux_apps) -> None:
    app = pollux_apps["imagenet"]
    epoch = 45
    oracle = app.best_step_config((4,), epoch)
    assert oracle.batch_size / 4 > 2 * 50  # the truth would go further than the trust region
    obs = StepTimeObservations()
    cfg50 = app.step_config(200, 4)
    assert cfg50.batch_size == 200
    obs.add(4, 50, 100, 100 * app.optimizer_step_time((4,), cfg50))
    for per_node in ((4,), (4, 4), (4, 4, 4, 4), (2,)):
        cfg, predicted = app.best_fitted_step_config(per_node, epoch, obs.choice_model(sum(per_node)))
        assert cfg.batch_size / sum(per_node) <= 2 * 50 and predicted > 0
    # On its own width the constant model explores exactly to the bound.
    assert app.best_fitted_step_config((4,), epoch, obs.choice_model(4))[0].batch_size == 400


def test_fitted_job_learns_the_toy_step_time_and_stays_in_its_trust_region(toy_apps) -> None:
    app = toy_apps["toy"]  # step time on one node: 0.005 s + 0.01 s per local sample
    spec = WorkloadJob(name="a", submit_time_s=0.0, application="toy", requested_workers=4, batch_size=32)
    job = _SimJob(spec, app, cluster_gpus=16, adaptive_batch=True, adaptive_throughput="fitted", gpus_per_node=4)
    job.reallocate(Placement.of({"node-0": 4}), 0.0, 30)
    assert job.cfg.batch_size == 32  # nothing observed yet: the smallest batch
    job.advance(0.0, 39.0)  # 30 s restart; epoch 1 ends after 8 s at local 8; re-pick; 1 s more
    assert job.epoch == 1 and job.cfg.batch_size == 64  # local 16 = 2x the one observed local batch
    steps, seconds = job.observations.by_width[4][8.0]
    assert seconds == 8.0 and steps == pytest.approx(8.0 / 0.085)
    assert job.observations.by_width[4][16.0] == [pytest.approx(1.0 / 0.165), 1.0]
    job.advance(39.0, 15.0)  # epoch 2 ends at batch 64 (0.165 s per step, gain 1.5); re-pick
    assert job.epoch == 2
    fit = job.observations.model(4)
    assert fit.alpha_s == pytest.approx(0.005) and fit.beta_s_per_sample == pytest.approx(0.01)
    # With the slope learnt, batch 32 (1 / 0.085 per s) beats 64 (1.5 / 0.165 per s) again.
    assert job.cfg.batch_size == 32
    # The reported curve is the fitted goodput in samples/s at the initial batch.
    assert job.throughput[4] == pytest.approx(app.goodput((4,), job.cfg, job.epoch) * 32)
    # ... and, as the trainer exports it, a prediction at 2x and 3x the widest width run: a compact
    # placement (4 GPUs per node) rated with width 4's model; 12 is past the job's limit (the toy's
    # max batch over its smallest local batch: 8 workers), so it is left out.
    assert job.max_workers == 8 and sorted(job.throughput) == [4, 8]
    rate = app.best_fitted_step_config((4, 4), job.epoch, job.observations.choice_model(8))[1]
    assert job.throughput[8] == pytest.approx(rate * 32) and job.throughput[8] > job.throughput[4]


def test_the_simulated_job_mirrors_the_trainers_constants() -> None:
    from components.training import goodput as trainer

    assert trainer.EXPLORE_FACTOR == EXPLORE_FACTOR
    assert trainer.PREDICTED_WIDTH_MULTIPLES == PREDICTED_WIDTH_MULTIPLES


def test_fitted_simulation_respects_the_trust_region(pollux_apps, monkeypatch) -> None:
    calls = []
    real = Application.best_fitted_step_config

    def spy(self, per_node, epoch, model, **kw):
        cfg, value = real(self, per_node, epoch, model, **kw)
        calls.append((sum(per_node), cfg, model, self.valid_step_configs(per_node)[0]))
        return cfg, value

    monkeypatch.setattr(Application, "best_fitted_step_config", spy)
    spec = WorkloadJob(name="c", submit_time_s=0.0, application="cifar10", requested_workers=4, batch_size=2048)
    rec = Simulator([spec], pollux_apps, create("fifo"), SimConfig(nodes=1, adaptive_batch=True)).run().jobs[0]
    chosen = [(w, cfg, model, first) for w, cfg, model, first in calls if model is not None]
    assert len(chosen) >= 3 and max(b for _, b in rec.batch_sizes) > rec.batch_sizes[0][1]
    for w, cfg, model, first in chosen:
        assert cfg.batch_size / w <= model.max_trusted_local_batch * (1 + 1e-9) or cfg == first


def test_oracle_throughput_reproduces_the_previous_adaptive_figures() -> None:
    """``adaptive_throughput="oracle"`` is the adaptive job model before fitted step times
    (docs/scheduler-report.json as of 2026-11-22: default, workload 6, 1.0x; the policy as it was
    then, without heSRPT weights)."""
    path = find_pollux_dir() / "workloads" / "workload-6.csv"
    got = simulate_file(path, "default", params={"hesrpt_speedup_exponent": 0.0},
                        config=SimConfig(adaptive_batch=True, adaptive_throughput="oracle"))
    s = got["summary"]
    assert s["avg_jct_s"] == pytest.approx(2393.85, rel=1e-9)
    assert s["makespan_s"] == pytest.approx(57715.0, rel=1e-9)
    assert s["restarts_per_job"] == pytest.approx(1.80625, rel=1e-9)
    assert got["cluster"]["adaptive_throughput"] == "oracle"
    assert SimConfig(adaptive_batch=True).adaptive_throughput == "fitted"
    with pytest.raises(SimulationError, match="--adaptive-throughput must be one of fitted, oracle"):
        SimConfig(adaptive_throughput="truth")


def test_a_width_timed_at_one_local_batch_borrows_the_slope_of_a_richer_width() -> None:
    """As the trainer's ``ThroughputObservations.choice_model``: width 2 fitted at 0.1 s + 1 ms per
    sample; width 4, timed at one local batch (0.2 s at 16), keeps its time and takes that slope,
    trusted up to 2x the largest local batch seen at width 2."""
    from gpu_scheduler.simulator.stepfit import StepTimeObservations

    obs = StepTimeObservations()
    obs.add(4, 16.0, 10, 10 * 0.2)
    lone = obs.choice_model(4)
    assert (lone.alpha_s, lone.beta_s_per_sample) == (pytest.approx(0.2), 0.0)  # no slope known: constant
    obs.add(2, 16.0, 5, 5 * 0.116)
    obs.add(2, 32.0, 5, 5 * 0.132)
    m = obs.choice_model(4)
    assert (m.alpha_s, m.beta_s_per_sample, m.max_observed_local_batch) == (
        pytest.approx(0.184), pytest.approx(0.001), 32.0)
    assert m.max_trusted_local_batch == 64.0
