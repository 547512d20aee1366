"""The simulator's subcommands: ``simulate``, ``report`` and ``policies``.

``python -m gpu_scheduler simulate --workload CSV --policy NAME [--nodes 16 --gpus-per-node 4
--interval-s 60] --out result.json`` writes ``result.json`` (per-job submit/start/finish times and
allocations over time, and a ``summary``) and a PNG next to it (JCT CDF and GPUs in use).
Bad input ends with a one-line error and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpu_scheduler.model import SchedulerError

__all__ = ["policies_command", "report_command", "simulate_command"]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def simulate_command(
    workload: Annotated[Path, typer.Option(help="Workload CSV (name,time,application,num_replicas,batch_size).")],
    policy: Annotated[str, typer.Option(help="Policy name (see `policies`); `default` = trainflow's.")],
    out: Annotated[Path, typer.Option(help="Where to write result.json.")],
    nodes: Annotated[int, typer.Option(help="Nodes in the simulated cluster.")] = 16,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (1-4).")] = 4,
    interval_s: Annotated[int, typer.Option(help="Seconds between scheduling rounds.")] = 60,
    restart_cost_s: Annotated[float, typer.Option(
        help="Seconds without progress per re-allocation (30: the Pollux artifact's; a trainflow resize "
             "measured on the real node: gpu_scheduler.simulator.engine.MEASURED_RESTART_COST_S).")] = 30.0,
    param: Annotated[list[str] | None, typer.Option(help="key=value policy parameter (repeatable).")] = None,
    traces: Annotated[Path | None, typer.Option(
        help="Folder of measured job models (default: ../traces beside the workload folder, else the "
             "shared Pollux data).")] = None,
    plot: Annotated[Path | None, typer.Option(help="PNG path (default: result path with .png).")] = None,
    adaptive_batch: Annotated[bool, typer.Option(
        "--adaptive-batch", help="Experiment: jobs re-pick the global batch of largest goodput per "
                                 "allocation and epoch (AdaptDL-style; trainflow's trainer with --adaptive-batch).")] = False,
    adaptive_throughput: Annotated[str, typer.Option(
        "--adaptive-throughput", help="With --adaptive-batch: fitted (step times fitted from the configurations "
                                      "the job has run, as the trainer does), oracle (the true model) or pollux "
                                      "(AdaptDL's agent: Pollux's throughput model).")] = "fitted",
) -> None:
    """Simulate one policy on one workload and write result.json (+ a PNG plot)."""
    from gpu_scheduler.policies import parse_params
    from gpu_scheduler.simulator import simulate_file
    from gpu_scheduler.simulator.engine import SimConfig
    from gpu_scheduler.simulator.plots import plot_jct_and_usage
    from gpu_scheduler.simulator.results import write_result

    try:
        if not workload.is_file():
            raise _fail(f"workload {workload} does not exist")
        params = parse_params(policy, param or [])
        config = SimConfig(nodes=nodes, gpus_per_node=gpus_per_node, interval_s=interval_s,
                           restart_cost_s=restart_cost_s, adaptive_batch=adaptive_batch,
                           adaptive_throughput=adaptive_throughput)
        doc = simulate_file(workload, policy, params=params, config=config, traces=traces)
        write_result(doc, out)
        png = plot or out.with_suffix(".png")
        plot_jct_and_usage({policy: [j["jct_s"] for j in doc["jobs"]]},
                           {policy: [tuple(x) for x in doc["gpus_in_use"]]}, png,
                           total_gpus=config.total_gpus, title=f"{workload.name}: {policy}")
    except SchedulerError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"{exc.filename or ''}: {exc.strerror or exc}") from None
    s = doc["summary"]
    typer.echo(f"{policy} on {workload.name}: avg JCT {s['avg_jct_s']:.0f} s, p99 {s['p99_jct_s']:.0f} s, "
               f"makespan {s['makespan_s']:.0f} s, GPU allocation {s['gpu_allocation']:.2f}, "
               f"restarts/job {s['restarts_per_job']:.2f} -> {out}, {png}")


def report_command(
    out: Annotated[Path, typer.Option(help="Markdown report to write.")] = Path("docs/scheduler-report.md"),
    data: Annotated[Path | None, typer.Option(
        help="Pollux data folder (workloads*/, traces/); default: $TRAINFLOW_POLLUX_DIR or the shared folder.")
    ] = None,
    policy: Annotated[list[str] | None, typer.Option(help="Policies to compare (repeatable; default all).")] = None,
    load: Annotated[list[str] | None, typer.Option(help="Loads: 0.5, 1.0, 1.5, 2.0 (repeatable).")] = None,
    workloads: Annotated[int, typer.Option(help="Workloads 1..N per load.")] = 8,
    processes: Annotated[int | None, typer.Option(help="Worker processes (default: CPU count).")] = None,
    job_model: Annotated[list[str] | None, typer.Option(
        help="Job models: fixed (the workload's global batch), adaptive (goodput-adaptive batch, "
             "trainer --adaptive-batch); repeatable, default both.")] = None,
    restart_cost_s: Annotated[float | None, typer.Option(
        help="Restart cost of the side-by-side runs (default: the measured figure, "
             "gpu_scheduler.simulator.engine.MEASURED_RESTART_COST_S).")] = None,
    jitter_runs: Annotated[int, typer.Option(
        help="Extra runs per workload at 1.0x with jittered submit times for pollux, sia and default.")] = 0,
) -> None:
    """Run every policy on the Pollux workloads and write the side-by-side benchmark report."""
    from gpu_scheduler.policies import names
    from gpu_scheduler.simulator.data import find_pollux_dir
    from gpu_scheduler.simulator.report import DEFAULT_POLICIES, JOB_MODELS, LOADS, ReportSpec, run_report

    try:
        chosen = tuple(policy) if policy else DEFAULT_POLICIES
        unknown = [p for p in chosen if p not in names()]
        if unknown:
            raise _fail(f"unknown policy {unknown[0]!r}; choose from: {', '.join(names())}")
        loads = tuple(load) if load else LOADS
        bad = [x for x in loads if x not in LOADS]
        if bad:
            raise _fail(f"unknown load {bad[0]!r}; choose from: {', '.join(LOADS)}")
        if not 1 <= workloads <= 8:
            raise _fail(f"--workloads must be 1..8, got {workloads}")
        models = tuple(dict.fromkeys(job_model)) if job_model else JOB_MODELS
        bad = [m for m in models if m not in JOB_MODELS]
        if bad:
            raise _fail(f"unknown job model {bad[0]!r}; choose from: {', '.join(JOB_MODELS)}")
        if restart_cost_s is not None and not restart_cost_s >= 0:
            raise _fail(f"--restart-cost-s must be >= 0, got {restart_cost_s}")
        if jitter_runs < 0:
            raise _fail(f"--jitter-runs must be >= 0, got {jitter_runs}")
        extra = {} if restart_cost_s is None else {"restart_cost_s": restart_cost_s}
        spec = ReportSpec(data_dir=find_pollux_dir(data), out=out, policies=chosen, loads=loads,
                          workloads=tuple(range(1, workloads + 1)), processes=processes, job_models=models,
                          jitter_runs=jitter_runs, **extra)
        run_report(spec, log=typer.echo)
    except SchedulerError as exc:
        raise _fail(str(exc)) from None


def policies_command() -> None:
    """List the registered policies."""
    from gpu_scheduler.policies import describe

    for name, summary in describe().items():
        typer.echo(f"{name:14s} {summary}")
