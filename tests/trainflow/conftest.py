"""Fixtures shared by the trainflow tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def torch_globals():
    """Trainer() sets torch's thread count and deterministic-algorithms flag for the process: put them back."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch._C._set_deterministic_algorithms(deterministic)
