"""Rank 0's Prometheus endpoint: scraped from a live training process (off by default)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from components.training.metrics import read_jsonl
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

#: Seconds for the trainer to come up and commit its first checkpoints (generous: a loaded CI machine).
STARTUP_DEADLINE_S = 180.0
#: Seconds to catch a scrape between two reads of the metrics file that agree (no deferral recorded
#: meanwhile: at most one per persist, so the first try nearly always does); well within the run's
#: remaining 12 s or more (135 steps of at least 0.1 s), so a mismatch fails here, while it still serves.
STEADY_READ_DEADLINE_S = 5.0


def _scrape(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("trainflow_"):
                assert sample.labels.get("job_key") == "metrics-job"
                out[sample.name] = sample.value
    return out


def _deferrals(path: Path) -> int:
    """The periodic saves the run recorded as deferred behind a persist (``checkpoint_deferred``)."""
    return sum(1 for r in read_jsonl(path) if r.get("event") == "checkpoint_deferred")


def test_trainer_serves_prometheus_metrics(digits_dataset, tmp_path) -> None:
    port = free_port()
    records = tmp_path / "metrics.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "components.training", "--dataset", str(digits_dataset), "--checkpoint-uri",
         str(tmp_path / "ckpt"), "--job-key", "metrics-job", "--epochs", "3", "--global-batch-size", "32",
         "--checkpoint-interval-steps", "5", "--throttle-step-s", "0.1", "--metrics-port", str(port),
         "--metrics-path", str(records)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        metrics: dict[str, float] = {}
        while time.monotonic() < deadline:
            try:
                metrics = _scrape(port)
            except httpx.HTTPError:
                metrics = {}
            # (the step gauge is set by the step's record, after the save whose commit may come first)
            if metrics.get("trainflow_checkpoints_committed_total", 0) >= 2 and metrics.get("trainflow_step", 0) >= 10:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.3)
        assert metrics["trainflow_step"] >= 10 and metrics["trainflow_world_size"] == 1
        assert metrics["trainflow_samples_per_second"] > 0 and metrics["trainflow_loss"] > 0
        assert metrics["trainflow_checkpoint_persist_seconds"] > 0
        assert metrics["trainflow_resumes_total"] == 0
        assert metrics["trainflow_total_steps"] == 135 and metrics["trainflow_global_batch_size"] == 32
        # checkpoint health (review finding 5): failures and skips are counted, the last commit is recent
        assert metrics["trainflow_checkpoint_failures_total"] == 0
        assert 0 <= metrics["trainflow_checkpoint_last_commit_age_seconds"] < 30
        assert abs(metrics["trainflow_checkpoint_last_commit_timestamp_seconds"] - time.time()) < 30
        # A save due while the previous one still persists (a loaded machine) is deferred: counted once
        # per persist, exactly as often as the run recorded it; none is skipped outright.
        assert not [r for r in read_jsonl(records) if r.get("event") == "checkpoint" and r["outcome"] != "staged"]
        deadline = time.monotonic() + STEADY_READ_DEADLINE_S
        while True:  # each record is written to the file just before the counter counts it: compare
            before = _deferrals(records)  # them in a scrape no new deferral overlapped
            skipped = _scrape(port)["trainflow_checkpoint_skipped_total"]
            if before == _deferrals(records) == skipped:
                break
            assert time.monotonic() < deadline, (before, skipped, _deferrals(records))
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # preemption: saves, then exits 143
        assert proc.wait(120) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_metrics_endpoint_is_off_by_default(tmp_path) -> None:
    from trainflow.common.training_spec import TrainConfig

    cfg = TrainConfig.from_flat({"dataset": "/d", "checkpoint_uri": "/c", "job_key": "k"})
    assert cfg.metrics_port == 0 and cfg.metrics_addr == "127.0.0.1"


def test_adaptive_batch_metrics_only_in_adaptive_mode() -> None:
    """The names the GPU scheduler reads: absent for a fixed-batch job, present (per world size for
    goodput) once a step record carries the adaptive-batch fields."""
    from components.training.metrics import PrometheusSink

    port = free_port()
    sink = PrometheusSink(port=port, addr="127.0.0.1", job_key="metrics-job")
    try:
        step = {"step": 3, "epoch": 0, "loss": 1.0, "samples_per_s": 100.0, "world_size": 2}
        sink.record({"event": "start", "total_steps": 10, "global_batch_size": 32})
        sink.record(step)
        fixed = _scrape(port)
        assert not {"trainflow_goodput_samples_per_second", "trainflow_remaining_samples",
                    "trainflow_gradient_noise_scale"} & set(fixed)
        sink.record({**step, "global_batch_size": 64, "gradient_noise_scale": 40.5, "remaining_samples": 900.0,
                     "goodput_samples_per_second": {"1": 150.0, "2": 280.0}})
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        goodput = {s.labels["world_size"]: s.value for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == "trainflow_goodput_samples_per_second"}
        assert goodput == {"1": 150.0, "2": 280.0}
        adaptive = _scrape(port)
        assert (adaptive["trainflow_remaining_samples"], adaptive["trainflow_gradient_noise_scale"],
                adaptive["trainflow_global_batch_size"]) == (900.0, 40.5, 64)
    finally:
        sink.close()


@pytest.mark.prometheus
def test_shipped_checkpoint_alerts_fire_on_the_trainers_own_metrics(prometheus_server, tmp_path) -> None:
    """Review finding 5: a checkpoint that failed, or none committed for an hour, raises the
    monitoring component's alerts. A real Prometheus loads the shipped PrometheusRule and scrapes
    the trainer's metrics server (the class the trainer runs), so a renamed metric fails here."""
    from components.training.metrics import PrometheusSink
    from tests.support.prometheus import rules_file

    manifest = Path(__file__).resolve().parents[3] / "manifests/components/monitoring/prometheusrule.yaml"
    port = free_port()
    sink = PrometheusSink(port=port, addr="127.0.0.1", job_key="metrics-job",
                          last_commit_unix_s=lambda: time.time() - 7200)
    try:
        prom = prometheus_server([f"127.0.0.1:{port}"], scrape_interval_s=0.5,
                                 rule_files=[rules_file(manifest, tmp_path / "rules.yml")])
        prom.wait_for('trainflow_checkpoint_failures_total{job_key="metrics-job"}',
                      lambda r: [float(s["value"][1]) for s in r] == [0.0], timeout_s=30)
        sink.record({"event": "checkpoint_failed", "step": 40})
        sink.record({"event": "checkpoint", "outcome": "skipped", "stall_s": 0.0})
        sink.record({"event": "checkpoint_deferred", "step": 44, "persisting_step": 40})  # the trainer's way
        scraped = _scrape(port)
        assert scraped["trainflow_checkpoint_failures_total"] == 1
        assert scraped["trainflow_checkpoint_skipped_total"] == 2

        def alerts(r: list[dict]) -> bool:
            return {(s["metric"]["alertname"], s["metric"]["alertstate"]) for s in r} == {
                ("TrainflowCheckpointFailing", "firing"), ("TrainflowCheckpointStale", "pending")}

        fired = prom.wait_for('ALERTS{job_key="metrics-job"}', alerts, timeout_s=60)
        assert all(s["metric"]["severity"] == "warning" for s in fired)
    finally:
        sink.close()
