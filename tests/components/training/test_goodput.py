"""Adaptive batch, pure parts: noise-scale estimator on synthetic gradients of known mean and noise,
statistical efficiency, step-time fit, batch choice, progress-driven LR, state round trip, the flag."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from components.training import config as c
from components.training import goodput as gp
from trainflow.common.training_spec import ConfigError, TrainConfig


def _synthetic_step(g: torch.Generator, mean: torch.Tensor, sigma: float, world: int, local: int):
    """Per-sample gradients ``mean + sigma * N(0, I)``: |G|^2 = |mean|^2, tr(Sigma) = d * sigma^2."""
    per_sample = mean + sigma * torch.randn(world, local, mean.numel(), generator=g, dtype=torch.float64)
    local_means = per_sample.mean(1)  # (W, d): each rank's gradient before the all-reduce
    global_mean = local_means.mean(0)  # after it
    return float(local_means.pow(2).sum(1).mean()), float(global_mean.pow(2).sum())


@pytest.mark.parametrize(("world", "local"), [(2, 16), (4, 8)])
def test_noise_scale_estimate_matches_known_gradient_statistics(world, local) -> None:
    g = torch.Generator().manual_seed(0)
    d, sigma = 200, 0.5
    mean = torch.full((d,), 0.1, dtype=torch.float64)  # |G|^2 = 2.0; tr(Sigma) = 50.0; phi = 25 samples
    ema = gp.NoiseScaleEMA(decay=0.999)
    g2s, traces = [], []
    for _ in range(3000):
        local_sq, global_sq = _synthetic_step(g, mean, sigma, world, local)
        est = gp.gns_sample(local_sq, 1.0 / local, global_sq, float(world * local))
        assert est is not None
        g2s.append(est[0])
        traces.append(est[1])
        ema.update(*est)
    assert sum(g2s) / len(g2s) == pytest.approx(2.0, rel=0.03)  # unbiased
    assert sum(traces) / len(traces) == pytest.approx(50.0, rel=0.03)
    assert ema.phi == pytest.approx(25.0, rel=0.15)


def test_noise_scale_needs_two_batch_sizes_and_keeps_last_value() -> None:
    assert gp.gns_sample(1.0, 1 / 32, 1.0, 32.0) is None  # one rank: local batch == global batch
    ema = gp.NoiseScaleEMA()
    assert ema.phi is None
    ema.update(2.0, 50.0)
    assert ema.phi == pytest.approx(25.0)
    ema.update(-100.0, 50.0)  # |G|^2 average now negative: undefined, the last value stays
    assert ema.phi == pytest.approx(25.0)
    ema2 = gp.NoiseScaleEMA()
    ema2.update(1.0, -3.0)
    assert ema2.phi == 0.0  # no measurable noise


def test_efficiency_and_adascale_gain_values() -> None:
    assert gp.efficiency(32, 100.0, 32) == 1.0
    assert gp.efficiency(64, 100.0, 32) == pytest.approx(132 / 164)
    assert gp.efficiency(64, None, 32) == pytest.approx(0.5)  # unknown phi counts as 0 above B0 ...
    assert gp.efficiency(1, None, 32) == 1.0  # ... and as 1 below: a short last batch counts its samples
    assert gp.adascale_gain(64, 100.0, 32) == pytest.approx(2 * 132 / 164)
    assert gp.adascale_gain(256, 1e9, 32) == pytest.approx(8.0, rel=1e-6)  # pure noise: linear scaling
    assert gp.adascale_gain(256, 0.0, 32) == pytest.approx(1.0)  # no noise: no gain from a larger batch


def test_step_time_fit() -> None:
    exact = gp.fit_step_time({8.0: (3, 3 * (0.1 + 0.01 * 8)), 32.0: (2, 2 * (0.1 + 0.01 * 32))})
    assert (exact.alpha_s, exact.beta_s_per_sample) == (pytest.approx(0.1), pytest.approx(0.01))
    assert exact.max_observed_local_batch == 32.0
    one = gp.fit_step_time({16.0: (4, 2.0)})
    assert (one.alpha_s, one.beta_s_per_sample) == (0.0, pytest.approx(0.5 / 16))
    flat = gp.fit_step_time({8.0: (1, 0.30), 16.0: (1, 0.20)})  # noise: slower at the smaller batch
    assert (flat.alpha_s, flat.beta_s_per_sample) == (pytest.approx(0.25), 0.0)
    assert gp.fit_step_time({}) is None


def test_candidates_and_best_batch() -> None:
    assert gp.candidate_batches(3, base_batch=32, max_global_batch=45, max_local_batch=None) == [33, 36, 39, 42, 45]
    assert gp.candidate_batches(2, base_batch=32, max_global_batch=256, max_local_batch=20) == list(range(32, 41, 2))
    # B0 does not fit 4 ranks x 4 samples: memory wins, the one batch that fits (below B0).
    assert gp.candidate_batches(4, base_batch=32, max_global_batch=256, max_local_batch=4) == [16]
    # Review 2026-11-30: max_global_batch = B0 = 100 on 3 ranks has no multiple of 3 in range; memory
    # is not the bound (34 x 3 >= 100), so B0 itself runs (local 34/33/33), never 64 x 3 = 192 > 100.
    assert gp.candidate_batches(3, base_batch=100, max_global_batch=100, max_local_batch=64) == []
    assert gp.choose_batch(gp.ThroughputObservations(), 3, None, base_batch=100, max_global_batch=100,
                           max_local_batch=64) == 100
    assert gp.candidate_batches(3, base_batch=100, max_global_batch=100, max_local_batch=33) == [99]
    overhead = gp.StepTimeModel(alpha_s=1.0, beta_s_per_sample=0.001, max_observed_local_batch=128)
    kw = {"base_batch": 32, "max_global_batch": 256, "max_local_batch": None}
    assert gp.best_batch(2, overhead, 1e4, **kw)[0] == 256  # noisy gradients + fixed overhead: largest
    assert gp.best_batch(2, overhead, 0.0, **kw)[0] == 32  # no noise: no statistical gain
    b, g = gp.best_batch(2, overhead, 10.0, **kw)
    assert g == pytest.approx(max(gp.goodput(x, 2, overhead, 10.0, 32) for x in range(32, 257, 2)))
    assert b == 142  # interior optimum near sqrt(alpha * phi * W / beta) = 141
    capped = gp.StepTimeModel(alpha_s=1.0, beta_s_per_sample=0.001, max_observed_local_batch=16)
    assert gp.best_batch(2, capped, 1e4, **kw)[0] == 64  # never beyond 2x the observed local batch
    assert gp.best_batch(4, overhead, 1e4, base_batch=32, max_global_batch=256, max_local_batch=4)[0] == 16
    small = gp.StepTimeModel(alpha_s=1.0, beta_s_per_sample=0.001, max_observed_local_batch=2)  # cap 4 < 8
    assert gp.best_batch(2, small, 1e4, base_batch=16, max_global_batch=64, max_local_batch=None)[0] == 16


def test_choose_batch_explores_then_follows_the_fit() -> None:
    kw = {"base_batch": 32, "max_global_batch": 256, "max_local_batch": None}
    obs = gp.ThroughputObservations()
    assert gp.choose_batch(obs, 2, 500.0, **kw) == 32  # no timings: B0
    assert gp.choose_batch(obs, 3, 500.0, **kw) == 33  # ... rounded up to a multiple of the width
    obs.add(2, 16, 0.1)
    assert gp.choose_batch(obs, 2, 500.0, **kw) == 64  # one local batch seen: try 2x
    assert gp.choose_batch(obs, 2, None, **kw) == 32  # unknown phi: stay
    obs.add(2, 32, 0.2)  # purely proportional: a larger batch only costs
    assert gp.choose_batch(obs, 2, 500.0, **kw) == 32
    obs.add(4, 16, 0.05)
    # Width 4, timed at one local batch, takes width 2's slope (0.2 / 32 s per sample, no overhead):
    # proportional, so a larger batch only costs there too; unseen width 8 borrows width 4's model.
    assert obs.choice_model(4) == gp.StepTimeModel(0.0, 0.2 / 32, 32.0)
    assert gp.choose_batch(obs, 8, 500.0, **kw) == 32

    # A fixed overhead per step makes larger batches pay: width 2 is fitted at 0.1 s + 1 ms per
    # sample; width 4's single point (0.2 s at 16) keeps its own time and borrows that slope.
    obs = gp.ThroughputObservations()
    obs.add(2, 16, 0.116)
    obs.add(2, 32, 0.132)
    obs.add(4, 16, 0.2)
    m4 = obs.choice_model(4)
    assert (m4.alpha_s, m4.beta_s_per_sample, m4.max_observed_local_batch) == (
        pytest.approx(0.184), pytest.approx(0.001), 32.0)
    assert gp.choose_batch(obs, 4, 500.0, **kw) == 256  # 2 x 32 local batch on 4 ranks (the trust region)
    assert gp.choose_batch(obs, 8, 500.0, **kw) == 256  # unseen width 8 borrows width 4's model


def test_adaptive_state_progress_goodput_and_round_trip() -> None:
    a = gp.AdaptiveBatch(base_batch=32, max_global_batch=256, max_local_batch=None, target_samples=100.0)
    assert a.batch_size == 32 and a.remaining_samples == 100.0 and not a.done
    a.gns.update(2.0, 200.0)  # phi = 100
    assert a.advance(64) == pytest.approx(64 * 132 / 164)
    assert a.remaining_samples == pytest.approx(100 - 64 * 132 / 164) and not a.done
    a.advance(64)
    assert a.done and a.remaining_samples == 0.0
    a.observations.add(2, 16, 0.2)
    a.observations.add(2, 32, 0.3)
    a.observations.add(1, 32, 0.25)
    rates = a.goodput_by_world()
    assert gp.PREDICTED_WIDTH_MULTIPLES == (2, 3)
    assert list(rates) == [1, 2, 4, 6]  # the widths run, then 2x and 3x the widest (predicted)
    model2 = gp.StepTimeModel(0.1, 0.2 / 32 * 1, 32)  # t(b) = 0.1 + b / 160
    assert rates[2] == pytest.approx(max(gp.goodput(b, 2, model2, 100.0, 32) for b in range(32, 129, 2)))
    # Unseen widths borrow width 2's model (nearest in ratio), local batch trusted up to 2 x 32.
    assert rates[4] == pytest.approx(max(gp.goodput(b, 4, model2, 100.0, 32) for b in range(32, 257, 4)))
    assert rates[6] == pytest.approx(max(gp.goodput(b, 6, model2, 100.0, 32) for b in range(36, 257, 6)))
    assert rates[6] > rates[4] > rates[2]  # no added communication: an optimistic guess
    assert gp.AdaptiveBatch(base_batch=32, max_global_batch=256, max_local_batch=None,
                            target_samples=1.0).goodput_by_world() == {}  # nothing timed, nothing predicted
    a.batch_size = 64
    again = gp.AdaptiveBatch(base_batch=32, max_global_batch=256, max_local_batch=None, target_samples=100.0)
    again.load_state_dict(json.loads(json.dumps(a.state_dict())))  # survives JSON too
    assert again.state_dict() == a.state_dict() and again.phi == a.phi and again.batch_size == 64


def test_lr_factor_follows_progress() -> None:
    assert gp.lr_factor(0, 1000, warmup_samples=0, schedule="constant", base_batch=1) == 1.0
    assert gp.lr_factor(500, 1000, warmup_samples=0, schedule="cosine", base_batch=1) == pytest.approx(0.5)
    assert gp.lr_factor(1000, 1000, warmup_samples=0, schedule="cosine", base_batch=1) == pytest.approx(0.0)
    assert gp.lr_factor(49, 1000, warmup_samples=100, schedule="cosine", base_batch=1) == pytest.approx(0.5)
    # As the fixed schedule's (step + 1) / warmup_steps: 10 warm-up steps of B0 = 64, first step 0.1.
    assert gp.lr_factor(0, 6400, warmup_samples=640, schedule="cosine", base_batch=64) == pytest.approx(0.1)
    assert gp.lr_factor(100 + 450, 1000, warmup_samples=100, schedule="cosine", base_batch=1) == pytest.approx(
        0.5 * (1 + math.cos(math.pi * 0.5))
    )


def test_adaptive_flag_and_limits() -> None:
    parser = argparse.ArgumentParser()
    c.add_arguments(parser)
    cfg = c.from_args(parser.parse_args(["--dataset", "/d", "--checkpoint-uri", "/c", "--job-key", "k",
                                         "--adaptive-batch", "--max-local-batch-size", "64"]))
    assert cfg.data.adaptive_batch and cfg.data.max_local_batch_size == 64 and cfg.data.max_global_batch == 8 * 64
    off = TrainConfig.from_flat({"dataset": "/d", "checkpoint_uri": "/c", "job_key": "k"})
    assert not off.data.adaptive_batch  # opt-in
    with pytest.raises(ConfigError, match="max_global_batch_size must be >= global_batch_size"):
        TrainConfig.from_flat({"dataset": "/d", "max_global_batch_size": 8, "checkpoint_uri": "/c", "job_key": "k"})


@pytest.mark.parametrize(("base", "step_s", "phi"), [(128, 0.049, None), (128, 0.017, None), (64, 0.049, None),
                                                      (128, 0.049, 0.0)])
def test_without_a_usable_noise_scale_equal_goodputs_tie_and_the_batch_stays_at_b0(base, step_s, phi) -> None:
    """Without phi (or phi 0) every batch above B0 has goodput B0 / t under a constant step time: an
    exact tie, which keeps B0. (B / t * E(B) rounded above B0 / t for some B: 130, 148 or 105 won.)"""
    flat = gp.StepTimeModel(alpha_s=step_s, beta_s_per_sample=0.0, max_observed_local_batch=4 * base)
    for world in (1, 2):
        best, value = gp.best_batch(world, flat, phi, base_batch=base, max_global_batch=4 * base, max_local_batch=None)
        assert best == base and value == base / step_s


def test_the_noise_scale_is_estimated_from_full_batches_only() -> None:
    """An epoch's short last batch (1 sample a rank) gives a wild estimate; it is left out of the
    averages (before, one such step inflated phi 4-5x, and with it the LR and the progress counted)."""
    import types

    import torch

    from components.training.distributed import DistEnv
    from components.training.trainer import Trainer

    def step(trainer, n_global: int, local_g2: float, global_g2: float) -> None:
        world = trainer.env.world_size
        local = n_global // world
        # the per-step sum over ranks: loss, save, stop, fence, local |g|^2, 1/b, had samples, global |g|^2, retune
        agreed = torch.tensor([0.0, 0, 0, 0, local_g2 * world, world / local, world, global_g2 * world, 0],
                              dtype=torch.float64)
        Trainer._adaptive_after_step(trainer, agreed, n_global)

    adaptive = gp.AdaptiveBatch(base_batch=32, max_global_batch=256, max_local_batch=None, target_samples=1e6)
    trainer = types.SimpleNamespace(adaptive=adaptive, env=DistEnv(rank=0, world_size=2, local_rank=0,
                                    local_world_size=2, restart_count=0, under_torchrun=True),
                                    _time_next_step=False, _step_s=0.1, _retune_due=False)
    for _ in range(5):
        step(trainer, 32, local_g2=2.0, global_g2=1.2)
    phi = adaptive.phi
    assert phi is not None and phi > 0
    step(trainer, 2, local_g2=40.0, global_g2=0.5)  # the epoch's last step: 1 sample a rank
    assert adaptive.phi == phi
