"""Exactly-once data across an elastic resize, through real torchrun agents (c10d rendezvous, gloo).

Two agents of one worker each join a ``--nnodes=1:2`` job (world size 2). One agent is SIGKILLed
(a node lost: world size 1), then a new agent joins (world size 2 again). Every step logs the sample
ids each rank consumed; the final lineage of epoch 0 (for each step, its last execution — earlier
executions were rolled back by a restart) must contain every training sample exactly once, and the
lineage must really have run at world sizes 2, then 1, then 2.
"""

from __future__ import annotations

import collections
import json
import time

import pytest

from components.training.data import PreparedDataset
from components.training.launch import RendezvousStore

pytestmark = pytest.mark.slow


def _wait_for(job, predicate, what: str, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in reversed(job.records()):
            if "loss" in r and predicate(r):
                return r
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last records: {job.records()[-3:]}")


def test_every_sample_once_across_2_1_2_workers(digits_dataset, make_job, tmp_path) -> None:
    samples = tmp_path / "samples"
    job = make_job(
        digits_dataset,
        "elastic",
        "--epochs",
        "1",
        "--global-batch-size",
        "16",
        "--checkpoint-interval-steps",
        "5",
        "--checkpoint-interval-s",
        "1e9",
        "--throttle-step-s",
        "0.25",
        "--sample-log-dir",
        str(samples),
    )
    store = RendezvousStore()  # hosted here, so losing either agent does not lose the rendezvous
    endpoint = store.endpoint
    elastic = {"nproc_per_node": 1, "min_nodes": 1, "max_nodes": 2, "max_restarts": 5}
    a = job.agent(elastic, name="agent-a", endpoint=endpoint)
    b = job.agent(elastic, name="agent-b", endpoint=endpoint)
    b2 = None
    try:
        first = _wait_for(job, lambda r: r["world_size"] == 2 and r["step"] >= 8, "8 steps at world size 2")
        b.kill()  # node lost
        shrunk = _wait_for(
            job, lambda r: r["world_size"] == 1 and r["step"] >= first["step"] + 5, "5 steps at world size 1"
        )
        b2 = job.agent(elastic, name="agent-b2", endpoint=endpoint)  # node added
        _wait_for(
            job,
            lambda r: r["world_size"] == 2 and r["step"] > shrunk["step"],
            "training at world size 2 again",
        )
        assert a.wait(300) == 0
        assert b2.wait(60) == 0
    finally:
        for agent in (a, b, b2):
            if agent is not None and agent.proc.poll() is None:
                agent.kill()
        store.close()

    records = [
        json.loads(line) for f in samples.glob("*.jsonl") for line in f.read_text().splitlines() if line
    ]
    latest: dict[int, float] = {}
    for r in records:  # the last execution of each step wins
        latest[r["step"]] = max(latest.get(r["step"], 0.0), r["incarnation_started"])
    lineage = [r for r in records if r["epoch"] == 0 and r["incarnation_started"] == latest[r["step"]]]
    seen = collections.Counter(i for r in lineage for i in r["ids"])
    n_train = len(PreparedDataset(digits_dataset).split("train"))
    assert sorted(seen) == list(range(n_train)), "some samples were skipped"
    assert set(seen.values()) == {1}, f"samples seen twice: {[i for i, c in seen.items() if c > 1][:10]}"

    sizes = [r["world_size"] for r in sorted(lineage, key=lambda r: r["step"]) if r["rank"] == 0]
    phases = [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s]
    assert phases == [2, 1, 2]
    resumes = [r for r in job.records() if r.get("event") == "resume"]
    assert [(r["saved_world_size"], r["world_size"]) for r in resumes][-2:] == [(2, 1), (1, 2)]
