"""A simulated NVIDIA dcgm-exporter (plus the trainer's gauges) on 127.0.0.1, for tests.

There are no GPUs here, so GPU metrics come from this exporter: a prometheus_client server whose
series have the names and labels of the real dcgm-exporter with pod attribution on
(``DCGM_FI_DEV_GPU_UTIL`` in percent, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` as a 0..1 ratio; labels
``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``, ``container``, ``namespace``, ``pod``;
one series per GPU), and the trainer's ``trainflow_samples_per_second`` /
``trainflow_world_size`` (and, where set, ``trainflow_step`` / ``trainflow_total_steps`` /
``trainflow_global_batch_size``; for an adaptive-batch job ``trainflow_remaining_samples`` and
``trainflow_goodput_samples_per_second`` per ``world_size``) labelled ``job_key``. Values are set per
pod and per job by the test.

``pod_labels=False`` serves the same GPUs with empty ``pod``/``namespace``/``container`` — what
dcgm-exporter does without ``--kubernetes`` — to test the "missing metrics" path.

:meth:`DcgmExporter.follow` keeps the series in step with a namespace's PyTorchJob worker pods on
a real API server (watched with the scheduler's own informer): a pod gets series while it is Running on a node, and
each job's throughput is ``speedup(workers)``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tests.support.processes import free_port

GPU_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "container", "namespace", "pod"]


@dataclass
class _Pod:
    gpus: int
    busy: float
    node: str
    container: str


class DcgmExporter(Collector):
    """Serves ``/metrics`` on ``127.0.0.1:<port>``; mutate it with the ``set_*`` / ``remove_*`` methods."""

    def __init__(self, *, pod_labels: bool = True, profiling: bool = True) -> None:
        self.pod_labels = pod_labels
        self.profiling = profiling
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._jobs: dict[str, tuple[float, int]] = {}
        self._work: dict[str, tuple[float, float, float]] = {}
        self._adaptive: dict[str, tuple[float, dict[int, float]]] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._following: tuple[threading.Event, threading.Thread, Any] | None = None
        self.port = 0

    # -- values ---------------------------------------------------------------------------------

    def set_pod(self, namespace: str, pod: str, *, gpus: int = 1, busy: float = 0.9, node: str = "node-0",
                container: str = "pytorch") -> None:
        with self._lock:
            self._pods[(namespace, pod)] = _Pod(gpus=gpus, busy=busy, node=node, container=container)

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._pods.pop((namespace, pod), None)

    def set_job(self, job_key: str, samples_per_s: float, world_size: int) -> None:
        with self._lock:
            self._jobs[job_key] = (samples_per_s, world_size)

    def remove_job(self, job_key: str) -> None:
        with self._lock:
            self._jobs.pop(job_key, None)
            self._work.pop(job_key, None)
            self._adaptive.pop(job_key, None)

    def set_work(self, job_key: str, step: float, total_steps: float, global_batch_size: float) -> None:
        """The trainer's progress gauges (rank 0) for ``job_key``."""
        with self._lock:
            self._work[job_key] = (step, total_steps, global_batch_size)

    def set_adaptive(self, job_key: str, remaining_samples: float, goodput_by_world_size: dict[int, float]) -> None:
        """An adaptive-batch trainer's gauges (rank 0) for ``job_key``."""
        with self._lock:
            self._adaptive[job_key] = (remaining_samples, dict(goodput_by_world_size))

    def pods(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._pods)

    # -- exposition -----------------------------------------------------------------------------

    def collect(self) -> Iterator[GaugeMetricFamily]:
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=GPU_LABELS)
        active = GaugeMetricFamily("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
                                   labels=GPU_LABELS)
        samples = GaugeMetricFamily("trainflow_samples_per_second", "Training throughput.", labels=["job_key"])
        world = GaugeMetricFamily("trainflow_world_size", "Ranks in the worker group.", labels=["job_key"])
        with self._lock:
            pods = sorted(self._pods.items())
            jobs = sorted(self._jobs.items())
            work = sorted(self._work.items())
            adaptive = sorted(self._adaptive.items())
        gpu_index: dict[str, int] = {}
        for (namespace, name), p in pods:
            for _ in range(p.gpus):
                i = gpu_index.get(p.node, 0)
                gpu_index[p.node] = i + 1
                attributed = (p.container, namespace, name) if self.pod_labels else ("", "", "")
                labels = [str(i), f"GPU-{p.node}-{i:02d}", f"nvidia{i}", "NVIDIA H100 80GB HBM3", p.node, *attributed]
                util.add_metric(labels, round(p.busy * 100.0, 3))
                active.add_metric(labels, p.busy)
        for key, (sps, ws) in jobs:
            samples.add_metric([key], sps)
            world.add_metric([key], float(ws))
        yield util
        if self.profiling:
            yield active
        yield samples
        yield world
        gauges = [GaugeMetricFamily(f"trainflow_{g}", g, labels=["job_key"])
                  for g in ("step", "total_steps", "global_batch_size")]
        for key, values in work:
            for family, value in zip(gauges, values, strict=True):
                family.add_metric([key], float(value))
        if work:
            yield from gauges
        if adaptive:
            left = GaugeMetricFamily("trainflow_remaining_samples", "Work left.", labels=["job_key"])
            goodput = GaugeMetricFamily("trainflow_goodput_samples_per_second", "Goodput per world size.",
                                        labels=["job_key", "world_size"])
            for key, (remaining, curve) in adaptive:
                left.add_metric([key], float(remaining))
                for size, value in sorted(curve.items()):
                    goodput.add_metric([key, str(size)], float(value))
            yield left
            yield goodput

    def start(self) -> DcgmExporter:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self.port = free_port()
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=registry)
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.stop_following()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
            self._server = None

    # -- following a namespace's pods -------------------------------------------------------------

    def follow(
        self,
        kubeconfig: str | Path,
        namespace: str,
        *,
        speedup: Callable[[str, int], float] = lambda job, workers: 100.0 * workers**0.9,
        busy: Callable[[str, int], float] = lambda job, workers: 0.9,
        trainer_metrics: bool = True,
        progress: bool = False,
        interval_s: float = 0.25,
    ) -> None:
        """Follow the namespace's pods (the scheduler's own :class:`Informer`: LIST + WATCH); every
        ``interval_s`` serve DCGM series for the Running PyTorchJob worker pods with GPUs and, per
        job, ``trainflow_samples_per_second = speedup(job, workers)`` with
        ``trainflow_world_size = workers x GPUs per worker`` (``job_key`` = ``namespace/job``); with
        ``progress``, also the trainer's step gauges (a step a second from when the job was first
        seen, of 10**6 steps at a global batch of 256). :meth:`stop_following` stops the watch too
        (within its 10 s server-side window; it opens no further one)."""
        from lightkube.resources.core_v1 import Pod

        from gpu_scheduler.observe.kubernetes import Informer, KubeConnector, pod_state

        def info(pod: Any) -> tuple[str, str, int, str] | None:
            """The scheduler's own reduction of the pod (:func:`pod_state`), kept while it is a
            Running, bound, not terminating PyTorchJob pod with GPUs."""
            state = pod_state(pod)
            if not state.job_name or state.terminating or state.phase != "Running" or not state.node:
                return None
            return (state.name, state.job_name, state.gpus, state.node) if state.gpus else None

        first_seen: dict[str, float] = {}
        stop = threading.Event()
        informer = Informer(KubeConnector(kubeconfig), Pod, info, name=f"dcgm-{namespace}", namespace=namespace,
                            watch_timeout_s=10)

        def publish() -> None:
            seen = {name: (job, gpus, node) for name, job, gpus, node in informer.items()}
            workers: dict[str, list[int]] = {}
            for job, gpus, _node in seen.values():
                workers.setdefault(job, []).append(gpus)
            for key in self.pods() - {(namespace, name) for name in seen}:
                if key[0] == namespace:
                    self.remove_pod(*key)
            for name, (job, gpus, node) in seen.items():
                self.set_pod(namespace, name, gpus=gpus, busy=busy(job, len(workers[job])), node=node)
            with self._lock:
                stale = [k for k in self._jobs if k.startswith(f"{namespace}/") and k.split("/", 1)[1] not in workers]
            for key in stale:
                self.remove_job(key)
            if trainer_metrics:
                now = time.monotonic()
                for job, gpu_list in workers.items():
                    self.set_job(f"{namespace}/{job}", speedup(job, len(gpu_list)), sum(gpu_list))
                    if progress:
                        started = first_seen.setdefault(job, now)
                        self.set_work(f"{namespace}/{job}", step=round(now - started), total_steps=10**6,
                                      global_batch_size=256)

        def loop() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    publish()
                stop.wait(interval_s)

        self.stop_following()
        informer.start()
        informer.wait_synced(30)
        publish()
        thread = threading.Thread(target=loop, name="dcgm-follow", daemon=True)
        thread.start()
        self._following = (stop, thread, informer)

    def stop_following(self) -> None:
        """Stop publishing and the pod watch (idempotent)."""
        following, self._following = self._following, None
        if following is not None:
            stop, thread, informer = following
            stop.set()
            thread.join(timeout=5)
            informer.stop(timeout_s=0)


