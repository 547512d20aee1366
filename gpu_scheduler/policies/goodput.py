"""Pollux's goodput model: a fitted throughput model times the gradient-noise-scale efficiency.

Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep Learning",
OSDI'21, §3.1–3.2; read (not copied) from the artifact petuum/adaptdl@osdi21-artifact
``simulator/goodput.py`` and ``simulator/speedup.py`` (AdaptDL's ``adaptdl/goodput.py``). Sia
(SOSP'23, siasosp23/artifacts ``sia-simulator/goodput.py``) uses the same model and adds a fixed
batch size (``tune_bsz=False``), kept here as ``fixed_batch``.

**Throughput model** (seconds; all arrays broadcast):

* time of one forward/backward pass at per-GPU ("atomic") batch ``b``: ``T_c = alpha_c + beta_c·b``;
* synchronisation (all-reduce) time: ``T_n = alpha_n + beta_n·max(r − 2, 0)`` across nodes,
  ``alpha_r + beta_r·max(r − 2, 0)`` inside one node, ~0 for one replica (``r`` replicas);
* one optimizer step with ``s`` accumulation passes:
  ``s·T_c + (T_c^gamma + T_n^gamma)^(1/gamma)`` (gamma ∈ [1, 10]: how far compute and
  communication overlap);
* :func:`fit_perf_params` fits the seven parameters to measured (accumulation, optimizer step)
  times by minimising the RMS log error with the artifact's bounds, priors and regularisers.

**Statistical efficiency** of global batch ``B`` (McCandlish et al. 2018; Pollux §3.1) from the
gradient's squared norm ``sqr`` and variance ``var`` at the initial batch ``B0``:
``E(B) = gain / (B / B0)``, ``gain = (var + sqr) / (var·B0/B + sqr)``.

**Goodput** = throughput × efficiency, in samples at ``B0`` per second; :meth:`GoodputFunction.optimize`
picks, per (nodes, replicas), the best of 50 geometrically spaced global batches (Pollux's
batch-size tuning) or the fixed batch.

Pure numpy (scipy only inside :func:`fit_perf_params`); no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["GoodputFunction", "PerfParams", "fit_perf_params"]

_EPS = 1e-8  # the artifact's tolerance for floor/ceil and its "zero" network time


@dataclass(frozen=True, slots=True)
class PerfParams:
    """Pollux's throughput-model parameters (seconds; ``gamma`` dimensionless, in [1, 10]).

    Attributes:
        alpha_c, beta_c: compute time of one pass = ``alpha_c + beta_c × atomic batch``.
        alpha_n, beta_n: inter-node all-reduce time = ``alpha_n + beta_n × (replicas − 2)``.
        alpha_r, beta_r: intra-node all-reduce time = ``alpha_r + beta_r × (replicas − 2)``.
        gamma: overlap of compute and communication (p-norm exponent).
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def as_tuple(self) -> tuple[float, ...]:
        return (self.alpha_c, self.beta_c, self.alpha_n, self.beta_n, self.alpha_r, self.beta_r, self.gamma)


def _network_time(p: Sequence[float], num_nodes, num_replicas):
    """All-reduce time: the slowest link's constant plus retrogression past two replicas."""
    num_nodes = np.asarray(num_nodes, dtype=float)
    num_replicas = np.asarray(num_replicas, dtype=float)
    conds = [num_nodes > 1, num_replicas > 1]
    bottleneck = np.select(conds, [p[2], p[4]], _EPS)
    retrogress = np.select(conds, [p[3], p[5]], _EPS) * np.maximum(num_replicas - 2, _EPS)
    return bottleneck + retrogress


def _log_optim_time(gamma: float, accum_time, network_time):
    return np.log(accum_time ** gamma + network_time ** gamma) / gamma


