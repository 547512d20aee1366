"""CPU of the controller's tick at N jobs, without a cluster: where the time goes (issue 16).

The real :class:`~gpu_scheduler.controller.Controller` ticks against in-memory ports: ``--jobs``
PyTorchJobs on ``--nodes`` nodes x 8 GPUs (1-worker jobs, plus 2-worker ones while GPUs last, as
after the scale benchmark's warm-up), 1 % of the jobs getting a new ``resourceVersion`` per tick
(the operator's status updates), and canned Prometheus answers (DCGM busy per pod, samples/s, a
stable world size and the three step gauges per job) parsed by the controller's own decoder every
tick. Reports the CPU seconds per tick (min and median) and per phase (min over the ticks); with
``--profile``, cProfile's top functions of one tick.

    .venv/bin/python benchmarks/controller_tick_profile.py --jobs 5000 --nodes 1024
    .venv/bin/python benchmarks/controller_tick_profile.py --jobs 1000 --profile

What it leaves out, against ``benchmarks/controller_scale.py``: HTTP, the watch threads, the
Kubernetes and Prometheus servers. It is meant for comparing versions of the pure phases (run it
on both, interleaved: the machine is shared).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_scheduler.controller import Controller, ControllerMetrics, PolicySource
from gpu_scheduler.kube import NodeState, PodState, PyTorchJobState
from gpu_scheduler.observe.kubernetes import ClusterChanges
from gpu_scheduler.observe.prometheus import metrics_from_results, parse_vector_json
from gpu_scheduler.settings import PolicyConfig

T0_S = 1_800_000_000.0


@dataclasses.dataclass
class _State:
    nodes: tuple[NodeState, ...]
    pods: tuple[PodState, ...]
    jobs: tuple[PyTorchJobState, ...]


class FakeCluster:
    """The watch caches' contents, with 1 % of the jobs changing between ticks."""

    def __init__(self, jobs: int, nodes: int, gpus_per_node: int, seed: int = 0) -> None:
        self.nodes = tuple(NodeState(name=f"bench-{i}", gpus=gpus_per_node) for i in range(nodes))
        self.jobs: list[PyTorchJobState] = []
        self.pods: list[PodState] = []
        self._random = random.Random(seed)
        self._revision = 0
        slots = nodes * gpus_per_node
        two_worker_jobs = max(0, slots - jobs)
        slot = 0
        for j in range(jobs):
            name, workers = f"j-{j:05d}", 2 if j < two_worker_jobs else 1
            self.jobs.append(PyTorchJobState(
                namespace="bench", name=name, uid=f"u{j}", resource_version=str(1000 + j),
                created_at_s=T0_S - 400 + j * 0.01, started_at_s=T0_S - 300, spec_workers=workers,
                min_workers=1, max_workers=4, gpus_per_worker=1, nproc_per_node=1))
            for w in range(workers):
                bound = slot < slots
                self.pods.append(PodState(
                    namespace="bench", name=f"{name}-worker-{w}", job_name=name, worker=True,
                    node=f"bench-{slot // gpus_per_node}" if bound else None,
                    phase="Running" if bound else "Pending", gpus=1,
                    started_at_s=T0_S - 300 if bound else None, created_at_s=T0_S - 320))
                slot += 1

    def state(self) -> _State:
        return _State(self.nodes, tuple(self.pods), tuple(self.jobs))

    def changes(self, since: Any) -> ClusterChanges:
        self._revision += 1
        if since is None:
            return ClusterChanges(revision=(0, 0, 0, self._revision), state=self.state())
        changed = {}
        for j in self._random.sample(range(len(self.jobs)), max(1, len(self.jobs) // 100)):
            job = self.jobs[j]
            self.jobs[j] = dataclasses.replace(job, resource_version=str(int(job.resource_version or 0) + 1))
            changed[job.key] = self.jobs[j]
        return ClusterChanges(revision=(0, 0, 0, self._revision), jobs=changed, pods={}, nodes=None)


class CannedPrometheus:
    """The five answers as Prometheus sends them (bytes), decoded by the controller every tick."""

    def __init__(self, cluster: FakeCluster, window_s: float = 60.0) -> None:
        def vector(result: list[dict[str, Any]]) -> bytes:
            return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

        jobs = [f"bench/{j.name}" for j in cluster.jobs]
        self.window_s = window_s
        self.answers = {
            "gpu_busy": vector([{"metric": {"namespace": "bench", "pod": p.name, "source": "gr_engine_active"},
                                 "value": [T0_S, "0.9"]} for p in cluster.pods if p.node]),
            "samples": vector([{"metric": {"job_key": k}, "value": [T0_S, "186.6"]} for k in jobs]),
            "world_size": vector([{"metric": {"job_key": k}, "value": [T0_S, "2"]} for k in jobs]),
            "work": vector([{"metric": {"job_key": k, "gauge": g}, "value": [T0_S, v]} for k in jobs
                            for g, v in (("step", "100"), ("total_steps", "1000"), ("global_batch_size", "256"))]),
            "goodput": vector([]),
        }

    def observe(self, now_s: float) -> Any:
        results = {key: parse_vector_json(raw)[0] for key, raw in self.answers.items()}
        return metrics_from_results(results, taken_at_s=now_s, window_s=self.window_s)


class NoWrites:
    def apply(self, actions: Any) -> list[Any]:
        return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=1024)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=8)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--profile", action="store_true", help="cProfile one tick (the fifth) and print its top")
    args = parser.parse_args()
    cluster = FakeCluster(args.jobs, args.nodes, args.gpus_per_node)
    prometheus = CannedPrometheus(cluster)
    clock = [T0_S]
    controller = Controller(cluster=cluster, prometheus=prometheus, actuator=NoWrites(),
                            policies=PolicySource(PolicyConfig(name=args.policy)), clock=lambda: clock[0],
                            metrics=ControllerMetrics(), manage_gc=True)
    controller.tick()  # the first tick joins everything
    profiler = cProfile.Profile()
    cpu: list[float] = []
    phases: dict[str, list[float]] = {}
    try:
        for i in range(args.ticks):
            clock[0] += 60
            profiling = args.profile and i == min(4, args.ticks - 1)
            if profiling:
                profiler.enable()
            started = time.process_time()
            report = controller.tick()
            cpu.append(time.process_time() - started)
            if profiling:
                profiler.disable()
            if report.skipped:
                print(f"tick skipped: {report.skipped}", file=sys.stderr)
                return 1
            for name, seconds in report.phases_cpu_s.items():
                phases.setdefault(name, []).append(seconds)
    finally:
        controller.close()
    print(f"{args.jobs} jobs on {args.nodes} nodes x {args.gpus_per_node} GPUs, {args.ticks} ticks: CPU per tick "
          f"min {min(cpu):.3f} s, median {statistics.median(cpu):.3f} s (process CPU, every thread)")
    print("CPU per phase, min over the ticks (s):",
          ", ".join(f"{k} {min(v):.4f}" for k, v in phases.items()))
    if args.profile:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