@pytest.fixture
def dcgm_exporter() -> Iterator[Callable[..., DcgmExporter]]:
    """Factory ``make(pod_labels=True, profiling=True) -> started DcgmExporter``; stopped after the test."""
    made: list[DcgmExporter] = []

    def make(**kwargs: Any) -> DcgmExporter:
        exporter = DcgmExporter(**kwargs).start()
        made.append(exporter)
        return exporter

    yield make
    for exporter in made:
        exporter.stop()


def main() -> None:
    """Run the exporter as its own process, following one namespace's worker pods, until SIGTERM:
    ``python -m tests.support.dcgm_exporter --kubeconfig FILE --namespace NS --port N``
    (the scale benchmark does, so the exporter's work does not share the controller's interpreter)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="Simulated dcgm-exporter following a namespace's worker pods.")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interval-s", type=float, default=2.0)
    parser.add_argument("--progress", action="store_true", help="also serve the trainers' step gauges")
    args = parser.parse_args()
    exporter = DcgmExporter()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    exporter.port = args.port
    exporter._server, _ = start_http_server(args.port, addr="127.0.0.1", registry=registry)
    exporter.follow(args.kubeconfig, args.namespace, interval_s=args.interval_s,
                    progress=args.progress)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    exporter.stop()


if __name__ == "__main__":
    main()
