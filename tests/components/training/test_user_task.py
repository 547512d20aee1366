"""A user's own task, in a package outside the repository, trained by the harness (issue 11, 7b).

The package is written into ``tmp_path`` at test time and reaches the torchrun workers through
``PYTHONPATH`` only (``--task my_pkg.tasks:NoisyRegression``). Through real torchrun agents (gloo
on CPU), as ``test_resume.py`` and ``test_elastic_resize.py`` do for the built-in task:

* a job whose worker is SIGKILLed mid-training resumes bit-exactly: the same per-step losses
  (``float.hex``) and final weights as an uninterrupted job, and the task's own state
  (``state_dict``) is restored, not restarted;
* the job resizes 2 → 1 → 2 ranks with every training sample seen exactly once in the epoch, the
  last global batch being two samples, one rank's pair (the other holds none: its weight-0 placeholder);
* ``trainflow run --task`` trains it through the pipeline (kfp.local) with a fault, and the
  evaluate step reports the task's own metric.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from components.training.checkpoint.manager import CheckpointManager
from components.training.launch import RendezvousStore
from tests.support.training import Job, state_dict_sha256
from trainflow.storage.local import LocalStorage

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
TASK = "my_pkg.tasks:NoisyRegression"
N_TRAIN = 225  # 13 global batches of 16, one of 15, then one of 2 (never a batch of one sample)

TASK_CODE = '''
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from trainflow.task import Task


class Rows(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}  # dict samples: the default collate keeps the keys


class NoisyRegression(Task):
    """An MLP with dropout (the harness's RNG restore matters) fitting y = x @ w + noise; counts
    its loss calls as its own checkpointed state. ``step_delay_s`` per loss call keeps a job training
    long enough for a fault to land mid-way (tests/integration/test_user_task_realnode.py)."""

    def __init__(self, num_samples=256, num_features=6, hidden=16, seed=0, step_delay_s=0.0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(num_samples, num_features, generator=g)
        y = x @ torch.randn(num_features, generator=g) + 0.1 * torch.randn(num_samples, generator=g)
        n_train = num_samples * 7 // 8
        self.train, self.held_out = Rows(x[:n_train], y[:n_train]), Rows(x[n_train:], y[n_train:])
        self.num_features, self.hidden = num_features, hidden
        self.loss_calls = 0
        self.step_delay_s = step_delay_s

    def build_model(self):
        return nn.Sequential(nn.Linear(self.num_features, self.hidden), nn.ReLU(), nn.Dropout(0.1),
                             nn.Linear(self.hidden, 1))

    def train_dataset(self):
        return self.train

    def eval_dataset(self):
        return self.held_out

    def loss(self, model, batch):
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        self.loss_calls += 1
        return nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])

    def evaluate(self, model, loader):
        se, n = 0.0, 0
        for batch in loader:
            se += float(((model(batch["x"]).squeeze(1) - batch["y"]) ** 2).sum())
            n += len(batch["y"])
        return {"mse": se / n}

    def data_fingerprint(self):
        return f"regression-{len(self.train)}"

    def state_dict(self):
        return {"loss_calls": self.loss_calls}

    def load_state_dict(self, state):
        self.loss_calls = state["loss_calls"]
'''


@pytest.fixture
def user_pkg(tmp_path, monkeypatch) -> Path:
    """``my_pkg`` outside the repository, on the workers' PYTHONPATH (and only there)."""
    root = tmp_path / "user-code"
    (root / "my_pkg").mkdir(parents=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "tasks.py").write_text(TASK_CODE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(REPO), os.environ.get("PYTHONPATH", "")]))
    return root


def task_args() -> str:
    # num_samples * 7 // 8 == N_TRAIN training samples
    return json.dumps({"num_samples": 258, "seed": 3})


def make_task_job(tmp_path: Path, job_key: str, *extra: str) -> Job:
    root = tmp_path / job_key
    root.mkdir()
    args = ["--task", TASK, "--task-args", task_args(), "--checkpoint-uri", str(tmp_path / "ckpt"),
            "--job-key", job_key, "--metrics-path", str(root / "metrics.jsonl"), "--model-output",
            str(root / "model"), "--threads-per-rank", "1", "--log-every-steps", "5", "--learning-rate", "0.02",
            *extra]
    return Job(root=root, job_key=job_key, args=args)


