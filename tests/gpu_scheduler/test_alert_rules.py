"""The monitoring component's alerts, evaluated by Prometheus' own rule-test runner
(``promtool test rules``, shipped with Prometheus) on synthetic series: each alert fires when it
should and stays quiet when it should not."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.prometheus import rules_file

MANIFEST = Path(__file__).resolve().parents[2] / "manifests/components/monitoring/prometheusrule.yaml"


def _annotations(alert: str) -> dict[str, str]:
    for group in yaml.safe_load(MANIFEST.read_text())["spec"]["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return rule["annotations"]
    raise AssertionError(f"no alert {alert} in {MANIFEST}")


def _fires(alert: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    return [{"exp_labels": labels, "exp_annotations": _annotations(alert)}]


def _promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found (Debian's prometheus package ships it; make testbed installs it)")
    rules_file(MANIFEST, tmp_path / "rules.yml")
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    return subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_the_scheduler_not_acting_alert(tmp_path: Path) -> None:
    warning = {"severity": "warning"}
    proc = _promtool(tmp_path, [
        {   # every tick skipped (Prometheus unreadable) while leading: fires
            "interval": "1m",
            "input_series": [
                {"series": 'trainflow_scheduler_ticks_total{result="skipped"}', "values": "0+1x90"},
                {"series": "trainflow_scheduler_leader", "values": "1x90"},
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "TrainflowSchedulerNotActing", "exp_alerts": []},
                {"eval_time": "60m", "alertname": "TrainflowSchedulerNotActing",
                 "exp_alerts": _fires("TrainflowSchedulerNotActing", warning)},
            ],
        },
        {   # ticks complete: quiet, although some are skipped
            "interval": "1m",
            "input_series": [
                {"series": 'trainflow_scheduler_ticks_total{result="skipped"}', "values": "0+1x90"},
                {"series": 'trainflow_scheduler_ticks_total{result="ok"}', "values": "0+1x90"},
                {"series": "trainflow_scheduler_leader", "values": "1x90"},
            ],
            "alert_rule_test": [{"eval_time": "60m", "alertname": "TrainflowSchedulerNotActing", "exp_alerts": []}],
        },
        {   # no replica holds the Lease (a Role that does not grant a renamed --lease-name): fires
            "interval": "1m",
            "input_series": [
                {"series": 'trainflow_scheduler_ticks_total{result="ok"}', "values": "0x90"},
                {"series": "trainflow_scheduler_leader", "values": "0x90"},
            ],
            "alert_rule_test": [{"eval_time": "60m", "alertname": "TrainflowSchedulerNotActing",
                                 "exp_alerts": _fires("TrainflowSchedulerNotActing", warning)}],
        },
    ])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_idle_gpus_alert_needs_running_trainers_not_pod_labels(tmp_path: Path) -> None:
    """It read kube_pod_labels{label_trainflow_dev_managed="true"}, which kube-state-metrics v2
    exports only when that label is allow-listed: the alert never fired."""
    proc = _promtool(tmp_path, [
        {
            "interval": "1m",
            "input_series": [
                {"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "values": "5x90"},
                {"series": 'trainflow_world_size{job_key="team-a/bert"}', "values": "2x90"},
            ],
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": "TrainflowGpusIdle", "exp_alerts": []},
                {"eval_time": "60m", "alertname": "TrainflowGpusIdle",
                 "exp_alerts": _fires("TrainflowGpusIdle", {"severity": "info"})},
            ],
        },
        {   # idle GPUs but no trainflow training: quiet
            "interval": "1m",
            "input_series": [{"series": 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}', "values": "5x90"}],
            "alert_rule_test": [{"eval_time": "60m", "alertname": "TrainflowGpusIdle", "exp_alerts": []}],
        },
    ])
    assert proc.returncode == 0, proc.stdout + proc.stderr
