"""``trainflow run``: the training pipeline on the embedded default (kfp.local + local torchrun).

The pipeline runs in this process through ``kfp.local.SubprocessRunner``; each component is a
subprocess, and ``train`` starts a torchrun elastic agent. Component output goes to
``<output>/pipeline.log``; the terminal shows a progress display fed by the trainer's per-step JSONL
(``<output>/logs/train-metrics.jsonl``, via ``TRAINFLOW_LOG_DIR``) and by kfp.local's task lines.

Output folder (default ``./runs/<YYYYmmdd-HHMMSS>``; ``./runs/latest`` points at the newest)::

    run-report.json   status, test_accuracy, steps, checkpoints_committed, resumes, ... (see RunReport)
    pipeline.log      everything the pipeline and its components printed
    logs/             train-metrics.jsonl, torchrun.log, train-config.json, train-summary.json, eval.json
                      (an earlier run's, in a re-used ``--output-dir``, are moved to logs.<YYYYmmdd-HHMMSS>/)
    checkpoints/      <job key>/step-*/ (the checkpoint store) and models/ (the model registry)
    kfp/              kfp.local's pipeline root (artifacts of every task), the steps' temporary
                      files (tmp/) and kfp.local's workspace (workspace/)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field, make_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from components.training.metrics import read_jsonl
from trainflow.common.training_spec import (
    BUILTIN_TASK,
    ROWS,
    WORKER_POD_ROWS,
    ConfigError,
    TrainJobSpec,
    check_values,
    rows,
)
from trainflow.storage import CheckpointStorageError, storage_for

STAGES = ("prepare-dataset", "train", "evaluate", "register-model")
_TASK_START = re.compile(r"Executing task \W*'([\w-]+)'")
_TASK_END = re.compile(r"Task \W*'([\w-]+)'\W* finished with status \W*(\w+)")
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RunInputError(ValueError):
    """Bad input caught before the pipeline starts (one-line message)."""


def _pipeline_arguments(self: Any, out: Path) -> dict[str, Any]:
    """The pipeline's arguments: every P row; the local backend runs one torchrun agent (its
    ``min_workers``/``max_workers`` are 1) and gets no cluster settings; empty roots go under ``out``."""
    cluster = self.backend == "pytorchjob"
    args = {row.name: getattr(self, row.name) for row in rows("P")}
    args["checkpoint_uri"] = self.checkpoint_uri or str(out / "checkpoints")
    args["registry_uri"] = self.registry_uri or str(out / "checkpoints" / "models")
    if not cluster:
        args.update(min_workers=1, max_workers=1)
        for name in CLUSTER_ONLY:
            del args[name]
    return args


#: Pipeline parameters that only the pytorchjob backend reads (left at the pipeline's default locally).
CLUSTER_ONLY = ("image", "namespace", "gpus_per_worker", "worker_cpu", "worker_memory", "worker_pod_settings",
                "s3_secret_name", "keep_failed_job")
#: Those of them a local run refuses when set (they shape pods it does not create); ``s3_secret_name``
#: may come from the environment for cluster runs, and ``keep_failed_job`` changes nothing here.
_POD_SHAPING = ("image", "namespace", *WORKER_POD_ROWS)

RunOptions = make_dataclass(
    "RunOptions",
    [("output_dir", Path | None, field(default=None)),
     *((row.name, row.type, field(default=row.default)) for row in rows("C"))],
    frozen=True, kw_only=True, namespace={"pipeline_arguments": _pipeline_arguments, "__module__": __name__},
)
RunOptions.__doc__ = """``trainflow run``'s options: ``output_dir`` plus one field per C row of the training spec
(trainflow/common/training_spec.py; same names, types and defaults - derived, not copied)."""


@dataclass
class RunReport:
    """The content of ``run-report.json``."""

    status: str
    output_dir: str
    test_accuracy: float | None = None
    test_loss: float | None = None
    test_metrics: dict[str, float] = field(default_factory=dict)
    """What the evaluate step reported, ``test_<metric>`` (a user's task: its own metric names)."""
    steps: int | None = None
    checkpoints_committed: int | None = None
    resumes: list[dict[str, Any]] = field(default_factory=list)
    checkpoint_stall_seconds_total: float | None = None
    train_seconds: float | None = None
    pipeline_seconds: float | None = None
    final_loss: float | None = None
    world_sizes: list[int] = field(default_factory=list)
    model_version: int | None = None
    job_key: str | None = None
    error: str | None = None
    failed_task: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def validate(opts: RunOptions) -> None:
    """Reject bad input before anything starts.

    Raises:
        RunInputError: a dataset source that is none of those ``prepare`` reads (or a missing folder),
            an invalid hyper-parameter, worker pod settings the train step would refuse, or such
            settings given for the local backend, or a bad ``TRAINFLOW_*`` compile setting in the
            environment (``pipelines.platform``: importing the pipeline would fail on it).
    """
    from components.training.data import DatasetError
    from components.training.sources import source_kind
    from pipelines.platform import ENV, PlatformSettings

    try:  # read when pipelines.training is imported; meaningless under kfp.local, but fatal there
        PlatformSettings.from_env()
    except ValueError as e:
        given = [var for var, name in ENV.items() if os.environ.get(var) and str(e).startswith(name)]
        where = " and ".join(given) or "the " + ", ".join(ENV) + " variables"
        raise RunInputError(f"{where}: {e} (a compile setting that trainflow run does not use: unset it)") from e

    src = opts.dataset_source
    try:
        kind = source_kind(src)
    except DatasetError as e:
        if "://" not in src and "/" in src:  # a path with a typo, not a name
            raise RunInputError(f"dataset path {src} does not exist") from e
        raise RunInputError(f"--dataset-source: {e}") from e
    if kind == "folder" and not Path(src.removeprefix("file://")).expanduser().exists():
        raise RunInputError(f"dataset path {src} does not exist")
    if opts.backend != "pytorchjob":
        pod_flags = [ROWS[name].flag for name in CLUSTER_ONLY
                     if name in _POD_SHAPING and getattr(opts, name) != ROWS[name].default]
        if pod_flags:
            raise RunInputError(f"{', '.join(pod_flags)} shape{'s' if len(pod_flags) == 1 else ''} the PyTorchJob's "
                                "worker pods (--backend pytorchjob); the local backend runs torchrun on this machine")
    if opts.backend == "pytorchjob":
        if not opts.checkpoint_uri.startswith("s3://"):
            raise RunInputError("--backend pytorchjob needs --checkpoint-uri s3://BUCKET/PREFIX (the worker pods "
                                "cannot reach this machine's folders)")
        if not opts.image:
            raise RunInputError("--backend pytorchjob needs --image (an image holding trainflow that the cluster "
                                "can pull)")
        from components.launcher.pytorchjob import InvalidSpecError, worker_pod_settings

        try:
            worker_pod_settings(opts.worker_pod_settings)
        except InvalidSpecError as e:
            raise RunInputError(str(e)) from e
    try:
        values = {row.name: getattr(opts, row.name) for row in rows("C")}
        check_values({k: v for k, v in values.items() if ROWS[k].on("P")}, "P")
        spec = TrainJobSpec.from_kwargs({k: v for k, v in values.items() if ROWS[k].on("S")})
    except ConfigError as e:
        raise RunInputError(f"invalid hyper-parameter: {e}") from e
    if opts.backend == "pytorchjob":  # the worker pods' settings, as the train step will render them
        from components.training.step import TrainStepError, worker_job_spec

        try:
            worker_job_spec(spec, spec.train_config(dataset="validate", job_key="validate",
                                                    checkpoint_uri=opts.checkpoint_uri),
                            namespace=opts.namespace or "default", image=opts.image, warn=False)
        except TrainStepError as e:
            raise RunInputError(str(e)) from e
    if opts.backend != "pytorchjob" and (opts.min_workers != 1 or opts.max_workers != 1):
        raise RunInputError(f"--min-workers {opts.min_workers} / --max-workers {opts.max_workers} bound the "
                            "PyTorchJob's workers (--backend pytorchjob); the local backend runs one torchrun agent, "
                            "whose ranks --nproc-per-node sets")
    if opts.task != BUILTIN_TASK:  # a user's task must import and build here (PYTHONPATH) before anything starts
        from trainflow.task import TaskError, load_task

        try:
            load_task(opts.task, spec.train_config(dataset="", job_key="validate",
                                                   checkpoint_uri="validate").task_kwargs())
        except TaskError as e:
            raise RunInputError(str(e)) from e
    for uri in (opts.checkpoint_uri, opts.registry_uri):
        if uri:
            try:
                storage_for(uri).check()
            except CheckpointStorageError as e:
                raise RunInputError(str(e)) from e


class _PipelineLog(io.TextIOBase):
    """Where kfp.local's stdout goes: a file, with task start/end lines turned into stage events."""

    def __init__(self, path: Path, on_task: Any) -> None:
        self._f = path.open("a", buffering=1)
        self._on_task = on_task
        self._partial = ""
        self.lines: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self._f.write(s)
        self._partial += s
        *complete, self._partial = self._partial.split("\n")
        for raw in complete:
            line = _ANSI.sub("", raw)
            self.lines.append(line)
            if m := _TASK_START.search(line):
                self._on_task(m.group(1), "running")
            elif m := _TASK_END.search(line):
                self._on_task(m.group(1), m.group(2).lower())
        return len(s)

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        super().close()
        self._f.close()

    def last_error(self) -> str | None:
        for line in reversed(self.lines):
            m = _ERROR_LINE.match(line)
            if m and (m.group(1) != "RuntimeError" or "Task" not in m.group(2)):
                return m.group(2).strip()
        return None


class _Display:
    """Progress: pipeline stage, training steps, loss, throughput, world size, resumes.

    On a terminal a live rich progress display; elsewhere (CI logs, pipes) plain lines: one per stage
    change and one per tenth of training.
    """

    def __init__(self, console: Console, metrics_path: Path) -> None:
        self.console = console
        self.metrics_path = metrics_path
        self.live = console.is_terminal
        self.progress = Progress(
            TextColumn("{task.description:<16}"), BarColumn(bar_width=30), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console, transient=False,
        )
        self.stage_task = self.progress.add_task("pipeline", total=len(STAGES), info="starting")
        self.train_task = self.progress.add_task("training steps", total=None, info="", visible=False)
        self.failed_task: str | None = None
        self._printed_decile = -1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def on_task(self, name: str, status: str) -> None:
        if status == "running":
            self.progress.update(self.stage_task, info=f"running {name}")
            if name == "train":
                self.progress.update(self.train_task, visible=True)
        elif status == "success":
            self.progress.advance(self.stage_task)
            self.progress.update(self.stage_task, info=f"{name} done")
        else:
            self.failed_task = name
            self.progress.update(self.stage_task, info=f"{name} {status}")
        if not self.live:
            self._line(f"[{time.strftime('%H:%M:%S')}] task {name}: {status}")

    def _follow(self) -> None:
        while not self._stop.wait(0.5):
            self.refresh()

    def refresh(self) -> None:
        with self._lock:
            records = read_jsonl(self.metrics_path)
            steps = [r for r in records if "loss" in r and "step" in r]
            starts = [r for r in records if r.get("event") == "start"]
            resumes = [r for r in records if r.get("event") == "resume"]
            total = starts[-1].get("total_steps") if starts else None
            if total:
                self.progress.update(self.train_task, total=total)
            if not steps:
                return
            last = steps[-1]
            info = (f"epoch {last['epoch']}  loss {last['loss']:.4f}  {last['samples_per_s']:.0f} samples/s  "
                    f"world {last['world_size']}" + (f"  resumes {len(resumes)}" if resumes else ""))
            self.progress.update(self.train_task, completed=last["step"], info=info)
            if not self.live and total:
                decile = 10 * last["step"] // total
                if decile > self._printed_decile:
                    self._printed_decile = decile
                    self._line(f"[{time.strftime('%H:%M:%S')}] step {last['step']}/{total}  {info}")

    def __enter__(self) -> _Display:
        if self.live:
            self.progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.refresh()
        if self.live:
            self.progress.stop()


def _output_dir(opts: RunOptions) -> Path:
    if opts.output_dir is not None:
        return Path(opts.output_dir).resolve()
    return (Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")).resolve()


def _link_latest(out: Path) -> None:
    latest = out.parent / "latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(out.name)


def set_aside_earlier_logs(out: Path) -> Path | None:
    """Move ``<out>/logs`` of an earlier run into the output folder (re-used ``--output-dir``) to
    ``logs.<YYYYmmdd-HHMMSS>`` (``-N`` added if taken), so this run's report and progress display
    never read the earlier run's summary, evaluation, config or metrics; return where it went, or
    ``None`` when there was nothing to move.

    Raises:
        RunInputError: the folder cannot be moved (one line).
    """
    logs = out / "logs"
    if not logs.is_dir() or not any(logs.iterdir()):
        return None
    stamp = datetime.fromtimestamp(logs.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
    target, n = out / f"logs.{stamp}", 1
    while target.exists():
        n += 1
        target = out / f"logs.{stamp}-{n}"
    try:
        logs.rename(target)
    except OSError as e:
        raise RunInputError(f"cannot set aside the earlier run's logs in {logs}: {e.strerror or e}") from e
    return target


def run(opts: RunOptions, *, console: Console | None = None) -> RunReport:
    """Run the training pipeline locally and write ``run-report.json``.

    Raises:
        RunInputError: bad input (nothing was started).
    """
    console = console or Console()
    # Pin the console to today's stdout: a rich Console without a file writes to whatever sys.stdout is
    # at print time, and kfp.local's output is redirected to pipeline.log below.
    console.file = console.file
    if opts.s3_endpoint_url:  # every S3 client of the run: the checks below, the steps and their workers
        from components.training.step import use_s3_endpoint

        use_s3_endpoint(opts.s3_endpoint_url)
    validate(opts)
    out = _output_dir(opts)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunInputError(f"cannot use --output-dir {out}: {e.strerror or e}") from e
    _link_latest(out)
    earlier = set_aside_earlier_logs(out)
    if earlier is not None:
        console.print(f"{out} held an earlier run's logs: kept in {earlier.name}/", style="dim", markup=False)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    args = opts.pipeline_arguments(out)
    report = RunReport(status="running", output_dir=str(out), parameters=args)

    from kfp import local

    from pipelines.training import training_pipeline

    os.environ["TRAINFLOW_LOG_DIR"] = str(logs)
    # The steps' temporary files (KFP's `mktemp -d` per component, torchelastic's log folders) go
    # with the run, not into /tmp, where nothing would remove them; kfp.local's workspace (for
    # dsl.PipelineConfig workspaces, unused here; kfp.local removes it after the pipeline, unless the
    # run is killed) too.
    saved_tmpdir = os.environ.get("TMPDIR")
    (out / "kfp" / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(out / "kfp" / "tmp")
    display = _Display(console, logs / "train-metrics.jsonl")
    # kfp.local warns that display names, resources and the custom base image mean nothing locally.
    warnings.filterwarnings("ignore", module=r"kfp\.local.*")
    pipeline_log = _PipelineLog(out / "pipeline.log", display.on_task)
    t0 = time.monotonic()
    outputs: dict[str, Any] = {}
    try:
        workspace = out / "kfp" / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        with display, contextlib.redirect_stdout(pipeline_log):
            local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(out / "kfp"),
                       workspace_root=str(workspace), raise_on_error=True)
            outputs = dict(training_pipeline(**args).outputs)
        report.status = "succeeded"
    except Exception as e:  # a failed task: kfp.local raises RuntimeError; the cause is in the log
        report.status = "failed"
        report.failed_task = display.failed_task
        report.error = pipeline_log.last_error() or (str(e).splitlines() or [type(e).__name__])[0]
    finally:
        pipeline_log.close()
        os.environ.pop("TRAINFLOW_LOG_DIR", None)
        if saved_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_tmpdir
    report.pipeline_seconds = round(time.monotonic() - t0, 3)
    _fill_report(report, outputs, logs)
    (out / "run-report.json").write_text(json.dumps(asdict(report), indent=1))
    return report


def _fill_report(report: RunReport, outputs: dict[str, Any], logs: Path) -> None:
    summary: dict[str, Any] = {}
    if outputs.get("train_summary"):
        summary = json.loads(outputs["train_summary"])
    elif (logs / "train-summary.json").is_file():
        summary = json.loads((logs / "train-summary.json").read_text())
    if summary:
        report.steps = summary.get("steps")
        report.checkpoints_committed = summary.get("checkpoints_committed")
        report.resumes = [
            {k: r[k] for k in ("killed_at_step", "resumed_from_step", "lost_steps", "restart_seconds")}
            for r in summary.get("resumes", [])
        ]
        report.checkpoint_stall_seconds_total = summary.get("checkpoint_stall_seconds_total")
        report.train_seconds = summary.get("train_seconds")
        report.final_loss = summary.get("final_loss")
        report.world_sizes = summary.get("world_sizes", [])
    if "test_accuracy" in outputs:
        report.test_accuracy = float(outputs["test_accuracy"])
    if (logs / "eval.json").is_file():
        ev = json.loads((logs / "eval.json").read_text())  # a user's task: test_<its metric names>
        report.test_accuracy = ev.get("test_accuracy") if report.test_accuracy is None else report.test_accuracy
        report.test_loss = ev.get("test_loss")
        report.test_metrics = ev
        if "test_accuracy" not in ev:  # the task has no accuracy: evaluate's 0.0 is a placeholder
            report.test_accuracy = None
    if "model_version" in outputs:
        report.model_version = int(outputs["model_version"])
    config_path = logs / "train-config.json"
    if config_path.is_file():
        report.job_key = json.loads(config_path.read_text())["job_key"]


def summary_table(report: RunReport) -> Table:
    """The table printed at the end of ``trainflow run``."""
    table = Table(title="trainflow run", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # paths and errors in full, folded, never cut short
    color = "green" if report.status == "succeeded" else "red"
    table.add_row("status", f"[{color}]{report.status}[/{color}]")
    if report.error:  # as text: an error's "[pod=exit 2 ...]" is not rich markup
        table.add_row("error", Text(f"{report.failed_task or 'pipeline'}: {report.error}"))
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    if report.test_accuracy is not None or not report.test_metrics:
        table.add_row("test accuracy", fmt(report.test_accuracy, ".4f"))
    for name, value in sorted(report.test_metrics.items()):  # a task's own metrics (test_<name>)
        if name not in ("test_accuracy", "test_loss") and isinstance(value, int | float):
            table.add_row(name.replace("_", " "), fmt(value, ".4g"))
    table.add_row("steps", fmt(report.steps, "d"))
    table.add_row("world sizes", " → ".join(map(str, report.world_sizes)) or "-")
    table.add_row("checkpoints committed", fmt(report.checkpoints_committed, "d"))
    table.add_row("checkpoint stall total", fmt(report.checkpoint_stall_seconds_total, ".3f") + " s")
    for i, r in enumerate(report.resumes, 1):
        table.add_row(f"resume {i}", f"killed at step {r['killed_at_step']}, resumed from {r['resumed_from_step']}, "
                                     f"lost {r['lost_steps']} steps, restart {fmt(r['restart_seconds'], '.1f')} s")
    table.add_row("train seconds", fmt(report.train_seconds, ".1f"))
    table.add_row("pipeline seconds", fmt(report.pipeline_seconds, ".1f"))
    table.add_row("model version", fmt(report.model_version, "d"))
    table.add_row("output", Text(f"{report.output_dir}/run-report.json"))
    return table
