"""The table ``trainflow run`` ends with (trainflow.local_run.summary_table): pure, rendered by rich."""

from __future__ import annotations

from rich.console import Console

from components.launcher.runner import JobOutcome, JobRef, PyTorchJobFailed
from trainflow.local_run import RunReport, summary_table


def _render(report: RunReport, width: int = 80) -> str:
    console = Console(width=width, record=True, force_terminal=False)
    console.print(summary_table(report))
    return console.export_text()


def test_a_failed_runs_error_is_printed_in_full_brackets_and_all() -> None:
    """A PyTorchJob's failure lists its pods in ``[...]``: that is text, not rich markup (it was
    swallowed as a markup tag, and the cause with it), and a long one is folded, not cut."""
    error = ("PyTorchJob ns/train-1 failed permanently, not retried: trainflow: task 'my_pkg.tasks:T': cannot "
             "import module 'my_pkg.tasks': No module named 'my_pkg' [train-1-worker-0=exit 2 (Error): trainflow: "
             "task 'my_pkg.tasks:T': cannot import module 'my_pkg.tasks']")
    text = _render(RunReport(status="failed", output_dir="/tmp/[x]/out", error=error, failed_task="train"))
    flat = "".join(line.strip("│ ").strip() for line in text.splitlines())
    assert "".join(f"train: {error}".split()) in "".join(flat.split())
    assert "/tmp/[x]/out/run-report.json" in "".join(flat.split())


def test_a_permanent_pod_failure_leads_the_message_with_the_workers_own_cause() -> None:
    outcome = JobOutcome(
        ref=JobRef("ns", "train-1", "u"), state="Failed", reason="PyTorchJobFailed", created=True,
        message='job "train-1" is failing because "Worker" replica(s) failed.',
        pod_failures="train-1-worker-0=exit 2 (Error): permanent failure, not retried: trainflow: no dataset; "
                     "train-1-worker-1=exit 2 (Error): permanent failure, not retried: trainflow: no dataset",
    )  # fmt: skip
    assert str(PyTorchJobFailed(outcome)) == (
        "PyTorchJob ns/train-1 failed permanently, not retried: trainflow: no dataset "
        "[train-1-worker-0=exit 2 (Error): trainflow: no dataset; train-1-worker-1=exit 2 (Error): trainflow: no dataset]"
    )
    crashed = JobOutcome(ref=JobRef("ns", "train-1", "u"), state="Failed", reason="PyTorchJobFailed", message="m",
                         created=True, pod_failures="train-1-worker-0=exit 137 (OOMKilled)")  # fmt: skip
    assert str(PyTorchJobFailed(crashed)) == "PyTorchJob ns/train-1 failed: PyTorchJobFailed: m [train-1-worker-0=exit 137 (OOMKilled)]"


def test_an_earlier_runs_logs_in_a_reused_output_dir_are_set_aside_not_read() -> None:
    """Review 2026-11-30: re-using --output-dir, the report read the earlier run's train-summary.json,
    eval.json and train-config.json (steps, accuracy, job key) when this run failed before writing its
    own, and the progress display followed the earlier train-metrics.jsonl. They are kept, apart."""
    import os
    import tempfile
    from pathlib import Path

    from trainflow.local_run import set_aside_earlier_logs

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        assert set_aside_earlier_logs(out) is None  # a new folder
        (out / "logs").mkdir()
        assert set_aside_earlier_logs(out) is None  # an empty one stays
        (out / "logs" / "eval.json").write_text('{"test_accuracy": 0.97}')
        os.utime(out / "logs", (1_790_000_000, 1_790_000_000))
        first = set_aside_earlier_logs(out)
        assert first is not None and first.name.startswith("logs.") and not (out / "logs").exists()
        assert (first / "eval.json").read_text() == '{"test_accuracy": 0.97}'
        (out / "logs").mkdir()
        (out / "logs" / "eval.json").write_text("{}")
        os.utime(out / "logs", (1_790_000_000, 1_790_000_000))  # the same second: a second name
        second = set_aside_earlier_logs(out)
        assert second == out / f"{first.name}-2" and (second / "eval.json").read_text() == "{}"
