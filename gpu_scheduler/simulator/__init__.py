"""Trace-driven simulator: the same pure policies as the live controller, on measured job models.

Entry point: :func:`simulate_file` (used by ``python -m gpu_scheduler simulate`` and the benchmark
report). Pieces: :mod:`.workload` (workload CSVs), :mod:`.jobmodel` (measured step time and
statistical efficiency), :mod:`.engine` (the discrete-time loop), :mod:`.results` (metrics and
``result.json``), :mod:`.plots`, :mod:`.report` (the side-by-side benchmark), :mod:`.published`
(published anchor numbers), :mod:`.data` (where the trace data lives).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

from gpu_scheduler.policies import create
from gpu_scheduler.simulator.data import traces_dir_for
from gpu_scheduler.simulator.engine import SimConfig, SimResult, Simulator
from gpu_scheduler.simulator.jobmodel import Application, load_applications
from gpu_scheduler.simulator.results import result_document
from gpu_scheduler.simulator.workload import read_workload

__all__ = ["JITTER_S", "SimConfig", "SimResult", "Simulator", "simulate_file"]

_APPS: dict[Path, dict[str, Application]] = {}


def _applications(traces: Path, names: set[str]) -> dict[str, Application]:
    key = traces.resolve()
    cached = _APPS.setdefault(key, {})
    missing = names - set(cached)
    if missing:
        cached.update(load_applications(key, missing))
    return {n: cached[n] for n in names}


JITTER_S = 120.0
"""Submit-time jitter of :func:`simulate_file`'s ``jitter_seed``: each job is submitted up to this
many seconds later (uniform), to tell a policy's effect from chaotic per-workload swings."""


def simulate_file(workload: Path, policy: str, *, params: dict[str, Any] | None = None,
                  config: SimConfig | None = None, traces: Path | None = None,
                  jitter_seed: int | None = None) -> dict[str, Any]:
    """Simulate ``policy`` on a workload CSV and return the ``result.json`` document.

    Measured models are loaded once per process and reused. With ``jitter_seed``, every submit
    time is shifted by ``U(0, JITTER_S)`` seconds drawn from ``random.Random(jitter_seed)`` in the
    workload's order.

    Raises:
        SchedulerError: (subclasses) for a bad workload, missing models, an unknown policy or
            parameter, an invalid decision, or a run that does not finish.
    """
    params = dict(params or {})
    jobs = read_workload(workload)
    if jitter_seed is not None:
        rng = random.Random(jitter_seed)
        jobs = sorted((dataclasses.replace(j, submit_time_s=j.submit_time_s + rng.uniform(0.0, JITTER_S)) for j in jobs),
                      key=lambda j: j.submit_time_s)
    apps = _applications(traces_dir_for(workload, traces), {j.application for j in jobs})
    result = Simulator(jobs, apps, create(policy, **params), config or SimConfig()).run()
    return result_document(result, workload=str(workload), policy_params=params)
