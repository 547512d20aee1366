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
  Where Prometheus scrapes the exporter with ``honorLabels: false`` (the Prometheus Operator's
  default for a ServiceMonitor or PodMonitor), the exporter's ``pod`` / ``namespace`` labels arrive
  renamed ``exported_pod`` / ``exported_namespace`` and ``pod`` names the exporter's own pod
  (NVIDIA/dcgm-exporter#85); those series are attributed by ``exported_*`` (the exporter pod's own
  reading is a pod no job has, so it is never used).
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
  the trainer with its current gradient noise scale at every world size it has run at, and
  predicted at 2x and 3x the widest), the latest value per world size. For such a job this curve *is* ``Job.throughput``.

Every value is averaged over ``window_s`` (``avg_over_time``), evaluated at the controller's clock.
Any failure (connection refused, timeout, HTTP error, ``status: error``, malformed JSON) raises
:class:`PrometheusUnavailable`: the controller then changes nothing.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import httpx
import msgspec

from gpu_scheduler.model import SchedulerError
from gpu_scheduler.observe.readings import JobThroughput, JobWork, MetricsSample, PodGpu

T = TypeVar("T")

__all__ = [
    "QUERIES",
    "QUERY_GOODPUT_BY_JOB",
    "QUERY_GPU_BUSY_BY_POD",
    "QUERY_SAMPLES_PER_SECOND_BY_JOB",
    "QUERY_STABLE_WORLD_SIZE_BY_JOB",
    "QUERY_WORK_BY_JOB",
    "RECORDED",
    "RULES_WINDOW",
    "JobThroughput",
    "JobWork",
    "MetricsSample",
    "PodGpu",
    "PrometheusObserver",
    "PrometheusUnavailable",
    "metrics_from_results",
    "parse_vector",
    "parse_vector_json",
]

log = logging.getLogger("gpu_scheduler.observe.prometheus")

def _busy_by_pod(metric: str, scale: str, source: str) -> str:
    """Per pod busy fraction of one DCGM metric: series labelled by the pod itself (``pod``), or,
    scraped with ``honorLabels: false``, by ``exported_pod`` (then relabelled ``pod``)."""
    own = f'avg by (namespace, pod) (avg_over_time({metric}{{{{pod!=""}}}}[{{window}}])){scale}'
    exported = (
        f'label_replace(label_replace(avg by (exported_namespace, exported_pod) '
        f'(avg_over_time({metric}{{{{exported_pod!=""}}}}[{{window}}])){scale},'
        f' "namespace", "$1", "exported_namespace", "(.*)"), "pod", "$1", "exported_pod", "(.*)")'
    )
    return (f'label_replace({own}, "source", "{source}", "", "")'
            f' or on (namespace, pod) label_replace({exported}, "source", "{source}", "", "")')


