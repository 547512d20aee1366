"""Experiment: one policy on the Pollux workloads with and without adaptive batch sizes.

Runs ``policy`` (with optional ``key=value`` parameters) on workloads 1-8 at the loads of the
benchmark report (the same files: ``gpu_scheduler.simulator.report``), with the simulator's
``adaptive_batch`` on (and, with ``--baseline``, off as well, side by side) -- with the job's
fitted step-time model (``adaptive_throughput="fitted"``, the default) and/or the true one
(``--throughput oracle``; repeat ``--throughput`` for both, side by side) -- one simulation at a
time, and prints per load the mean over the workloads of average JCT, makespan and restarts
per job, then the per-workload figures at 1.0x. ``--json`` writes every run's summary.

Usage: ``python benchmarks/scheduler_adaptive_batch.py --policy default [--param cap_at_request=false]
[--load 1.0 ...] [--throughput fitted --throughput oracle] [--baseline] [--json out.json]``

trainflow's trainer adapts its batch only with ``--adaptive-batch`` (by default it shards a
fixed global batch); this measures what that job-side goodput agent adds, see docs/scheduler.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_scheduler.model import SchedulerError
from gpu_scheduler.policies import parse_params
from gpu_scheduler.simulator import simulate_file
from gpu_scheduler.simulator.data import find_pollux_dir
from gpu_scheduler.simulator.engine import ADAPTIVE_THROUGHPUT, SimConfig
from gpu_scheduler.simulator.report import LOADS, _workload_path

METRICS = ("avg_jct_s", "makespan_s", "restarts_per_job", "p99_jct_s", "gpu_allocation")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="default")
    ap.add_argument("--param", action="append", default=[], help="key=value policy parameter (repeatable)")
    ap.add_argument("--load", action="append", choices=LOADS, help="loads (default: all four)")
    ap.add_argument("--workloads", type=int, default=8)
    ap.add_argument("--baseline", action="store_true", help="also run with adaptive_batch off")
    ap.add_argument("--throughput", action="append", choices=ADAPTIVE_THROUGHPUT,
                    help="adaptive jobs' step-time model: fitted (default) and/or oracle (repeatable)")
    ap.add_argument("--json", type=Path, help="write every run's summary here")
    args = ap.parse_args(argv)
    try:
        params = parse_params(args.policy, args.param)
        data = find_pollux_dir()
    except SchedulerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    loads = sorted(args.load or LOADS, key=float)
    throughputs = list(dict.fromkeys(args.throughput or ["fitted"]))
    modes = ([("off", False, "fitted")] if args.baseline else []) + [(t, True, t) for t in throughputs]
    runs = []
    for load in loads:
        for label, adaptive, throughput in modes:
            for n in range(1, args.workloads + 1):
                doc = simulate_file(_workload_path(data, load, n), args.policy, params=params,
                                    config=SimConfig(adaptive_batch=adaptive, adaptive_throughput=throughput))
                runs.append({"load": load, "adaptive_batch": adaptive, "mode": label, "workload": n,
                             "summary": {m: doc["summary"][m] for m in METRICS}})
            rs = [r["summary"] for r in runs if r["load"] == load and r["mode"] == label]
            mean = {m: statistics.fmean(r[m] for r in rs) for m in METRICS}
            print(f"{load}x {args.policy} {' '.join(args.param)} adaptive_batch={label}: "
                  f"avg JCT {mean['avg_jct_s']:,.0f} s, makespan {mean['makespan_s']:,.0f} s, "
                  f"restarts/job {mean['restarts_per_job']:.2f}, p99 {mean['p99_jct_s']:,.0f} s, "
                  f"GPU allocation {mean['gpu_allocation']:.2f}", flush=True)
    for label, _, _ in modes:
        per = [r for r in runs if r["load"] == "1.0" and r["mode"] == label]
        if per:
            print(f"1.0x per workload (JCT / makespan / restarts), adaptive_batch={label}: " + ", ".join(
                f"{r['workload']}: {r['summary']['avg_jct_s']:,.0f} / {r['summary']['makespan_s']:,.0f} / "
                f"{r['summary']['restarts_per_job']:.2f}" for r in per))
    if args.json:
        args.json.write_text(json.dumps({"policy": args.policy, "params": args.param, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
