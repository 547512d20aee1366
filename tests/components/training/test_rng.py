"""RNG capture/restore of one rank (components/training/rng.py)."""

from __future__ import annotations

import random

import numpy as np
import torch

from components.training import rng


def test_restore_continues_every_cpu_stream_exactly() -> None:
    rng.seed_all(7)
    state = rng.capture()
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    rng.seed_all(8)
    rng.restore(state)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert [random.random() for _ in range(3)] == expected[2]


class FakeCuda:
    """torch.cuda's RNG calls for a node of ``count`` devices (pure logic: which device's state goes where)."""

    def __init__(self, count: int, current: int) -> None:
        self.count, self.current = count, current
        self.states = {i: torch.tensor([i], dtype=torch.uint8) for i in range(count)}

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[int(device)].clone())
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": self.states.__setitem__(int(device), s))


def test_a_rank_gets_its_own_device_stream_back_when_the_gpus_per_node_change(monkeypatch) -> None:
    """Review (2026-11-29): every device's state was saved and restored by index, so a rank that ran
    on device 3 (4 GPUs per node) and restarts on device 1 (2 per node, same world size) continued
    device 1's old stream, another rank's, instead of its own."""
    before = FakeCuda(count=4, current=3)
    before.install(monkeypatch)
    state = rng.capture()
    assert torch.equal(state["cuda"], torch.tensor([3], dtype=torch.uint8))
    after = FakeCuda(count=2, current=1)
    after.install(monkeypatch)
    rng.restore(state)
    assert torch.equal(after.states[1], torch.tensor([3], dtype=torch.uint8))  # its own stream
    assert torch.equal(after.states[0], torch.tensor([0], dtype=torch.uint8))  # another rank's device untouched
    # A checkpoint written before (one state per device) is still restored by index.
    old = {**state, "cuda": [torch.tensor([9], dtype=torch.uint8), torch.tensor([8], dtype=torch.uint8)]}
    rng.restore(old)
    assert [int(after.states[i]) for i in (0, 1)] == [9, 8]
