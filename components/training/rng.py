"""Capture and restore every RNG stream of one rank: torch CPU, CUDA, NumPy and Python ``random``.

States are stored as tensors and plain ints/lists so checkpoints load with
``torch.load(weights_only=True)`` (NumPy's state tuple would otherwise need full unpickling).

CUDA: the state of this rank's own device (the current one: ``distributed.init_process_group`` sets
it), restored into the device the rank runs on after the restart. Restoring every device's state by
index, as before, gave a rank the stream of whatever device had that index in the old layout when
the GPUs per node changed at the same world size. Checkpoints written that way (a list, one state
per device) are still restored by index.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    """This process's RNG states (a dict of tensors, ints and floats)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": int(version), "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def restore(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture`."""
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))
    cuda = state.get("cuda")
    if cuda is None or not torch.cuda.is_available():
        return
    if isinstance(cuda, torch.Tensor):
        torch.cuda.set_rng_state(cuda, torch.cuda.current_device())
    else:  # written before 2026-11-29: every device's state, by index
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s, i)


def seed_all(seed: int) -> None:
    """Seed torch (all devices), NumPy and Python ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
