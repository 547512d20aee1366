"""Prometheus readings as plain frozen values (what :mod:`.prometheus` returns and
:mod:`.snapshot` consumes); no client imported here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["JobThroughput", "JobWork", "MetricsSample", "PodGpu"]


@dataclass(frozen=True, slots=True)
class PodGpu:
    """GPU activity of one pod over the window.

    Attributes:
        busy: fraction of time the pod's GPUs were busy, 0..1 — ``GR_ENGINE_ACTIVE`` if exported,
            else ``GPU_UTIL / 100``.
        source: ``"gr_engine_active"`` or ``"gpu_util"``.
    """

    busy: float
    source: str


@dataclass(frozen=True, slots=True)
class JobThroughput:
    """Trainer throughput of one job over the window.

    Attributes:
        samples_per_s: mean samples/s (all ranks).
        world_size: the world size if it was constant over the window, else None (a resize
            happened: the throughput belongs to no single worker count).
    """

    samples_per_s: float
    world_size: int | None


@dataclass(frozen=True, slots=True)
class JobWork:
    """The trainer's work left for one job (latest values in the window).

    A fixed-batch trainer exports its steps; an adaptive-batch trainer (its global batch follows
    the allocation) exports the work left directly, in samples at its initial batch size that
    make the same statistical progress (``trainflow_remaining_samples``).

    Attributes:
        step: completed optimizer steps (``trainflow_step``).
        total_steps: optimizer steps the job trains for (``trainflow_total_steps``; fixed epochs).
        global_batch_size: samples per optimizer step, all ranks (``trainflow_global_batch_size``);
            the current one for an adaptive job.
        reported_remaining_samples: ``trainflow_remaining_samples`` (adaptive jobs), else None.
    """

    step: float = 0.0
    total_steps: float = 0.0
    global_batch_size: float = 0.0
    reported_remaining_samples: float | None = None

    @property
    def adaptive(self) -> bool:
        """The trainer adapts its batch (its work is reported in samples, not steps)."""
        return self.reported_remaining_samples is not None

    @property
    def remaining_samples(self) -> float:
        """The reported samples left, else ``(total_steps − step) × global_batch_size``; never
        negative."""
        if self.reported_remaining_samples is not None:
            return max(self.reported_remaining_samples, 0.0)
        return max(self.total_steps - self.step, 0.0) * self.global_batch_size


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """One round of Prometheus readings.

    Attributes:
        taken_at_s: evaluation time (Unix s).
        window_s: averaging window.
        pods: GPU activity by ``(namespace, pod)``.
        jobs: trainer throughput by ``job_key``.
        work: trainer progress by ``job_key`` (jobs exporting all three step gauges, or
            ``trainflow_remaining_samples``).
        goodput: adaptive-batch jobs' goodput curves by ``job_key``: world size -> samples/s at
            the initial batch size (``trainflow_goodput_samples_per_second``), the latest values.
    """

    taken_at_s: float
    window_s: float
    pods: Mapping[tuple[str, str], PodGpu] = field(default_factory=lambda: MappingProxyType({}))
    jobs: Mapping[str, JobThroughput] = field(default_factory=lambda: MappingProxyType({}))
    work: Mapping[str, JobWork] = field(default_factory=lambda: MappingProxyType({}))
    goodput: Mapping[str, Mapping[int, float]] = field(default_factory=lambda: MappingProxyType({}))
