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
    """The trainer's progress of one job (latest values in the window).

    Attributes:
        step: completed optimizer steps (``trainflow_step``).
        total_steps: optimizer steps the job trains for (``trainflow_total_steps``; fixed epochs).
        global_batch_size: samples per optimizer step, all ranks (``trainflow_global_batch_size``).
    """

    step: float
    total_steps: float
    global_batch_size: float

    @property
    def remaining_samples(self) -> float:
        """``(total_steps − step) × global_batch_size``, never negative."""
        return max(self.total_steps - self.step, 0.0) * self.global_batch_size


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """One round of Prometheus readings.

    Attributes:
        taken_at_s: evaluation time (Unix s).
        window_s: averaging window.
        pods: GPU activity by ``(namespace, pod)``.
        jobs: trainer throughput by ``job_key``.
        work: trainer progress by ``job_key`` (jobs exporting all three gauges only).
    """

    taken_at_s: float
    window_s: float
    pods: Mapping[tuple[str, str], PodGpu] = field(default_factory=lambda: MappingProxyType({}))
    jobs: Mapping[str, JobThroughput] = field(default_factory=lambda: MappingProxyType({}))
    work: Mapping[str, JobWork] = field(default_factory=lambda: MappingProxyType({}))