#: Busy fraction (0..1) per pod over the window, averaged over the pod's GPUs: the engine-active
#: ratio where the GPU exports profiling metrics, else GPU utilisation / 100 (``or on`` keeps the
#: right side only for pods the left side lacks); the ``source`` label says which.
QUERY_GPU_BUSY_BY_POD = (
    _busy_by_pod("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "", "gr_engine_active")
    + " or on (namespace, pod) "
    + _busy_by_pod("DCGM_FI_DEV_GPU_UTIL", " / 100", "gpu_util")
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
_STEP_GAUGE_SET = frozenset(STEP_GAUGES)
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


#: The window of the recording rules that evaluate :data:`QUERIES` in Prometheus' own rule loop
#: (``manifests/components/monitoring/prometheusrule.yaml``, group ``trainflow-gpu-scheduler-inputs``;
#: a test keeps their expressions equal to ``QUERIES[key].format(window=RULES_WINDOW)``).
RULES_WINDOW = "5m"
#: The series those rules record, by query key; with ``recorded=True`` the observer reads these
#: (instant selectors: Prometheus looks the values up instead of evaluating the windows at every
#: tick, so its time drops out of the tick; the readings are then up to one rule interval old).
RECORDED: Mapping[str, str] = MappingProxyType({key: f"trainflow_scheduler:{key}:{RULES_WINDOW}" for key in QUERIES})


class PrometheusUnavailable(SchedulerError):
    """Prometheus could not answer (the message says why, in one line)."""


class _Labels(msgspec.Struct, frozen=True, gc=False):
    """The labels the controller reads from an answer (the decoder skips all others); read with
    ``.get(name, default)`` like the label dict :func:`parse_vector` returns (Prometheus never
    sends an empty label value: empty means absent)."""

    namespace: str = ""
    pod: str = ""
    source: str = ""
    job_key: str = ""
    gauge: str = ""
    world_size: str = ""

    def get(self, key: str, default: str | None = None) -> str | None:
        value = getattr(self, key, "")
        return value if value else default

    @classmethod
    def of(cls, labels: Mapping[str, str]) -> _Labels:
        """The labels the controller reads from a label dict (others dropped)."""
        return cls(**{name: str(labels[name]) for name in cls.__struct_fields__ if labels.get(name)})

    def as_dict(self) -> dict[str, str]:
        return {name: value for name in self.__struct_fields__ if (value := getattr(self, name))}


class _Sample(msgspec.Struct, gc=False):
    metric: _Labels
    value: tuple[float, float]  # decoded non-strictly: Prometheus sends the value as a string


class _Vector(msgspec.Struct):
    resultType: str
    result: list[_Sample]
    stats: dict[str, Any] | None = None


class _Answer(msgspec.Struct):
    status: str
    data: _Vector


_DECODE = msgspec.json.Decoder(_Answer, strict=False)


def _finite(samples: Iterable[tuple[dict[str, str], str]]) -> list[tuple[dict[str, str], float]]:
    """``(labels, value)`` with the value as a float; NaN and infinite samples dropped."""
    out: list[tuple[dict[str, str], float]] = []
    for labels, raw in samples:
        value = float(raw)
        if math.isfinite(value):
            out.append((labels, value))
    return out


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
    pairs: list[tuple[dict[str, str], str]] = []
    for item in data["result"]:
        try:
            labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
            raw = item["value"][1]
            float(raw)
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise PrometheusUnavailable(f"malformed sample in Prometheus answer: {item!r}") from exc
        pairs.append((labels, raw))
    return _finite(pairs)


def parse_vector_json(raw: bytes) -> tuple[list[tuple[Any, float]], Mapping[str, Any]]:
    """:func:`parse_vector` of the answer's bytes, decoded straight into typed values (msgspec;
    only the labels the controller reads, each pair's labels readable with ``.get``), plus the
    answer's ``data.stats`` (empty unless the query asked for ``stats``).

    Raises:
        PrometheusUnavailable: as :func:`parse_vector` (anything but a plain vector answer, e.g.
            an error, or a ``+Inf`` value the typed decoder does not read, goes through it).
    """
    try:
        answer = _DECODE.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        answer = None
    if answer is None or answer.status != "success" or answer.data.resultType != "vector":
        try:
            payload = json.loads(raw)
        except ValueError:
            raise PrometheusUnavailable("Prometheus answered malformed JSON") from None
        return parse_vector(payload), {}
    samples = _TypedSamples((s.metric, s.value[1]) for s in answer.data.result if math.isfinite(s.value[1]))
    return samples, answer.data.stats or {}


class _TypedSamples(list):
    """Samples whose label sets are all :class:`_Labels` already (:func:`parse_vector_json`'s)."""


def _typed(samples: Iterable[tuple[Any, float]]) -> Iterable[tuple[_Labels, float]]:
    """``samples`` with every label set as :class:`_Labels` (answers decoded by msgspec already are:
    they are handed back as they are; :func:`parse_vector`'s label dicts are converted)."""
    if type(samples) is _TypedSamples:
        return samples
    return [((labels if type(labels) is _Labels else _Labels.of(labels)), value) for labels, value in samples]


def metrics_from_results(
    results: Mapping[str, Sequence[tuple[Mapping[str, str], float]]], *, taken_at_s: float, window_s: float
) -> MetricsSample:
    """Combine the parsed answers of :data:`QUERIES` (by key) into a :class:`MetricsSample`. Pure.

    Labels are read as attributes of :class:`_Labels` (one attribute load per label instead of a
    method call: at 5,000 jobs this loop runs over ~30,000 samples per tick)."""
    pods: dict[tuple[str, str], PodGpu] = {}
    for labels, value in _typed(results.get("gpu_busy", ())):
        if labels.pod:
            pods[labels.namespace, labels.pod] = PodGpu(busy=min(max(value, 0.0), 1.0),
                                                         source=labels.source or "gr_engine_active")
    stable = {labels.job_key: v for labels, v in _typed(results.get("world_size", ()))}
    jobs: dict[str, JobThroughput] = {}
    for labels, value in _typed(results.get("samples", ())):
        key = labels.job_key
        if not key or value < 0:
            continue
        size = stable.get(key)
        ok = size is not None and size >= 1 and float(size).is_integer()
        jobs[key] = JobThroughput(samples_per_s=value, world_size=int(size) if ok else None)  # type: ignore[arg-type]
    gauges: dict[str, dict[str, float]] = {}
    for labels, value in _typed(results.get("work", ())):
        key, gauge = labels.job_key, labels.gauge
        if key and gauge in WORK_GAUGES:
            entry = gauges.get(key)
            if entry is None:
                entry = gauges[key] = {}
            entry[gauge] = value
    work: dict[str, JobWork] = {}
    for key, g in gauges.items():
        if g.get("remaining_samples", -1.0) >= 0:
            work[key] = JobWork(global_batch_size=g.get("global_batch_size", 0.0),
                                reported_remaining_samples=g["remaining_samples"])
        elif len(g) >= 3 and g.keys() >= _STEP_GAUGE_SET and g["step"] >= 0 and g["total_steps"] > 0 \
                and g["global_batch_size"] > 0:
            work[key] = JobWork(step=g["step"], total_steps=g["total_steps"], global_batch_size=g["global_batch_size"])
    goodput: dict[str, dict[int, float]] = {}
    for labels, value in _typed(results.get("goodput", ())):
        key, size = labels.job_key, labels.world_size
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
        bearer_token_file: a file holding a bearer token sent with every query (e.g. a projected
            service-account token in front of kube-rbac-proxy or an OAuth proxy); re-read when it
            changes, so a rotated token is picked up. Should it go missing or empty later, each
            query raises :class:`PrometheusUnavailable` naming the file.
        ca_file: PEM bundle that verifies an ``https://`` Prometheus (default: the system's).
        query_stats: ask Prometheus for its own timings (``stats=all``); :attr:`last_query_s`
            then holds Prometheus' ``execTotalTime`` of each query of the last observation.
        recorded: read the series of the recording rules (:data:`RECORDED`; the monitoring
            component ships the rules) instead of evaluating :data:`QUERIES`; ``window_s`` is then
            the rules' :data:`RULES_WINDOW`.

    Attributes:
        requests: queries sent so far.
        last_bytes: bytes of the answers of the last :meth:`observe`.
        last_query_cpu_s: CPU seconds the query threads spent on the last :meth:`observe` (sending
            the queries, reading and decoding the answers; summed over the threads).
        last_query_s: Prometheus' own time per query of the last :meth:`observe` (with
            ``query_stats``; else empty).

    Raises:
        ValueError: on a non-http(s) URL, a non-positive window / timeout, or an unreadable
            ``ca_file`` / ``bearer_token_file``.
    """

    def __init__(
        self, url: str, *, window_s: float = 300.0, timeout_s: float = 5.0, client: httpx.Client | None = None,
        bearer_token_file: str | Path | None = None, ca_file: str | Path | None = None, query_stats: bool = False,
        recorded: bool = False,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, got {url!r}")
        if window_s <= 0 or timeout_s <= 0:
            raise ValueError(f"window_s and timeout_s must be > 0, got {window_s} and {timeout_s}")
        self.url = url.rstrip("/")
        self.window_s = window_s
        self._token = _TokenFile(Path(bearer_token_file)) if bearer_token_file else None
        if self._token is not None:
            self._token.read()  # fail now, with the path, rather than at the first tick
            if self.url.startswith("http://"):
                log.warning("sending a bearer token to Prometheus over plain http", extra={"prometheus": self.url})
        verify: Any = True
        if ca_file:
            import ssl

            try:
                verify = ssl.create_default_context(cafile=str(ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"Prometheus CA file {ca_file}: {exc}") from None
        self._client = client or httpx.Client(timeout=timeout_s, verify=verify)
        self.query_stats = query_stats
        self.recorded = recorded
        if recorded:
            self.window_s = float(RULES_WINDOW.rstrip("m")) * 60
        self.requests = 0
        self.last_bytes = 0
        self.last_query_cpu_s = 0.0
        self.last_query_s: dict[str, float] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=len(QUERIES), thread_name_prefix="promql")

    def close(self) -> None:
        """Close the client once no query is in flight (queued ones are cancelled; a running one
        ends within ``timeout_s``): a socket closed under a thread still reading it frees its
        descriptor for the next connection of the process, whose bytes that read would then take
        (docs/scheduler.md, "Stopping the informers")."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()

    def _send(self, promql: str, at_s: float) -> tuple[list[tuple[Any, float]], Mapping[str, Any], int]:
        """One query: ``(samples, stats, answer bytes)``."""
        with self._lock:
            self.requests += 1
        form = {"query": promql, "time": f"{at_s:.3f}"}
        if self.query_stats:
            form["stats"] = "all"
        headers = None
        if self._token is not None:
            try:
                headers = {"Authorization": f"Bearer {self._token.read()}"}
            except ValueError as exc:  # the file went missing or empty since start-up: no query can be sent
                raise PrometheusUnavailable(f"Prometheus at {self.url} not queried: {exc}") from None
        try:
            response = self._client.post(f"{self.url}/api/v1/query", data=form, headers=headers)
            raw = response.content
        except httpx.HTTPError as exc:
            raise PrometheusUnavailable(f"Prometheus at {self.url} unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code in (401, 403):
            raise PrometheusUnavailable(
                f"Prometheus at {self.url} refused the query: HTTP {response.status_code} (check the bearer token)")
        try:
            samples, stats = parse_vector_json(raw)
        except PrometheusUnavailable as exc:
            if "malformed JSON" in str(exc):
                raise PrometheusUnavailable(
                    f"Prometheus at {self.url} answered HTTP {response.status_code} without JSON") from None
            raise
        return samples, stats, len(raw)

    def query(self, promql: str, at_s: float) -> list[tuple[dict[str, str], float]]:
        """One instant query at ``at_s``.

        Raises:
            PrometheusUnavailable: on any transport, HTTP or answer error.
        """
        return [(labels if isinstance(labels, dict) else labels.as_dict(), value)
                for labels, value in self._send(promql, at_s)[0]]

    def observe(self, now_s: float) -> MetricsSample:
        """Run every query at ``now_s`` (concurrently).

        Raises:
            PrometheusUnavailable: if any query fails (partial readings are never used).
        """
        window = _window(self.window_s)
        queries = RECORDED if self.recorded else {key: q.format(window=window) for key, q in QUERIES.items()}
        futures = {key: self._pool.submit(_cpu_timed, self._send, q, now_s) for key, q in queries.items()}
        timed = {key: f.result() for key, f in futures.items()}
        answers = {key: answer for key, (answer, _) in timed.items()}
        self.last_query_cpu_s = sum(cpu_s for _, cpu_s in timed.values())
        self.last_bytes = sum(size for _, _, size in answers.values())
        self.last_query_s = {key: float((stats.get("timings") or {}).get("execTotalTime", 0.0))
                             for key, (_, stats, _) in answers.items() if stats}
        return metrics_from_results({key: samples for key, (samples, _, _) in answers.items()},
                                    taken_at_s=now_s, window_s=self.window_s)


def _cpu_timed(call: Callable[..., T], *args: Any) -> tuple[T, float]:
    """``call(*args)`` and the CPU seconds this thread spent on it."""
    cpu = time.thread_time()
    return call(*args), time.thread_time() - cpu


class _TokenFile:
    """A bearer token read from a file, re-read when the file changes (rotated tokens)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[float, int] | None = None
        self._token = ""

    def read(self) -> str:
        """The token. Raises ValueError (naming the file) if it is missing, unreadable or empty."""
        try:
            st = self.path.stat()
            if (st.st_mtime, st.st_size) != self._seen:
                token = self.path.read_text().strip()
                if not token:
                    raise ValueError(f"bearer token file {self.path} is empty")
                self._token, self._seen = token, (st.st_mtime, st.st_size)
        except OSError as exc:
            raise ValueError(f"bearer token file {self.path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValueError(f"bearer token file {self.path} is not UTF-8 text") from None
        return self._token