class GoodputFunction:
    """Goodput of a job from its throughput model and gradient statistics.

    Args:
        perf_params: :class:`PerfParams` (or its 7 values in order).
        grad_sqr, grad_var: gradient squared norm and variance measured at ``init_batch_size``.
        init_batch_size: the batch ``B0`` efficiency is relative to (samples).
    """

    __slots__ = ("_p", "grad_sqr", "grad_var", "init_batch_size")

    def __init__(self, perf_params: PerfParams | Sequence[float], grad_sqr: float, grad_var: float,
                 init_batch_size: int) -> None:
        self._p = tuple(perf_params.as_tuple() if isinstance(perf_params, PerfParams) else perf_params)
        self.grad_sqr = float(grad_sqr)
        self.grad_var = float(grad_var)
        self.init_batch_size = int(init_batch_size)

    def throughput(self, num_nodes, num_replicas, atomic_bsz, accum_steps):
        """Samples per second (arrays broadcast)."""
        p = self._p
        accum_time = p[0] + p[1] * np.asarray(atomic_bsz, dtype=float)
        network = _network_time(p, num_nodes, num_replicas)
        optim = np.exp(_log_optim_time(p[6], accum_time, network))
        total = np.asarray(accum_steps) * accum_time + optim
        return np.asarray(num_replicas) * atomic_bsz * (np.asarray(accum_steps) + 1) / total

    def efficiency(self, batch_size):
        """Statistical efficiency ``gain / (B / B0)`` in (0, 1] for ``B >= B0``."""
        scale = np.asarray(batch_size, dtype=float) / self.init_batch_size
        denom = self.grad_var / scale + self.grad_sqr
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(denom > 0, (self.grad_var + self.grad_sqr) / denom, 1.0)
        return gain / scale

    def evaluate(self, num_nodes, num_replicas, atomic_bsz, accum_steps):
        """Goodput (samples at ``B0`` per second) of a configuration."""
        batch = np.asarray(num_replicas) * atomic_bsz * (np.asarray(accum_steps) + 1)
        return self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps) * self.efficiency(batch)

    def optimize(self, num_nodes, num_replicas, max_batch_size: int, atomic_bsz_range: tuple[int, int],
                 accumulation: bool = True, fixed_batch: bool = False):
        """Best goodput per (nodes, replicas) and the configuration that reaches it.

        Candidates: 50 global batches spaced geometrically from ``max(B0, min_atomic ×
        replicas)`` to ``max_batch_size`` (only ``max_batch_size`` itself with
        ``fixed_batch``); each is split into an atomic batch and accumulation passes as in
        the artifact (accumulation once the per-GPU batch exceeds the largest atomic batch, and
        at least one pass on a single GPU above ``B0``, where the gradient statistics need two
        micro-batches); configurations whose atomic batch leaves ``atomic_bsz_range`` get 0.

        Args:
            num_nodes, num_replicas: int arrays (or scalars) of equal shape, ``1 <= nodes <= replicas``.
            max_batch_size: largest global batch (the fixed batch with ``fixed_batch``).
            atomic_bsz_range: ``(smallest, largest)`` per-GPU batch that fits.
            accumulation: allow gradient accumulation.
            fixed_batch: evaluate only ``max_batch_size`` (Sia's ``tune_bsz=False``).

        Returns:
            ``(goodput, atomic_bsz, accum_steps)``, arrays of the input shape (scalars for scalars).
        """
        scalar = np.isscalar(num_nodes) and np.isscalar(num_replicas)
        shape = np.broadcast(num_nodes, num_replicas).shape
        nodes = np.broadcast_to(num_nodes, shape).reshape(-1).astype(float)
        replicas = np.broadcast_to(num_replicas, shape).reshape(-1).astype(float)
        lo_atomic, hi_atomic = atomic_bsz_range
        if fixed_batch:
            batch = np.full((1, replicas.size), float(max_batch_size))
        else:
            low = np.maximum(self.init_batch_size, lo_atomic * replicas)
            batch = np.geomspace(low, np.full_like(low, float(max_batch_size)))  # (50, M)
        local = batch / replicas
        if accumulation:
            accum = np.ceil(local / hi_atomic - _EPS) - 1
            accum = np.where((replicas == 1) & (local > self.init_batch_size + _EPS), np.maximum(accum, 1), accum)
        else:
            accum = np.zeros_like(local)
        accum = accum.astype(int)
        atomic = np.ceil(local / (accum + 1) - _EPS).astype(int)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            goodput = self.evaluate(nodes, replicas, atomic, accum)
        valid = (lo_atomic <= atomic) & (atomic <= hi_atomic) & np.isfinite(goodput)
        goodput = np.where(valid, goodput, 0.0)
        best = np.argmax(goodput, axis=0)
        cols = np.arange(goodput.shape[1])
        out = (goodput[best, cols].reshape(shape), atomic[best, cols].reshape(shape),
               accum[best, cols].reshape(shape))
        if scalar:
            return float(out[0].item()), int(out[1].item()), int(out[2].item())
        return out


# ------------------------------------------------------------------------------------------ fitting


