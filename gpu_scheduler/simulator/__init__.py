"""Trace-driven simulator: the same pure policies as the live controller, on measured job models.

Entry point: :func:`simulate_file` (used by ``python -m gpu_scheduler simulate`` and the benchmark
report). Pieces: :mod:`.workload` (workload CSVs), :mod:`.jobmodel` (measured step time and
statistical efficiency), :mod:`.engine` (the discrete-time loop), :mod:`.results` (metrics and
``result.json``), :mod:`.plots`, :mod:`.report` (the side-by-side benchmark), :mod:`.published`
(published anchor numbers), :mod:`.data` (where the trace data lives).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpu_scheduler.policies import create
from gpu_scheduler.simulator.data import traces_dir_for
from gpu_scheduler.simulator.engine import SimConfig, SimResult, Simulator
from gpu_scheduler.simulator.jobmodel import Application, load_applications
from gpu_scheduler.simulator.results import result_document
from gpu_scheduler.simulator.workload import read_workload

__all__ = ["SimConfig", "SimResult", "Simulator", "simulate_file"]

_APPS: dict[Path, dict[str, Application]] = {}


def _applications(traces: Path, names: set[str]) -> dict[str, Application]:
    key = traces.resolve()
    cached = _APPS.setdefault(key, {})
    missing = names - set(cached)
    if missing:
        cached.update(load_applications(key, missing))
    return {n: cached[n] for n in names}


def simulate_file(workload: Path, policy: str, *, params: dict[str, Any] | None = None,
                  config: SimConfig | None = None, traces: Path | None = None) -> dict[str, Any]:
    """Simulate ``policy`` on a workload CSV and return the ``result.json`` document.

    Measured models are loaded once per process and reused.

    Raises:
        SchedulerError: (subclasses) for a bad workload, missing models, an unknown policy or
            parameter, an invalid decision, or a run that does not finish.
    """
    params = dict(params or {})
    jobs = read_workload(workload)
    apps = _applications(traces_dir_for(workload, traces), {j.application for j in jobs})
    result = Simulator(jobs, apps, create(policy, **params), config or SimConfig()).run()
    return result_document(result, workload=str(workload), policy_params=params)
