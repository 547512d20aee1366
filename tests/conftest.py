"""Shared fixtures. Server fixtures for each tier live next to the tests that use them;
process management and free ports come from tests/support/processes.py."""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.support.parallel",  # first: tests.support.k8s imports it
    "tests.support.s3",
    "tests.support.training",
    "tests.support.kfp_server",
    "tests.support.airflow",
    "tests.support.k8s",
    "tests.support.kfp_backend",
    "tests.support.realnode_s3",
    "tests.support.prometheus",
    "tests.support.dcgm_exporter",
]

IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_report_header(config: pytest.Config) -> str:
    return f"trainflow tests (CI={IN_CI})"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The controller (or a serial run) clears the last run's lists of SIGKILLed servers."""
    from tests.support.processes import artifacts_root

    if "PYTEST_XDIST_WORKER" not in os.environ:
        for stale in artifacts_root().glob("sigkilled-processes*.tsv"):
            stale.unlink(missing_ok=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Name the servers that ignored SIGTERM (each cost its teardown ``stop_timeout_s``)."""
    from tests.support.processes import write_stops

    write_stops(os.environ.get("PYTEST_XDIST_WORKER", ""))


@pytest.fixture
def torch_globals():
    """Trainer() sets torch's thread count and deterministic-algorithms flag for the process: put them back."""
    import torch  # here, not at the top: most tests never import torch

    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch._C._set_deterministic_algorithms(deterministic)