def _objective(x, nodes, replicas, atomic, accum_t, optim_t):
    """The artifact's fit objective and its gradient (written out by hand; the artifact uses
    autograd): RMS log error of accumulation and optimizer step times + regularisers."""
    ac, bc, an, bn, ar, br, g = x
    n = accum_t.size
    pa = ac + bc * atomic                                     # predicted accumulation-pass time
    inter, intra = nodes > 1, (nodes <= 1) & (replicas > 1)
    rr = np.maximum(replicas - 2, _EPS)
    net = np.where(inter, an + bn * rr, np.where(intra, ar + br * rr, _EPS + _EPS * rr))
    a_g, n_g = pa ** g, net ** g
    s = a_g + n_g
    lo = np.log(s) / g                                        # predicted log optimizer time
    e1 = np.log(pa) - np.log(accum_t)
    e2 = lo - np.log(optim_t)
    err1 = math.sqrt(float(np.mean(e1 * e1)))
    err2 = math.sqrt(float(np.mean(e2 * e2)))
    value = err1 + err2 + 1e-3 * (g - 1) ** 2 + 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    d1 = e1 / (n * err1) if err1 > 0 else np.zeros_like(e1)   # d err1 / d e1
    d2 = e2 / (n * err2) if err2 > 0 else np.zeros_like(e2)
    dlo_dpa = pa ** (g - 1) / s
    dlo_dnet = net ** (g - 1) / s
    with np.errstate(divide="ignore", invalid="ignore"):
        dlo_dg = (a_g * np.log(pa) + n_g * np.log(net)) / (s * g) - np.log(s) / (g * g)
    dpa = d1 / pa + d2 * dlo_dpa                              # d value / d pa, per point
    dnet = d2 * dlo_dnet
    grad = np.array([
        float(np.sum(dpa)),
        float(np.sum(dpa * atomic)),
        float(np.sum(dnet * inter)) - 2e-2 * bn * bn / an ** 3,
        float(np.sum(dnet * inter * rr)) + 2e-2 * bn / (an * an),
        float(np.sum(dnet * intra)) - 2e-2 * br * br / ar ** 3,
        float(np.sum(dnet * intra * rr)) + 2e-2 * br / (ar * ar),
        float(np.sum(d2 * dlo_dg)) + 2e-3 * (g - 1),
    ])
    return value, grad


def fit_perf_params(num_nodes: Sequence[int], num_replicas: Sequence[int], atomic_bsz: Sequence[int],
                    accum_step_time: Sequence[float], optim_step_time: Sequence[float]) -> PerfParams:
    """Fit :class:`PerfParams` to measured step times (Pollux §3.2; artifact ``fit_perf_params``).

    Args:
        num_nodes, num_replicas, atomic_bsz: the measured configurations (equal lengths, >= 1).
        accum_step_time: seconds of one accumulation pass (step time − sync time) per configuration.
        optim_step_time: seconds of one optimizer step (one pass + all-reduce) per configuration.

    L-BFGS-B from the artifact's start (0.1, 0.01 ×3, gamma 1.001) within its bounds
    (parameters >= 1e-8, gamma in [1, 10]); as in the artifact, ``alpha_c`` is fixed at half the
    mean accumulation time when one atomic batch was measured, the inter-node terms when no
    multi-node configuration was, the intra-node terms when no single-node multi-GPU one was, the
    retrogression terms when none had more than two replicas; without multi-node data the
    inter-node terms are raised to at least 1.1× the intra-node ones.

    Raises:
        ValueError: on empty or mismatched inputs, or non-positive times.
    """
    from scipy.optimize import minimize

    nodes = np.asarray(num_nodes, dtype=float)
    replicas = np.asarray(num_replicas, dtype=float)
    atomic = np.asarray(atomic_bsz, dtype=float)
    accum_t = np.asarray(accum_step_time, dtype=float)
    optim_t = np.asarray(optim_step_time, dtype=float)
    if not (nodes.size and nodes.size == replicas.size == atomic.size == accum_t.size == optim_t.size):
        raise ValueError("fit_perf_params needs equally long, non-empty measurement arrays")
    if np.any(accum_t <= 0) or np.any(optim_t <= 0):
        raise ValueError("step times must be > 0")
    x0 = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if np.unique(atomic).size == 1:
        x0[0] = lower[0] = upper[0] = float(np.mean(accum_t)) / 2
    if not np.any(nodes > 1):
        for i in (2, 3):
            x0[i] = upper[i] = lower[i]
    if not np.any((nodes == 1) & (replicas > 1)):
        for i in (4, 5):
            x0[i] = upper[i] = lower[i]
    if not np.any(replicas > 2):
        for i in (3, 5):
            x0[i] = upper[i] = lower[i]
    result = minimize(_objective, np.array(x0), args=(nodes, replicas, atomic, accum_t, optim_t), jac=True,
                      method="L-BFGS-B", bounds=list(zip(lower, upper, strict=True)))
    x = [float(v) for v in result.x]
    if not np.any(nodes > 1):
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x)
