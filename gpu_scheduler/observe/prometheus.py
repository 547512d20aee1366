"""Read GPU use and training throughput from Prometheus (HTTP API v1, instant queries over httpx).

Queries are named constants below; :func:`parse_vector` and :func:`metrics_from_results` are pure
and tested on canned JSON. What is read:

Five instant queries per tick, sent concurrently:

* DCGM exporter (NVIDIA ``dcgm-exporter``, default counters ``etc/default-counters.csv``), with pod
  attribution on (``--kubernetes``, the Helm chart's default), which labels each GPU's series with
  the ``namespace`` / ``pod`` / ``container`` holding it:

  - ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` — fraction of time the graphics/compute engine was busy,
    0..1 (profiling metric; tracks useful work better than ``GPU_UTIL``);
  - ``DCGM_FI_DEV_GPU_UTIL`` — percent of time any kernel ran, 0..100 (coarse; used when the
    profiling metric is not exported, e.g. on GPUs without DCP support).

  GPUs held by no pod carry ``pod=""``; they are ignored (``{pod!=""}``). One query returns, per
  pod, the engine-active ratio or, for pods whose GPUs do not export it, utilisation / 100.
* The trainer (``components/training/metrics.py``), labelled ``job_key``:
  ``trainflow_samples_per_second`` (all ranks) and ``trainflow_world_size``. A throughput is
  attributed to a worker count only if the world size did not change within the window
  (``min_over_time == max_over_time``, filtered server-side), so measurements across a resize are
  not mixed.
* The trainer's progress (rank 0, labelled ``job_key``): ``trainflow_step``,
  ``trainflow_total_steps`` and ``trainflow_global_batch_size``, the latest value of each in the
  window (``last_over_time``; ``max`` over a job's series, so a restarted trainer's newest step
  wins), tagged by a ``gauge`` label in one query. Work left = ``(total − step) × batch`` samples
  (``Job.remaining_samples``). A trainer whose global batch adapts to its allocation exports
  ``trainflow_remaining_samples`` instead (samples at its initial batch size), read by the same
  query.
* Adaptive-batch trainers' goodput curves: ``trainflow_goodput_samples_per_second`` labelled
  ``job_key`` and ``world_size`` (predicted samples/s at the initial batch size, re-evaluated by
  the trainer with its current gradient noise scale at every world size it has run at), the
  latest value per world size. For such a job this curve *is* ``Job.throughput``.

Every value is averaged over ``window_s`` (``avg_over_time``), evaluated at the controller's clock.
Any failure (connection refused, timeout, HTTP error, ``status: error``, malformed JSON) raises
:class:`PrometheusUnavailable`: the controller then changes nothing.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType
from typing import Any

import httpx

from gpu_scheduler.model import SchedulerError
from gpu_scheduler.observe.readings import JobThroughput, JobWork, MetricsSample, PodGpu

__all__ = [
    "QUERIES",
    "QUERY_GOODPUT_BY_JOB",
    "QUERY_GPU_BUSY_BY_POD",
    "QUERY_SAMPLES_PER_SECOND_BY_JOB",
    "QUERY_STABLE_WORLD_SIZE_BY_JOB",
    "QUERY_WORK_BY_JOB",
    "JobThroughput",
    "JobWork",
    "MetricsSample",
    "PodGpu",
    "PrometheusObserver",
    "PrometheusUnavailable",
    "metrics_from_results",
    "parse_vector",
]

#: Busy fraction (0..1) per pod over the window, averaged over the pod's GPUs: the engine-active
#: ratio where the GPU exports profiling metrics, else GPU utilisation / 100 (``or on`` keeps the
#: right side only for pods the left side lacks); the ``source`` label says which.
QUERY_GPU_BUSY_BY_POD = (
    'label_replace(avg by (namespace, pod) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{pod!=""}}[{window}])),'
    ' "source", "gr_engine_active", "", "")'
    " or on (namespace, pod) "
    'label_replace(avg by (namespace, pod) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[{window}])) / 100,'
    ' "source", "gpu_util", "", "")'
)
#: Mean training throughput (samples/s) per job over the window.
QUERY_SAMPLES_PER_SECOND_BY_JOB = "avg by (job_key) (avg_over_time(trainflow_samples_per_second[{window}]))"
#: The world size of each job whose world size did not change within the window (a filtering
#: comparison: jobs with min != max over the window are absent).
QUERY_STABLE_WORLD_SIZE_BY_JOB = (
    "min by (job_key) (min_over_time(trainflow_world_size[{window}]))"
    " == on (job_key) max by (job_key) (max_over_time(trainflow_world_size[{window}]))"
)

#: The trainer's step, total steps and global batch size per job (latest value in the window),
#: one series per job and gauge, told apart by the ``gauge`` label; adaptive-batch trainers
#: export ``remaining_samples`` (and the current global batch size) instead of the steps.
STEP_GAUGES = ("step", "total_steps", "global_batch_size")
WORK_GAUGES = (*STEP_GAUGES, "remaining_samples")
QUERY_WORK_BY_JOB = " or ".join(
    f'label_replace(max by (job_key) (last_over_time(trainflow_{g}[{{window}}])), "gauge", "{g}", "", "")'
    for g in WORK_GAUGES
)

#: Adaptive-batch jobs' predicted goodput per world size (latest value in the window).
QUERY_GOODPUT_BY_JOB = (
    "max by (job_key, world_size) (last_over_time(trainflow_goodput_samples_per_second[{window}]))"
)

QUERIES: Mapping[str, str] = MappingProxyType({
    "gpu_busy": QUERY_GPU_BUSY_BY_POD,
    "samples": QUERY_SAMPLES_PER_SECOND_BY_JOB,
    "world_size": QUERY_STABLE_WORLD_SIZE_BY_JOB,
    "work": QUERY_WORK_BY_JOB,
    "goodput": QUERY_GOODPUT_BY_JOB,
})


class PrometheusUnavailable(SchedulerError):
    """Prometheus could not answer (the message says why, in one line)."""


def parse_vector(payload: Any) -> list[tuple[dict[str, str], float]]:
    """Parse an instant-query answer (``/api/v1/query`` JSON) of result type ``vector``.

    Returns:
        ``(labels, value)`` pairs; NaN and infinite samples are dropped.

    Raises:
        PrometheusUnavailable: ``status`` is not ``success`` or the shape is not a vector.
    """
    if not isinstance(payload, Mapping):
        raise PrometheusUnavailable(f"Prometheus answered {type(payload).__name__}, not a JSON object")
    if payload.get("status") != "success":
        raise PrometheusUnavailable(
            f"Prometheus query failed: {payload.get('errorType', 'error')}: {payload.get('error', 'no message')}"
        )
    data = payload.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise PrometheusUnavailable("Prometheus answer is not an instant vector")
    out: list[tuple[dict[str, str], float]] = []
    for item in data["result"]:
        try:
            labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
            value = float(item["value"][1])
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise PrometheusUnavailable(f"malformed sample in Prometheus answer: {item!r}") from exc
        if math.isfinite(value):
            out.append((labels, value))
    return out


def metrics_from_results(
    results: Mapping[str, Sequence[tuple[Mapping[str, str], float]]], *, taken_at_s: float, window_s: float
) -> MetricsSample:
    """Combine the parsed answers of :data:`QUERIES` (by key) into a :class:`MetricsSample`. Pure."""
    pods: dict[tuple[str, str], PodGpu] = {}
    for labels, value in results.get("gpu_busy", ()):
        key = (labels.get("namespace", ""), labels.get("pod", ""))
        if key[1]:
            pods[key] = PodGpu(busy=min(max(value, 0.0), 1.0), source=labels.get("source", "gr_engine_active"))
    stable = {lbl.get("job_key", ""): v for lbl, v in results.get("world_size", ())}
    jobs: dict[str, JobThroughput] = {}
    for labels, value in results.get("samples", ()):
        key = labels.get("job_key", "")
        if not key or value < 0:
            continue
        size = stable.get(key)
        ok = size is not None and size >= 1 and float(size).is_integer()
        jobs[key] = JobThroughput(samples_per_s=value, world_size=int(size) if ok else None)  # type: ignore[arg-type]
    gauges: dict[str, dict[str, float]] = {}
    for labels, value in results.get("work", ()):
        key, gauge = labels.get("job_key", ""), labels.get("gauge", "")
        if key and gauge in WORK_GAUGES:
            gauges.setdefault(key, {})[gauge] = value
    work: dict[str, JobWork] = {}
    for key, g in gauges.items():
        if g.get("remaining_samples", -1.0) >= 0:
            work[key] = JobWork(global_batch_size=g.get("global_batch_size", 0.0),
                                reported_remaining_samples=g["remaining_samples"])
        elif all(k in g for k in STEP_GAUGES) and g["step"] >= 0 and g["total_steps"] > 0 and g["global_batch_size"] > 0:
            work[key] = JobWork(step=g["step"], total_steps=g["total_steps"], global_batch_size=g["global_batch_size"])
    goodput: dict[str, dict[int, float]] = {}
    for labels, value in results.get("goodput", ()):
        key, size = labels.get("job_key", ""), labels.get("world_size", "")
        if key and size.isdigit() and int(size) >= 1 and value > 0:
            goodput.setdefault(key, {})[int(size)] = value
    return MetricsSample(
        taken_at_s=taken_at_s, window_s=window_s, pods=MappingProxyType(pods), jobs=MappingProxyType(jobs),
        work=MappingProxyType(work),
        goodput=MappingProxyType({k: MappingProxyType(v) for k, v in goodput.items()}),
    )


def _window(window_s: float) -> str:
    return f"{max(1, round(window_s))}s"


class PrometheusObserver:
    """Runs :data:`QUERIES` against one Prometheus.

    Args:
        url: base URL, e.g. ``http://prometheus-operated.monitoring:9090``.
        window_s: averaging window of every query (seconds; a few scrape intervals at least).
        timeout_s: per-request timeout.
        client: an httpx client to use (tests may inject one); a new one otherwise.

    Raises:
        ValueError: on a non-http(s) URL or a non-positive window / timeout.
    """

    def __init__(
        self, url: str, *, window_s: float = 300.0, timeout_s: float = 5.0, client: httpx.Client | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, got {url!r}")
        if window_s <= 0 or timeout_s <= 0:
            raise ValueError(f"window_s and timeout_s must be > 0, got {window_s} and {timeout_s}")
        self.url = url.rstrip("/")
        self.window_s = window_s
        self._client = client or httpx.Client(timeout=timeout_s)
        self.requests = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def query(self, promql: str, at_s: float) -> list[tuple[dict[str, str], float]]:
        """One instant query at ``at_s``.

        Raises:
            PrometheusUnavailable: on any transport, HTTP or answer error.
        """
        with self._lock:
            self.requests += 1
        try:
            response = self._client.post(
                f"{self.url}/api/v1/query", data={"query": promql, "time": f"{at_s:.3f}"}
            )
        except httpx.HTTPError as exc:
            raise PrometheusUnavailable(f"Prometheus at {self.url} unreachable: {type(exc).__name__}: {exc}") from exc
        try:
            payload = response.json()
        except ValueError:
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} answered HTTP {response.status_code} without JSON"
            ) from None
        return parse_vector(payload)

    def observe(self, now_s: float) -> MetricsSample:
        """Run every query at ``now_s`` (concurrently).

        Raises:
            PrometheusUnavailable: if any query fails (partial readings are never used).
        """
        window = _window(self.window_s)
        with ThreadPoolExecutor(max_workers=len(QUERIES), thread_name_prefix="promql") as pool:
            futures = {key: pool.submit(self.query, q.format(window=window), now_s) for key, q in QUERIES.items()}
            results = {key: f.result() for key, f in futures.items()}
        return metrics_from_results(results, taken_at_s=now_s, window_s=self.window_s)
