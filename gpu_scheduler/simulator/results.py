"""Metrics of a simulation and its ``result.json``.

Definitions (the Pollux/Tiresias conventions; Schedulearn's "turnaround time" is the JCT):

* **JCT** — finish − submit, per job; ``avg_jct_s``, ``p50_jct_s``, ``p99_jct_s`` (numpy's linear
  percentile) over the workload's jobs.
* **makespan** — last finish − first submission.
* **queueing delay** — first round with at least one GPU − submission.
* **GPU allocation** — GPU-seconds held by jobs (restarts included) ÷ (cluster GPUs × makespan),
  in [0, 1].
* **restarts per job** — re-allocations after the first start, averaged over jobs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gpu_scheduler.simulator.engine import JobRecord, SimResult

__all__ = ["RESULT_SCHEMA", "read_result", "result_document", "summarize", "write_result"]

RESULT_SCHEMA = "trainflow.gpu_scheduler.simulate/v1"


def summarize(jobs: list[JobRecord], total_gpus: int) -> dict[str, float]:
    """Summary metrics over finished jobs (see the module docstring).

    Raises:
        ValueError: if no job finished.
    """
    done = [j for j in jobs if j.finish_time_s is not None]
    if not done:
        raise ValueError("no job finished")
    jct = np.array([j.jct_s for j in done], dtype=float)
    first_submit = min(j.submit_time_s for j in jobs)
    makespan = max(j.finish_time_s for j in done) - first_submit  # type: ignore[type-var]
    delays = [j.queueing_delay_s for j in done if j.queueing_delay_s is not None]
    held = sum(j.attained_service_gpu_s for j in jobs)
    return {
        "jobs": len(jobs),
        "finished_jobs": len(done),
        "avg_jct_s": float(jct.mean()),
        "p50_jct_s": float(np.percentile(jct, 50)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "makespan_s": float(makespan),
        "avg_queueing_delay_s": float(np.mean(delays)) if delays else 0.0,
        "gpu_allocation": float(held / (total_gpus * makespan)) if makespan > 0 else 0.0,
        "restarts_per_job": float(np.mean([j.restarts for j in jobs])),
    }


def result_document(result: SimResult, *, workload: str, policy_params: dict[str, Any]) -> dict[str, Any]:
    """The JSON-ready ``result.json`` content of a run."""
    cfg = result.config
    summary = summarize(result.jobs, cfg.total_gpus)
    summary.update({
        "rounds": result.rounds,
        "sim_wall_s": round(result.wall_s, 3),
        "decide_wall_s": round(result.decide_wall_s, 3),
        "avg_decide_ms": round(1000 * result.decide_wall_s / max(result.rounds, 1), 3),
    })
    return {
        "schema": RESULT_SCHEMA,
        "workload": workload,
        "policy": result.policy,
        "policy_params": policy_params,
        "cluster": {
            "nodes": cfg.nodes,
            "gpus_per_node": cfg.gpus_per_node,
            "total_gpus": cfg.total_gpus,
            "interval_s": cfg.interval_s,
            "restart_cost_s": cfg.restart_cost_s,
            **({"adaptive_batch": True, "adaptive_throughput": cfg.adaptive_throughput}
               if cfg.adaptive_batch else {}),
        },
        "summary": summary,
        "jobs": [
            {
                "name": j.name,
                "application": j.application,
                "batch_size": j.batch_size,
                "requested_workers": j.requested_workers,
                "max_workers": j.max_workers,
                "submit_time_s": j.submit_time_s,
                "start_time_s": j.start_time_s,
                "finish_time_s": j.finish_time_s,
                "jct_s": j.jct_s,
                "queueing_delay_s": j.queueing_delay_s,
                "restarts": j.restarts,
                "attained_service_gpu_s": round(j.attained_service_gpu_s, 3),
                "allocations": [[t, w, p] for t, w, p in j.allocations],
                **({"batch_sizes": [[t, b] for t, b in j.batch_sizes]} if j.batch_sizes else {}),
            }
            for j in result.jobs
        ],
        "gpus_in_use": [[t, g] for t, g in result.gpus_in_use],
    }


def write_result(doc: dict[str, Any], path: Path) -> None:
    """Write ``result.json`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def read_result(path: Path) -> dict[str, Any]:
    """Read a ``result.json`` written by :func:`write_result`.

    Raises:
        ValueError: if the file is not a simulate result.
    """
    doc = json.loads(path.read_text())
    if doc.get("schema") != RESULT_SCHEMA:
        raise ValueError(f"{path} is not a gpu_scheduler simulate result (schema {doc.get('schema')!r})")
    return doc
