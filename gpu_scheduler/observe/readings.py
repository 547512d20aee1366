"""Prometheus readings as plain frozen values (what :mod:`.prometheus` returns and
:mod:`.snapshot` consumes); no client imported here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["JobThroughput", "MetricsSample", "PodGpu"]


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
class MetricsSample:
    """One round of Prometheus readings.

    Attributes:
        taken_at_s: evaluation time (Unix s).
        window_s: averaging window.
        pods: GPU activity by ``(namespace, pod)``.
        jobs: trainer throughput by ``job_key``.
    """

    taken_at_s: float
    window_s: float
    pods: Mapping[tuple[str, str], PodGpu] = field(default_factory=lambda: MappingProxyType({}))
    jobs: Mapping[str, JobThroughput] = field(default_factory=lambda: MappingProxyType({}))
