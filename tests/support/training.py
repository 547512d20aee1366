"""Training fixtures shared by every tier: prepared datasets and a driver for jobs under real torchrun agents.

Registered in tests/conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from components.training.launch import Agent, AgentSpec, rdzv_id_for
from components.training.metrics import read_jsonl
from components.training.sources import prepare
from tests.support.processes import free_port


@pytest.fixture(scope="session")
def digits_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("datasets") / "digits"
    prepare("digits", out, test_fraction=0.2, seed=0)
    return out


@pytest.fixture(scope="session")
def mnist_dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("datasets") / "mnist"
    prepare("mnist", out, test_fraction=0.2, seed=0)
    return out


def state_dict_sha256(path: Path) -> str:
    """SHA-256 over a saved state_dict's names, dtypes, shapes and raw tensor bytes."""
    sd = torch.load(path, map_location="cpu", weights_only=True)
    h = hashlib.sha256()
    for name in sorted(sd):
        t = sd[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def check_resume_after_kill(records: list[dict], *, killed_at_step: int, interval_steps: int) -> int:
    """Check the first resume of a job whose worker was SIGKILLed after ``killed_at_step`` against the
    job's own records (step-driven saves only); return the step it resumed from.

    A periodic save that comes due while the previous one still persists is deferred to the first step
    after that persist (``checkpoint_deferred``, ``CheckpointManager.ready_for_periodic``), so on a
    loaded machine saves land later than the multiples of the interval, and the newest one started
    before the kill may not have committed in time. What must hold whatever the load:

    * the resume restored a save the first incarnation started at or before the kill, and none older
      than the newest that recorded its commit (the record of a later commit may have died with the
      worker);
    * the saves kept to the interval: each came exactly one interval after the previous one (the
      first at ``interval_steps``) unless a save due then was deferred behind the previous one's
      persist, and the newest was less than one interval before the kill unless the same happened.
      So at most one interval's work is lost beyond what slow persists delayed.
    """
    first_resume = next(i for i, r in enumerate(records) if r.get("event") == "resume")
    resume, first = records[first_resume], records[:first_resume]
    staged = [r["step"] for r in first if r.get("event") == "checkpoint" and r.get("outcome") == "staged"
              and r.get("reason") == "periodic" and r["step"] <= killed_at_step]
    committed = [r["step"] for r in first if r.get("event") == "checkpoint_committed" and r["step"] <= killed_at_step]
    deferred_behind = {r["persisting_step"] for r in first
                       if r.get("event") == "checkpoint_deferred" and r["step"] <= killed_at_step}
    context = {"resume": resume, "staged": staged, "committed": committed, "deferred_behind": sorted(deferred_behind)}
    resumed = resume["resumed_from_step"]
    assert resumed in staged and resumed >= max(committed, default=0), context
    for previous, step in zip([0, *staged], staged, strict=False):
        assert step - previous == interval_steps or (
            previous in deferred_behind and step > previous + interval_steps), (previous, step, context)
    assert killed_at_step - staged[-1] < interval_steps or staged[-1] in deferred_behind, context
    return resumed


@dataclass
class Job:
    """One training job driven through real torchrun agents."""

    root: Path
    job_key: str
    args: list[str]

    @property
    def metrics_path(self) -> Path:
        return self.root / "metrics.jsonl"

    def agent(
        self, spec_kw: dict | None = None, *, name: str = "agent", endpoint: str | None = None
    ) -> Agent:
        """Start a torchrun agent; with ``endpoint`` (a RendezvousStore's) it joins as a store client."""
        kw = {"nproc_per_node": 2, "min_nodes": 1, "max_nodes": 1, "max_restarts": 3, **(spec_kw or {})}
        spec = AgentSpec(
            rdzv_id=rdzv_id_for(self.job_key),
            rdzv_endpoint=endpoint or f"127.0.0.1:{free_port()}",
            rdzv_is_host=False if endpoint else None,
            **kw,
        )
        return Agent(spec, self.args, log_path=self.root / f"{name}.log")

    def records(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def final_losses(self) -> dict[int, str]:
        """step -> loss.hex() of the LAST record of each step (replays overwrite)."""
        out = {}
        for r in self.records():
            if "loss" in r and "step" in r:
                out[r["step"]] = float(r["loss"]).hex()
        return out


@pytest.fixture
def make_job(tmp_path):
    def make(dataset: Path, job_key: str, *extra: str, ckpt_root: Path | None = None) -> Job:
        root = tmp_path / job_key
        root.mkdir()
        args = [
            "--dataset",
            str(dataset),
            "--checkpoint-uri",
            str(ckpt_root or tmp_path / "ckpt"),
            "--job-key",
            job_key,
            "--metrics-path",
            str(root / "metrics.jsonl"),
            "--model-output",
            str(root / "model"),
            "--threads-per-rank",
            "1",
            "--log-every-steps",
            "10",
            *extra,
        ]
        return Job(root=root, job_key=job_key, args=args)

    return make
