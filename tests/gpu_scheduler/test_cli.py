"""End-to-end tests of ``python -m gpu_scheduler`` (simulate, policies, report) as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_scheduler.simulator.data import find_pollux_dir

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "gpu_scheduler", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def data() -> Path:
    return find_pollux_dir()  # ships with the package: missing data is a failure, not a skip


def test_simulate_writes_result_json_and_a_plot(tmp_path: Path, data: Path) -> None:
    lines = (data / "workloads" / "workload-1.csv").read_text().splitlines()
    workload = tmp_path / "small.csv"
    workload.write_text("\n".join(lines[:13]) + "\n")  # header + the first 12 jobs
    out = tmp_path / "out" / "result.json"
    proc = cli("simulate", "--workload", str(workload), "--policy", "default", "--nodes", "4", "--gpus-per-node", "4",
               "--interval-s", "60", "--out", str(out), "--traces", str(data / "traces"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "default on small.csv: avg JCT" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["policy"] == "default" and doc["cluster"]["total_gpus"] == 16
    summary = doc["summary"]
    for key in ("avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "avg_queueing_delay_s", "gpu_allocation",
                "restarts_per_job"):
        assert isinstance(summary[key], float), key
    assert 0 < summary["gpu_allocation"] <= 1
    assert len(doc["jobs"]) == 12
    first = doc["jobs"][0]
    assert first["name"] == "cifar10-0" and first["submit_time_s"] == 107
    assert first["start_time_s"] == 120 and first["finish_time_s"] > first["start_time_s"]
    assert first["allocations"][0][0] == 120 and first["allocations"][0][1] >= 1
    assert summary["avg_jct_s"] == pytest.approx(sum(j["jct_s"] for j in doc["jobs"]) / 12)
    assert all(g <= 16 for _, g in doc["gpus_in_use"])
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_simulate_adaptive_batch_flag_records_the_batch_sizes(tmp_path: Path, data: Path) -> None:
    lines = (data / "workloads" / "workload-1.csv").read_text().splitlines()
    workload = tmp_path / "small.csv"
    workload.write_text("\n".join(lines[:7]) + "\n")  # header + the first 6 jobs
    docs = {}
    for flag in ((), ("--adaptive-batch",)):
        out = tmp_path / f"r{len(flag)}.json"
        proc = cli("simulate", "--workload", str(workload), "--policy", "default", "--nodes", "2", "--out", str(out),
                   "--traces", str(data / "traces"), *flag, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        docs[bool(flag)] = json.loads(out.read_text())
    assert "adaptive_batch" not in docs[False]["cluster"] and docs[True]["cluster"]["adaptive_batch"] is True
    assert all("batch_sizes" not in j for j in docs[False]["jobs"])
    adaptive = {j["name"]: j for j in docs[True]["jobs"]}
    assert adaptive["cifar10-0"]["batch_sizes"][0][0] == adaptive["cifar10-0"]["start_time_s"]
    assert "batch_sizes" not in adaptive["ncf-2"]  # NCF keeps its batch


def test_bad_input_is_a_one_line_error(tmp_path: Path, data: Path) -> None:
    workload = data / "workloads" / "workload-1.csv"
    latin1 = tmp_path / "latin1.csv"  # review finding 12-simulate: was a UnicodeDecodeError traceback
    latin1.write_bytes("name,time,application,num_replicas,batch_size\nj\xf6b,0,cifar10,1,128\n".encode("latin-1"))
    nan_time = tmp_path / "nan.csv"  # ... and time=nan was accepted
    nan_time.write_text("name,time,application,num_replicas,batch_size\nj,nan,cifar10,1,128\n")
    cases = [
        (["--workload", str(tmp_path / "none.csv"), "--policy", "fifo"], "does not exist"),
        (["--workload", str(workload), "--policy", "nope"], "unknown policy 'nope'"),
        (["--workload", str(workload), "--policy", "fifo", "--gpus-per-node", "8"], "gpus-per-node must be 1..4"),
        (["--workload", str(workload), "--policy", "fifo", "--param", "x=1"], "has no parameter 'x'"),
        (["--workload", str(latin1), "--policy", "fifo"], "not UTF-8 text"),
        (["--workload", str(nan_time), "--policy", "fifo"], "needs a name, a finite time"),
    ]
    for args, message in cases:
        proc = cli("simulate", *args, "--out", str(tmp_path / "r.json"), cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_release_without_a_cluster_is_a_one_line_error(tmp_path: Path) -> None:
    """``release`` with a missing kubeconfig, or an API server that is not there, says so in one line."""
    unreachable = tmp_path / "kubeconfig"
    unreachable.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")
    cases = [([f"--kubeconfig={tmp_path / 'none'}"], "cannot load Kubernetes configuration"),
             ([f"--kubeconfig={unreachable}"], "Kubernetes API unreachable")]
    for args, message in cases:
        proc = cli("release", *args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, proc.stderr


def test_policies_lists_the_registry(tmp_path: Path) -> None:
    proc = cli("policies", cwd=tmp_path)
    assert proc.returncode == 0
    listed = [line.split()[0] for line in proc.stdout.splitlines()]
    assert listed == sorted(["default", "elastic_fifo", "fifo", "fifo_backfill", "optimus", "pollux", "round_robin",
                             "sia", "tiresias"])


@pytest.mark.slow
def test_report_runs_a_reduced_matrix(tmp_path: Path, data: Path) -> None:
    from gpu_scheduler.simulator.engine import MEASURED_RESTART_COST_S

    out = tmp_path / "docs" / "report.md"
    proc = cli("report", "--out", str(out), "--data", str(data), "--policy", "tiresias", "--policy", "fifo",
               "--load", "1.0", "--workloads", "1", "--processes", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # one progress line per simulation: 2 policies × 2 job models, and tiresias' fidelity run
    assert "running 5 simulations on 1 process(es)" in proc.stdout
    assert "[5/5, " in proc.stdout and "tiresias 1.0x workload 1 fixed (30 s restarts): mean JCT 2,474 s" in proc.stdout
    text = out.read_text()
    # fidelity runs use the artifact's 30 s restarts: published 2473.65 s on workload 1
    assert "| 1 | 2,474 | 2,474 | +0.0 % |" in text and "## Fidelity" in text
    assert f"Restart cost: **{MEASURED_RESTART_COST_S} s per (re)allocation** in the side-by-side runs — a " in text
    assert "Policies: `tiresias`, `fifo`; loads 1.0x; job models fixed, adaptive; 0 jittered runs" in text
    assert "## Fixed global batch" in text and "## Adaptive batch" in text
    for suffix in ("", "-adaptive"):
        assert (tmp_path / "docs" / "scheduler" / f"jct-cdf-and-usage-1.0x{suffix}.png").is_file()
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["restart_cost_s"] == MEASURED_RESTART_COST_S
    fidelity = [r for r in summary["runs"] if r["restart_cost_s"] == 30 and r["job_model"] == "fixed"]
    assert fidelity[0]["summary"]["avg_jct_s"] == pytest.approx(2473.65, abs=0.01)
    assert 2000 < summary["mean"]["1.0"]["tiresias"]["avg_jct_s"] < 3000  # side by side, measured restarts
    adaptive = summary["means"]["adaptive"]["1.0"]["tiresias"]["avg_jct_s"]
    assert adaptive != pytest.approx(summary["mean"]["1.0"]["tiresias"]["avg_jct_s"])  # another job model ran
    bad = cli("report", "--out", str(out), "--data", str(data), "--job-model", "elastic", cwd=tmp_path)
    assert bad.returncode != 0 and "unknown job model 'elastic'" in bad.stderr


def test_the_command_line_runs_openblas_on_one_thread_unless_told_otherwise() -> None:
    # OpenBLAS's threads spin on the scheduler's tiny matrix calls (a busy 2-core machine ran one
    # throughput fit 17x slower): `python -m gpu_scheduler` sets one thread before numpy loads.
    probe = ("import gpu_scheduler.__main__, numpy, threadpoolctl; "
             "print([i['num_threads'] for i in threadpoolctl.threadpool_info() if i['internal_api'] == 'openblas'])")
    for given, expected in ((None, "[1]"), ("2", "[2]")):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        if given:
            env["OPENBLAS_NUM_THREADS"] = given
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                              env={**env, "PYTHONPATH": str(REPO)}, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected


def test_a_metrics_port_in_use_is_one_line(tmp_path: Path) -> None:
    """serve()'s OSError escaped the CLI's handler as a traceback."""
    import socket

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
                          "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
                          "current-context: x\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("run", "--prometheus-url", "http://127.0.0.1:9", "--kubeconfig", str(kubeconfig),
                   "--metrics-addr", "127.0.0.1", "--metrics-port", str(port), "--no-leader-election", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"metrics_addr/metrics_port: cannot serve on 127.0.0.1:{port}: Address already in use" in proc.stderr
