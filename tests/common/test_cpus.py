"""trainflow.common.cpus: the CPU count a rank's torch threads are sized to."""

from __future__ import annotations

import os

import pytest

from trainflow.common.cpus import CPU_REQUEST_ENV, threads_per_rank, usable_cpus

AFFINITY = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("millicores", "cpus"),
    [("500", 1), ("1000", 1), ("1999", 1), ("4000", 4), ("64000", 64)],
)
def test_the_pods_cpu_request_decides_rounded_down_to_whole_cpus(millicores: str, cpus: int) -> None:
    assert usable_cpus({CPU_REQUEST_ENV: millicores}) == cpus


@pytest.mark.parametrize("value", ["", "0", "lots", "-3"])
def test_no_request_falls_back_to_the_affinity_mask(value: str) -> None:
    assert usable_cpus({CPU_REQUEST_ENV: value}) == AFFINITY
    assert usable_cpus({}) == AFFINITY


def test_threads_are_the_cpus_shared_by_the_local_ranks_at_least_one() -> None:
    assert threads_per_rank(4, {CPU_REQUEST_ENV: "8000"}) == 2
    assert threads_per_rank(1, {CPU_REQUEST_ENV: "8000"}) == 8
    assert threads_per_rank(8, {CPU_REQUEST_ENV: "2000"}) == 1
    assert threads_per_rank(0, {CPU_REQUEST_ENV: "3000"}) == 3
