"""Fidelity check: our ``sia`` policy against the Sia artifact's own ILP, decision by decision.

The Sia artifact (siasosp23/artifacts, ``sia-simulator/sia.py``) is not part of this project. This
script feeds the same random cluster states to both and compares the GPUs each job gets and the
ILP objective: three steps, two Python environments (the artifact needs cvxpy + a MIP solver and
autograd, which the project does not install)::

    .venv/bin/python benchmarks/sia_artifact_check.py dump --cases 40 --out /tmp/sia-cases.json
    <python with cvxpy, autograd, pandas> benchmarks/sia_artifact_check.py artifact \\
        --artifact DIR --cases-file /tmp/sia-cases.json --out /tmp/sia-artifact.json
    .venv/bin/python benchmarks/sia_artifact_check.py compare --cases-file /tmp/sia-cases.json \\
        --artifact-file /tmp/sia-artifact.json

``DIR`` holds the artifact's ``sia.py``, ``speedup.py``, ``goodput.py``, ``simulator_config.py``
and ``utils.py`` (e.g. ``git archive`` of ``sia-simulator``). The artifact calls CBC; the
``artifact`` step hands its ILP to HiGHS through cvxpy instead (same model, same 1e-4 relative
gap) when CBC is not installed. Homogeneous cluster: 16 nodes × 4 GPUs (``{"aws": 16}``).
Every case: 2–40 jobs with Pollux goodput models (a quarter without one: not run yet), about half
running at one of Sia's configurations, ages and restarts drawn at random.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

NODES, GPN = 16, 4


def _cases(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    configs = [(1, 1), (1, 2), (1, 4)] + [(k, 4 * k) for k in range(2, NODES + 1)]
    out = []
    for c in range(n):
        jobs, free = [], NODES * GPN
        for i in range(rng.randint(2, 40)):
            model = None
            if rng.random() < 0.75:
                model = {"perf": [rng.uniform(0.01, 0.1), rng.uniform(1e-4, 5e-3), rng.uniform(0.05, 0.4),
                                  rng.uniform(1e-8, 0.02), rng.uniform(0.01, 0.08), rng.uniform(1e-8, 0.005),
                                  rng.uniform(1.0, 3.0)],
                         "sqr": 1.0, "var": rng.uniform(1, 400), "init": 128, "max": rng.choice((1024, 4096, 12800)),
                         "lo": 16, "hi": rng.choice((64, 128, 256)), "profiled": rng.choice((1, 2, 4, 8, 16))}
            running = None
            if model is not None and rng.random() < 0.6:
                cfg = rng.choice([x for x in configs if x[1] <= min(free, 2 * model["profiled"])] or [(0, 0)])
                if cfg[1]:
                    running, free = cfg, free - cfg[1]
            age = rng.uniform(10, 40000)
            jobs.append({"name": f"job-{c}-{i}", "model": model, "running": running, "age": age,
                         "restarts": rng.randint(0, 6), "max_workers": 64})
        out.append({"jobs": jobs, "now": 100000.0})
    return out


def _ours(case: dict) -> tuple[dict[str, int], list]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gpu_scheduler.model import ClusterSnapshot, GoodputModel, Job, Node
    from gpu_scheduler.policies import create
    from gpu_scheduler.policies.placement import FreeGpus

    nodes = tuple(Node(name=f"node-{i}", gpus=GPN) for i in range(NODES))
    ledger = FreeGpus(ClusterSnapshot(nodes=nodes, jobs=()))
    jobs = []
    for j in case["jobs"]:
        m = j["model"]
        placement = ledger.place_compact(j["running"][1], 1, GPN) if j["running"] else None
        jobs.append(Job(name=j["name"], submit_time_s=case["now"] - j["age"], max_workers=j["max_workers"],
                        requested_workers=1, placement=placement or Job.__dataclass_fields__["placement"].default,
                        restarts=j["restarts"], first_start_s=0.0 if placement else None,
                        placement_since_s=case["now"] - 600 if placement else None,
                        goodput_model=None if m is None else GoodputModel(
                            perf_params=tuple(m["perf"]), grad_sqr=m["sqr"], grad_var=m["var"],
                            init_batch_size=m["init"], max_batch_size=m["max"], min_local_batch=m["lo"],
                            max_local_batch=m["hi"], max_profiled_workers=m["profiled"])))
    snap = ClusterSnapshot(nodes=nodes, jobs=tuple(jobs), taken_at_s=case["now"])
    policy = create("sia", restart_penalty_s=30.0)
    decision = policy.decide(snap, case["now"])
    decision.validate(snap)
    return {d.job: d.workers for d in decision}, _objective(policy, snap, case["now"])


def _objective(policy, snap, now: float) -> dict[str, list[float]]:
    """Per job, ``round(value^p, 2)`` of every configuration (for scoring any allocation)."""
    import numpy as np

    from gpu_scheduler.policies.sia import configurations

    configs = configurations(GPN, NODES, policy.max_nodes_per_job)
    out = {}
    for job in snap.jobs:
        values, _, _ = policy._values(job, configs, now)
        out[job.name] = [float(v) for v in np.minimum(np.round(np.power(values, policy.fairness_p), 2),
                                                       policy.value_clip)]
    return out


def _score(case: dict, gpus: dict[str, int]) -> float:
    """The ILP objective of an allocation (GPUs per job), on our value matrix."""
    configs = [(1, 1), (1, 2), (1, 4)] + [(k, 4 * k) for k in range(2, NODES + 1)]
    total = 0.0
    for name, row in case["values"].items():
        n = gpus.get(name, 0)
        total += 1.1 if n == 0 else row[[c[1] for c in configs].index(n)]
    return total


def dump(args) -> int:
    cases = _cases(args.cases, args.seed)
    for case in cases:
        case["ours"], case["values"] = _ours(case)
    Path(args.out).write_text(json.dumps(cases))
    print(f"wrote {len(cases)} cases to {args.out}")
    return 0


def artifact(args) -> int:
    sys.path.insert(0, str(Path(args.artifact).resolve()))
    import cvxpy as cp
    import simulator_config as sim_config  # the artifact's
    from goodput import GoodputFunction  # the artifact's
    from sia import SiaPolicy  # the artifact's
    from speedup import UncachedSpeedupFunction  # the artifact's
    from utils import JobInfo, NodeInfo  # the artifact's

    sim_config.sia_solver_verbose = False
    if "CBC" not in cp.installed_solvers():
        solve = cp.Problem.solve

        def highs(self, *a, **kw):
            return solve(self, solver="HIGHS", mip_rel_gap=sim_config.sia_solver_thresh)

        cp.Problem.solve = highs
    cases = json.loads(Path(args.cases_file).read_text())
    out = []
    for case in cases:
        policy = SiaPolicy(p_fairness=-0.5, lambda_a=0.01, lambda_n=1.1)
        policy.populate_valid_configs({"aws": NODES}, {"aws": GPN}, {"aws": NODES})
        jobs, prev, node_id = {}, {}, 0
        for j in case["jobs"]:
            m = j["model"]
            fn = None
            if m is not None:
                gf = GoodputFunction(m["perf"], (m["sqr"], m["var"]), m["init"])
                fn = UncachedSpeedupFunction(gf, m["max"], (m["lo"], m["hi"]), accumulation=True)
            profiled = m["profiled"] if m is not None else 0
            info = JobInfo(resources={"nvidia.com/gpu": 1}, speedup_fn={"aws": fn}, creation_timestamp=0,
                           attained_service=0, min_replicas={"aws": 0},
                           max_replicas={"aws": min(max(2 * profiled, 1), 64, j["max_workers"])})
            info.category, info.scale_unit, info.num_restarts = None, {"aws": 1}, j["restarts"]
            info.age, info.scaling_underway = j["age"], False
            info.cluster_throughput_ratios, info.cluster_throughputs = {"aws": {}}, {"aws": 1.0}
            jobs[j["name"]] = info
            if j["running"]:
                nn, g = j["running"]
                policy.prev_allocs_v2["adaptive"][j["name"]] = policy.config_to_idx_map[("aws", nn, g)]
                prev[j["name"]] = ("aws", list(range(node_id, node_id + g)))
                node_id += g
        nodes = {"aws": {i: NodeInfo({"nvidia.com/gpu": GPN}, preemptible=False) for i in range(NODES)}}
        placements = policy.optimize(jobs, nodes, prev)
        out.append({"gpus": {name: len(p[1]) for name, p in placements.items()},
                    "objective": float(policy.objective_values[-1])})
        print(".", end="", flush=True)
    Path(args.out).write_text(json.dumps(out))
    print(f"\nwrote {len(out)} decisions to {args.out}")
    return 0


def compare(args) -> int:
    cases = json.loads(Path(args.cases_file).read_text())
    theirs = json.loads(Path(args.artifact_file).read_text())
    jobs = same = same_cases = gpus_ours = gpus_theirs = 0
    gaps, objective_gaps = [], []
    for case, result in zip(cases, theirs, strict=True):
        art = result["gpus"]
        ours_score, their_score = _score(case, case["ours"]), _score(case, art)
        gaps.append((ours_score - their_score) / abs(their_score))
        objective_gaps.append(abs(ours_score - result["objective"]) / abs(result["objective"]))
        ok = True
        for name, n in case["ours"].items():
            jobs += 1
            same += n == art.get(name, 0)
            ok &= n == art.get(name, 0)
            gpus_ours += n
            gpus_theirs += art.get(name, 0)
        same_cases += ok
    print(f"{len(cases)} cases, {jobs} jobs: same GPU count for {same} jobs ({100 * same / jobs:.1f} %), "
          f"identical decisions in {same_cases} cases; GPUs allocated ours {gpus_ours}, artifact {gpus_theirs}")
    print(f"ILP objective (minimised) of our allocation vs the artifact's, scored on the same values: "
          f"mean {100 * sum(gaps) / len(gaps):+.3f} %, worst {100 * max(gaps):+.3f} %, best {100 * min(gaps):+.3f} %; "
          f"our objective vs the artifact solver's own optimum: largest difference {100 * max(objective_gaps):.3f} %")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--cases", type=int, default=40)
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--out", required=True)
    a = sub.add_parser("artifact")
    a.add_argument("--artifact", required=True)
    a.add_argument("--cases-file", required=True)
    a.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--cases-file", required=True)
    c.add_argument("--artifact-file", required=True)
    args = ap.parse_args(argv)
    return {"dump": dump, "artifact": artifact, "compare": compare}[args.step](args)


if __name__ == "__main__":
    raise SystemExit(main())