def test_the_task_args_give_the_planned_split(user_pkg, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(user_pkg))
    from trainflow.task import load_task

    task = load_task(TASK, task_args())
    assert len(task.train_dataset()) == N_TRAIN and N_TRAIN % 16 == 1
    for name in ("my_pkg", "my_pkg.tasks"):
        sys.modules.pop(name, None)


def test_a_user_task_killed_and_resumed_is_bit_exact(user_pkg, tmp_path) -> None:
    common = ["--epochs", "3", "--global-batch-size", "16", "--checkpoint-interval-steps", "8",
              "--checkpoint-interval-s", "1e9"]
    clean = make_task_job(tmp_path, "clean", *common)
    assert clean.agent().wait(300) == 0, (clean.root / "agent.log").read_text()[-3000:]
    faulty = make_task_job(tmp_path, "faulty", *common, "--fault-at-step", "20")
    assert faulty.agent().wait(300) == 0, (faulty.root / "agent.log").read_text()[-3000:]

    clean_losses, faulty_losses = clean.final_losses(), faulty.final_losses()
    assert len(clean_losses) == 45 and clean_losses == faulty_losses  # 3 epochs of 15 steps
    assert state_dict_sha256(clean.root / "model" / "model.pt") == state_dict_sha256(
        faulty.root / "model" / "model.pt")
    resumes = [r for r in faulty.records() if r.get("event") == "resume"]
    # from the newest periodic checkpoint committed before the SIGKILL at step 20: 16 when each persist
    # ends within the 8 steps to the next save; on a loaded machine a save due while the previous one
    # persists is made at the first step after it (17-20), and one staged at 20 may not have committed.
    # The first incarnation's records only: one resumed from 8 saves at 16 again.
    (resume,) = resumes
    records = faulty.records()
    first = records[:records.index(resume)]
    staged = [r["step"] for r in first if r.get("event") == "checkpoint" and r.get("outcome") == "staged"
              and r["step"] <= 20]
    committed = [r["step"] for r in first if r.get("event") == "checkpoint_committed" and r["step"] <= 20]
    assert resume["resumed_from_step"] in staged and resume["resumed_from_step"] >= max(committed, default=1), (
        resume, staged, committed)  # the newest that committed (its record may have died with the worker)

    # The task's own state was checkpointed and restored: one loss call per step on each rank.
    for key in ("clean", "faulty"):
        loaded = CheckpointManager(LocalStorage(str(tmp_path / "ckpt" / key))).load_latest()
        assert loaded is not None and loaded.step == 45
        assert loaded.state["task_state"] == {"loss_calls": 45}
        assert loaded.manifest["task"] == TASK and loaded.manifest["dataset_fingerprint"] == f"regression-{N_TRAIN}"
    meta = json.loads((faulty.root / "model" / "model.json").read_text())
    assert (meta["task"], meta["task_args"]) == (TASK, json.loads(task_args()))

    # Another model under the same job key is refused with one line (exit 2), not loaded.
    other = make_task_job(tmp_path, "other", *common)
    other.args[other.args.index("--job-key") + 1] = "clean"
    other.args[other.args.index("--task-args") + 1] = json.dumps({"num_samples": 258, "seed": 3, "hidden": 8})
    proc = subprocess.run([sys.executable, "-m", "components.training", *other.args, "--epochs", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "was written for another model structure" in last and "--job-key" in last


def _wait_for(job: Job, predicate, what: str, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in reversed(job.records()):
            if "loss" in r and predicate(r):
                return r
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last records: {job.records()[-3:]}")


def test_a_user_task_resizes_2_1_2_with_every_sample_once(user_pkg, tmp_path) -> None:
    samples = tmp_path / "samples"
    job = make_task_job(tmp_path, "elastic", "--epochs", "4", "--global-batch-size", "16",
                        "--checkpoint-interval-steps", "2", "--checkpoint-interval-s", "1e9",
                        "--throttle-step-s", "0.5", "--sample-log-dir", str(samples))
    store = RendezvousStore()
    elastic = {"nproc_per_node": 1, "min_nodes": 1, "max_nodes": 2, "max_restarts": 5}
    a = job.agent(elastic, name="agent-a", endpoint=store.endpoint)
    b = job.agent(elastic, name="agent-b", endpoint=store.endpoint)
    b2 = None
    try:
        first = _wait_for(job, lambda r: r["world_size"] == 2 and r["step"] >= 3, "3 steps at world size 2")
        b.kill()  # node lost
        shrunk = _wait_for(job, lambda r: r["world_size"] == 1 and r["step"] >= first["step"] + 3,
                           "3 steps at world size 1")
        b2 = job.agent(elastic, name="agent-b2", endpoint=store.endpoint)  # node added
        _wait_for(job, lambda r: r["world_size"] == 2 and r["step"] > shrunk["step"], "world size 2 again")
        assert a.wait(300) == 0
        assert b2.wait(60) == 0
    finally:
        for agent in (a, b, b2):
            if agent is not None and agent.proc.poll() is None:
                agent.kill()
        store.close()

    records = [json.loads(line) for f in samples.glob("*.jsonl") for line in f.read_text().splitlines() if line]
    latest: dict[int, float] = {}
    for r in records:  # the last execution of each step wins
        latest[r["step"]] = max(latest.get(r["step"], 0.0), r["incarnation_started"])
    lineage = [r for r in records if r["incarnation_started"] == latest[r["step"]]]
    for epoch in range(4):
        seen = collections.Counter(i for r in lineage if r["epoch"] == epoch for i in r["ids"])
        assert sorted(seen) == list(range(N_TRAIN)), f"epoch {epoch}: some samples were skipped"
        assert set(seen.values()) == {1}, f"epoch {epoch}: samples seen twice"
    by_step = collections.defaultdict(list)
    for r in lineage:
        by_step[r["step"]].append(len(r["ids"]))
    # The epoch's last global batch is two samples, one rank's pair (data.shard): at world size 2
    # the other rank has none (its placeholder, weight 0), and the job goes on.
    assert any(sorted(by_step[15 * e]) == [0, 2] for e in range(1, 5))

    sizes = [r["world_size"] for r in sorted(lineage, key=lambda r: r["step"]) if r["rank"] == 0]
    assert [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s] == [2, 1, 2]
    resumes = [r for r in job.records() if r.get("event") == "resume"]
    assert [(r["saved_world_size"], r["world_size"]) for r in resumes][-2:] == [(2, 1), (1, 2)]
    losses = [r["loss"] for r in job.records() if "loss" in r]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_trainflow_run_trains_a_user_task_through_the_pipeline(user_pkg, tmp_path) -> None:
    out = tmp_path / "run"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "trainflow.cli", "run", "--output-dir", str(out), "--dataset-source", "digits",
         "--task", TASK, "--task-args", task_args(), "--epochs", "4", "--global-batch-size", "16",
         "--learning-rate", "0.02", "--checkpoint-interval-steps", "10", "--fault-at-step", "25"],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The steps' temporary folders (KFP's mktemp per component, torchelastic's) went with the run,
    # not into TMPDIR, where nothing removes them; the train step made none (TRAINFLOW_LOG_DIR).
    assert sorted(p.name for p in tmp.iterdir()) == [], sorted(p.name for p in tmp.iterdir())
    assert any((out / "kfp" / "tmp").iterdir())
    report = json.loads((out / "run-report.json").read_text())
    assert report["status"] == "succeeded" and report["steps"] == 60
    (resume,) = report["resumes"]
    assert (resume["killed_at_step"], resume["resumed_from_step"]) == (25, 20)
    assert report["parameters"]["task"] == TASK
    assert 0 < report["test_metrics"]["test_mse"] < 1.0  # the task's own metric, from the evaluate step
    assert report["test_accuracy"] is None  # the task reports none: no placeholder 0.0 in the report
    assert re.search(r"test mse\s*│\s*0\.\d+", proc.stdout) and "test accuracy" not in proc.stdout
