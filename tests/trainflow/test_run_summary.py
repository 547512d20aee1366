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
