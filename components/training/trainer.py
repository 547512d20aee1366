"""The elastic-DDP trainer: ``train()`` = load ▶ loop(step, after_step) ▶ close.

It trains a *task* (:mod:`trainflow.task`, ``--task``; default the built-in ``image_classification``):
the task gives the model, the training dataset, the collate function and the batch-mean loss (and
optionally optimizer, LR schedule, its own state, a data fingerprint); everything below is the harness's.

Every start loads the newest committed checkpoint under the job key, so the same command is safe
after any restart (torchrun restarting workers, a pod restart, a KFP or Airflow retry). Saved state:
model, optimizer, LR scheduler, grad scaler, step/epoch/data position, and every rank's RNG streams.

One tiny all-reduce per step carries ``[loss_sum, save_due, stop_requested, fenced]`` so that
every rank agrees on the reported global loss, on *when* to checkpoint (rank 0's clock decides
time-based saves), on stopping after SIGTERM and on stopping when a newer writer took over the job key
(``checkpoint.manager``, writer fencing); a disagreement between ranks is impossible by construction.

Resuming checks the checkpoint's identity first: a checkpoint of another task, another dataset
(the task's fingerprint, else its sample count) or another model (architecture, structure signature)
under the same job key is refused with one line (:class:`ConfigError`, exit 2), never
loaded into the wrong job.

Bit-exact resume (same world size, CPU or 2 GPUs): data order is a pure function of
(seed, epoch, position) (``components.training.data``), RNG states are restored per rank, kernels are
deterministic (``torch.use_deterministic_algorithms``), and saving never consumes randomness.

Adaptive batch (opt-in, ``--adaptive-batch``; ``components.training.goodput``): the global batch is
re-chosen for goodput at every (re)start and epoch end, the learning rate follows AdaScale, and the job
ends when its B0-equivalent progress reaches ``epochs x`` the dataset size. A DDP communication hook
measures each rank's local gradient before the all-reduce for the gradient noise scale. A resume
restores batch, progress, noise-scale averages and step timings exactly but is NOT bit-exact: the batch
choice depends on measured step times.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from components.training import data as datamod
from components.training import distributed as dist_utils
from components.training import goodput, rng
from components.training.checkpoint.manager import (
    CheckpointManager,
    LoadedCheckpoint,
    WriterFencedError,
    describe_error,
)
from components.training.distributed import DistEnv
from components.training.faults import FaultInjector
from components.training.metrics import (
    FanOut,
    IdleMetricsSink,
    JsonlSink,
    MetricsSink,
    NullSink,
    PrometheusSink,
)
from trainflow.common.cpus import threads_per_rank
from trainflow.common.training_spec import ConfigError, TrainConfig
from trainflow.storage import CheckpointStorage, CheckpointStorageError, join_uri, storage_for
from trainflow.task import Task, load_task, model_signature, move_to_device

log = logging.getLogger("trainflow.trainer")

EXIT_PREEMPTED = 143
"""Exit code after a SIGTERM save: retryable under the training operator's ExitCode policy."""


def sample_log(where: str) -> JsonlSink:
    """The sample log of this process (``sample_log_dir``): one JSON record per optimizer step with
    ``step``, ``epoch``, ``rank``, ``world_size``, ``incarnation``, ``incarnation_started`` (Unix s)
    and the ``ids`` of the samples this rank consumed (plus ``time``).

    ``where`` is a local folder (file ``samples-<pid>-<ns>.jsonl``, a line per step) or a storage
    URI (``s3://...``: segment objects of one writer per process, flushed every second and on
    close, as :class:`~components.training.metrics.JsonlSink` writes metrics), so workers in pods
    leave their log where the auditor can read it; :func:`~components.training.metrics.read_jsonl`
    of the URI reads every writer's records.
    """
    if "://" in where:
        return JsonlSink(where, flush_interval_s=1.0)
    return JsonlSink(Path(where, f"samples-{os.getpid()}-{time.time_ns()}.jsonl"))


#: Errors of the device (subclasses of RuntimeError) that say nothing about a checkpoint's fit.
_DEVICE_ERRORS: tuple[type[BaseException], ...] = tuple(
    e for e in (getattr(torch, "OutOfMemoryError", None), getattr(torch, "AcceleratorError", None)) if e is not None)


class Preempted(Exception):
    """SIGTERM was received; a final checkpoint was attempted (the message says whether it was saved)."""


@dataclass(slots=True)
class TrainState:
    """Where training is. ``samples_in_epoch`` is the global data position (see ``data``)."""

    step: int = 0
    epoch: int = 0
    samples_in_epoch: int = 0

    def advance(self, n_global: int, num_samples: int) -> None:
        self.step += 1
        self.samples_in_epoch += n_global
        if self.samples_in_epoch >= num_samples:
            self.epoch += 1
            self.samples_in_epoch = 0


def model_state_for_checkpoint(model: torch.nn.Module, *, copy_buffers: bool) -> dict[str, Any]:
    """``model.state_dict()`` for a checkpoint, its buffers copied now when ``copy_buffers``.

    On CUDA a checkpoint's staging copies run on a side stream while training goes on, and only
    ``optimizer.step()`` waits for them (``CheckpointManager.wait_for_staging``): that keeps the
    parameters and the optimizer's state still, but the next step's forward changes buffers in place
    (BatchNorm's ``running_mean``, ``running_var``, ``num_batches_tracked``) before it, so a
    checkpoint could hold the weights of step N with the statistics of step N + 1. A copy of each
    buffer made on the current stream, before that forward is queued, is what the side stream then
    reads (a few KiB to MiB: BatchNorm's statistics are per channel). Parameters are not copied.

    Returns:
        The state dict's entries (a plain dict), buffers as fresh tensors when ``copy_buffers``.
    """
    state = model.state_dict()
    if not copy_buffers:
        return state
    buffers = {name for name, _ in model.named_buffers()}
    return {k: v.clone() if k in buffers and isinstance(v, torch.Tensor) else v for k, v in state.items()}


class SaveSchedule:
    """Whether a periodic checkpoint is due, by steps and/or seconds since the last one (rank 0)."""

    def __init__(self, *, interval_steps: int | None, interval_s: float | None, clock: Any = time.monotonic) -> None:
        self.interval_steps = interval_steps
        self.interval_s = interval_s
        self.clock = clock
        self.last_step = 0
        self.last_time = clock()

    def due(self, step: int) -> bool:
        by_steps = self.interval_steps is not None and step - self.last_step >= self.interval_steps
        by_time = self.interval_s is not None and self.clock() - self.last_time >= self.interval_s
        return by_steps or by_time

    def mark(self, step: int) -> None:
        """Restart both intervals at ``step`` (a save was staged or committed there, or a resume)."""
        self.last_step = step
        self.last_time = self.clock()


@dataclass(frozen=True, slots=True)
class TrainResult:
    steps: int
    epochs_completed: int
    final_loss: float
    resumed_from_step: int | None
    checkpoints_committed: int
    checkpoint_stall_seconds_total: float
    train_seconds: float


def _lr_lambda(total_steps: int, warmup_steps: int, schedule: str):
    def f(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def step_optimizer(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """``scaler.step(optimizer)`` then ``scaler.update()``; returns whether the optimizer stepped.

    With fp16 loss scaling, a step whose gradients hold inf/NaN is skipped and the scale falls
    (``torch.amp.GradScaler``); the caller then leaves the LR schedule where it is, as Hugging Face
    Accelerate does (``AcceleratedScheduler``: no scheduler step where the optimizer step was
    skipped), so that overflow steps do not eat the warmup. A disabled scaler always steps. With
    fp16 on, reading the scale synchronises with the device once per step.
    """
    before = scaler.get_scale() if scaler.is_enabled() else None
    scaler.step(optimizer)
    scaler.update()
    return before is None or scaler.get_scale() >= before


def lr_plan_change(saved: dict[str, Any] | None, ours: dict[str, Any], schedule_step: int) -> str | None:
    """How this run's built-in LR plan differs from the one a checkpoint was written under, in one
    line for a warning, or None (the same plan, or a checkpoint that stored none).

    A plan is ``{"learning_rate", "total_steps", "warmup_steps", "lr_schedule"}``. The checkpoint's
    LR schedule state carries its base learning rate (``LambdaLR.state_dict``), so a changed
    ``--learning-rate`` does not apply on resume; the schedule's shape is this run's (its lambda is
    code, not state), so a changed ``--epochs``/``--max-steps`` (total steps), warmup or schedule moves
    the learning rate at once.

    Args:
        saved: the checkpoint's plan (``train_state["lr_plan"]``), or None.
        ours: this run's plan.
        schedule_step: the LR schedule's step count after the resume (``LambdaLR.last_epoch``).
    """
    if not saved or saved == ours:
        return None
    base = float(saved["learning_rate"])
    before = base * _lr_lambda(saved["total_steps"], saved["warmup_steps"], saved["lr_schedule"])(schedule_step)
    after = base * _lr_lambda(ours["total_steps"], ours["warmup_steps"], ours["lr_schedule"])(schedule_step)
    changed = [f"{name} {saved[key]} -> {ours[key]}" for key, name in
               (("total_steps", "total steps"), ("warmup_steps", "warmup steps"), ("lr_schedule", "schedule"))
               if saved[key] != ours[key]]
    said = []
    if changed:
        said.append(f"the LR schedule changed ({', '.join(changed)}): the learning rate goes from {before:.6g} to "
                    f"{after:.6g} at once")
    if float(ours["learning_rate"]) != base:
        said.append(f"--learning-rate {ours['learning_rate']:g} does not apply: the checkpoint's {base:g} is kept "
                    "(its LR schedule state carries it; start afresh under another --job-key to change it)")
    return "; ".join(said) or None


class Trainer:
    """Owns one rank's training job. Build with a validated :class:`TrainConfig`.

    What it trains is a task (:mod:`trainflow.task`; ``cfg.model.task``, default the built-in
    ``image_classification``): model, training data, loss and the task's own state come from it;
    choosing the samples, loss weighting over ranks, backward, AMP, clipping, the optimizer step,
    checkpoints and metrics stay here.

    Raises (from ``__init__``):
        TaskError, ConfigError: the task cannot be built, or a task LR schedule with adaptive batch.
        DatasetError: the dataset folder is missing or invalid.
        CheckpointStorageError: the checkpoint storage is unreachable or unwritable.
    """

    def __init__(self, cfg: TrainConfig, env: DistEnv, *, clock: Any = time.monotonic) -> None:
        self.cfg = cfg
        self.env = env
        self.clock = clock
        self.device = env.device()
        self._configure_runtime()

        self.task_args = cfg.task_kwargs()
        self.task: Task = load_task(cfg.model.task, self.task_args)
        self.train_data = self.task.train_dataset()
        self.num_samples = len(self.train_data)
        if self.num_samples < 1:
            raise ConfigError(f"task {cfg.model.task!r} has an empty training dataset")
        self.steps_per_epoch = datamod.steps_per_epoch(self.num_samples, cfg.data.global_batch_size)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        if cfg.max_steps:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        # The job's seed: ``--seed`` until a checkpoint is resumed, then the checkpoint's (see _load).
        self.seed = cfg.seed

        rng.seed_all(cfg.seed)  # identical initial weights on every rank
        self.model = self.task.build_model().to(self.device)
        self.model_signature = model_signature(self.model)
        self.dist_active = dist_utils.active()
        # Every rank has its data and model before DDP's first collectives (on the default group, whose
        # timeout is short): a rank that downloads a big dataset (a new pod after a scale-up) would
        # otherwise time the others out, and restart the worker group, which starts its download over.
        dist_utils.barrier()
        self.net: nn.Module = (
            DistributedDataParallel(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            if self.dist_active
            else self.model
        )
        self.optimizer = (self.task.configure_optimizer(self.model, learning_rate=cfg.optim.learning_rate)
                          or self._build_optimizer())
        task_scheduler = self.task.configure_lr_scheduler(self.optimizer, total_steps=self.total_steps)
        if task_scheduler is not None and cfg.data.adaptive_batch:
            raise ConfigError(f"task {cfg.model.task!r} brings its own learning-rate schedule, which adaptive batch "
                              "cannot drive (it sets the learning rate each step): drop --adaptive-batch or the "
                              "task's configure_lr_scheduler")
        self._builtin_schedule = task_scheduler is None
        self._plan_rate = float(cfg.optim.learning_rate)  # the resumed plan's, once a checkpoint is loaded
        self.scheduler = task_scheduler or torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(self.total_steps, cfg.optim.warmup_steps, cfg.optim.lr_schedule)
        )
        self.adaptive: goodput.AdaptiveBatch | None = None
        if cfg.data.adaptive_batch:
            self.adaptive = goodput.AdaptiveBatch(
                base_batch=cfg.data.global_batch_size, max_global_batch=min(cfg.data.max_global_batch, self.num_samples),
                max_local_batch=cfg.data.max_local_batch_size or None, target_samples=float(cfg.epochs * self.num_samples))
            self._gns_local: list[torch.Tensor] = []
            self._gns_global_sq = 0.0
            self._gns_local_sq = 0.0
            self._step_s = 0.0
            self._time_next_step = False  # the first step after a (re)start or batch change is not timed
            self._picked_at_s = 0.0  # rank 0's clock at the last batch choice
            self._retune_due = False
            if self.dist_active:
                self.net.register_comm_hook(None, self._gns_comm_hook)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.optim.amp == "fp16")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.optim.amp)
        rng.seed_all(cfg.seed * 1_000 + env.rank)  # per-rank streams (dropout) from here on

        self.metrics = self._build_metrics()
        self.storage: CheckpointStorage = storage_for(join_uri(cfg.checkpoint.uri, cfg.checkpoint.job_key))
        self.storage.check()
        self.fingerprint = self.task.data_fingerprint()
        self.ckpt = CheckpointManager(
            self.storage,
            keep_last_k=cfg.checkpoint.keep_last_k,
            clock=clock,
            manifest_extra={"job_key": cfg.checkpoint.job_key, **self._identity(),
                            "task_args": self.task_args, "torch_version": torch.__version__},
            on_event=lambda event: self.metrics.record(event),
        )
        # A run for another model or dataset under this key is refused (in _load) without claiming it:
        # a claim first made a new writer generation, which fenced the job that owns the key (its
        # next save failed for good) and aborted its upload in flight.
        self._foreign_key: str | None = None
        if env.is_main:
            latest = self.ckpt.latest_manifest()
            self._foreign_key = self._identity_mismatch(latest) if latest is not None else None
            if self._foreign_key is None:
                self.ckpt.claim()  # the newest writer generation owns the key; older ones stop writing
        self.schedule = SaveSchedule(interval_steps=cfg.checkpoint.interval_steps or None,
                                     interval_s=cfg.checkpoint.interval_s or None, clock=clock)
        self.faults = FaultInjector(at_step=cfg.fault_at_step or None, storage=self.storage, rank=env.rank,
                                    world_size=env.world_size)
        self.state = TrainState()
        self.resumed_from: int | None = None
        self._stop_requested = False
        self._sigterm_at_s: float | None = None  # time.monotonic() of the first SIGTERM
        self._step_lr = 0.0  # the learning rate the last step used (set in _step, recorded per step)
        self._last_loss = float("nan")
        self._pending_first_step_event = False
        self._last_outcome: str | None = None
        self._sample_log: JsonlSink | None = None
        self.incarnation: dict[str, Any] = {"id": "", "started": 0.0}
        if cfg.sample_log_dir:
            self._sample_log = sample_log(cfg.sample_log_dir)

    # ------------------------------------------------------------------------------- set-up
    def _configure_runtime(self) -> None:
        threads = self.cfg.threads_per_rank or threads_per_rank(self.env.local_world_size)
        torch.set_num_threads(threads)
        if self.cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.benchmark = False
            if "torch._inductor" in sys.modules:
                torch.use_deterministic_algorithms(True, warn_only=True)
            else:
                # The public call also configures Inductor, which imports torch._inductor and
                # torch._dynamo: 3-4 s of every worker start (a fifth of a restart here). The trainer
                # never compiles, so set the ATen flag alone (torch/__init__.py,
                # use_deterministic_algorithms: inductor config + _C._set_deterministic_algorithms).
                torch._C._set_deterministic_algorithms(True, warn_only=True)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        o = self.cfg.optim
        if o.optimizer == "adamw":
            return torch.optim.AdamW(self.model.parameters(), lr=o.learning_rate, weight_decay=o.weight_decay)
        return torch.optim.SGD(self.model.parameters(), lr=o.learning_rate, momentum=o.momentum, weight_decay=o.weight_decay)

    def _build_metrics(self) -> MetricsSink:
        if not self.env.is_main:
            if self.cfg.metrics_port and self.env.local_rank == 0:  # torchrun numbers ranks per agent:
                # rank 0 is local rank 0 of one pod; the other pods answer their scrapes empty
                return IdleMetricsSink(port=self.cfg.metrics_port, addr=self.cfg.metrics_addr)
            return NullSink()
        sinks: list[MetricsSink] = []
        if self.cfg.metrics_path:
            sinks.append(JsonlSink(self.cfg.metrics_path))
        if self.cfg.metrics_port:
            sinks.append(PrometheusSink(port=self.cfg.metrics_port, addr=self.cfg.metrics_addr,
                                        job_key=self.cfg.checkpoint.job_key,
                                        last_commit_unix_s=lambda: self.ckpt.stats.last_commit_unix_s))
        return FanOut(sinks)

    # --------------------------------------------------------------------------------- loop
    def train(self) -> TrainResult:
        """Run to the last step (or until SIGTERM: save, then raise :class:`Preempted`).

        Raises:
            Preempted: SIGTERM received (a checkpoint save was attempted first).
            ConfigError: the checkpoint under the job key belongs to another task, dataset, model or
                optimizer, or cannot be applied to this one.
            WriterFencedError: a newer run took over the job key.
            CheckpointRefusedError: a state ``torch.load(weights_only=True)`` refuses (at save or load).
            CheckpointStorageError: reading a checkpoint failed for another reason than corruption
                (resuming, or verifying the last step at the end): a read the storage refuses (denied,
                a step file that cannot be opened) or an outage; the original error is its cause.
                Also (rank 0) when the final checkpoint could not be saved and there is no model
                output to export (see ``_close``).
        """
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        t0 = self.clock()
        try:
            self._load()
            self._stop_if_signalled_while_loading()
            while not self._done():
                self._run_epoch()
            self._close()
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.metrics.close()
            if self._sample_log:
                self._sample_log.close()
        return TrainResult(
            steps=self.state.step,
            epochs_completed=self.state.epoch,
            final_loss=self._last_loss,
            resumed_from_step=self.resumed_from,
            checkpoints_committed=self.ckpt.stats.committed,
            checkpoint_stall_seconds_total=self.ckpt.stats.stall_seconds_total,
            train_seconds=self.clock() - t0,
        )

    def _stop_if_signalled_while_loading(self) -> None:
        """Stop without a step or a save when a rank got SIGTERM before training began (while the
        checkpoint loaded: seconds to minutes for a big one). The run stands at the step it resumed
        from, committed already; a step and a full save more could outlast the pod's grace period,
        and would save little. The ranks agree through one gather on the control group.

        Raises:
            Preempted: a rank was signalled.
        """
        if not any(dist_utils.gather_objects(self._stop_requested)):
            return
        step = self.state.step
        self.metrics.record({"event": "preempted", "step": step, "outcome": "nothing_to_save",
                             "since_sigterm_s": self._since_sigterm_s()})
        raise Preempted(f"SIGTERM received before the first step; stopped at step {step}, which is "
                        f"{'the checkpoint resumed from' if self.resumed_from else 'the start'}: nothing to save")

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._sigterm_at_s is None:
            self._sigterm_at_s = time.monotonic()
        self._stop_requested = True

    def _since_sigterm_s(self) -> float | None:
        """Seconds since this process's first SIGTERM (None on a rank that was not signalled)."""
        return None if self._sigterm_at_s is None else time.monotonic() - self._sigterm_at_s

    def _done(self) -> bool:
        if self.adaptive is None:
            return self.state.step >= self.total_steps
        return self.adaptive.done or (bool(self.cfg.max_steps) and self.state.step >= self.cfg.max_steps)

    def _choose_batch(self) -> int:
        """Adaptive mode: rank 0 picks the batch from its timings; every rank takes its choice."""
        assert self.adaptive is not None
        before = self.adaptive.batch_size
        batch = dist_utils.broadcast_object(self.adaptive.choose(self.env.world_size) if self.env.is_main else None)
        self.adaptive.batch_size = batch
        self._picked_at_s = time.monotonic()
        self._retune_due = False
        self._time_next_step = False
        self.metrics.record({"event": "batch_size_chosen", "step": self.state.step, "epoch": self.state.epoch,
                             "samples_in_epoch": self.state.samples_in_epoch, "world_size": self.env.world_size, "previous_global_batch_size": before,
                             "global_batch_size": batch, "gradient_noise_scale": self.adaptive.phi})
        if self.env.is_main and batch != before:
            log.info("adaptive batch: global batch %d -> %d at world size %d (phi %s)", before, batch,
                     self.env.world_size, self.adaptive.phi)
        return batch

    def _run_epoch(self) -> None:
        cfg = self.cfg
        epoch = self.state.epoch
        batch_size = self._choose_batch() if self.adaptive is not None else cfg.data.global_batch_size
        perm = datamod.epoch_permutation(self.num_samples, self.seed, epoch)
        batches = datamod.iter_task_batches(
            self.train_data, self.task.collate, perm=perm, start=self.state.samples_in_epoch,
            global_batch_size=batch_size, rank=self.env.rank, world_size=self.env.world_size,
            loader_workers=cfg.data.dataloader_num_workers, loader_seed=self.seed * 1_000_003 + epoch,
        )
        for batch, ids, n_global in batches:
            t_start = time.perf_counter()
            loss_sum = self._step(batch, len(ids), n_global)
            self._after_step(loss_sum, ids, n_global, t_start, epoch)
            if self._done() or self.state.epoch != epoch:
                break
            if self.adaptive is not None and self._retune_due:  # re-pick mid-epoch: data resume in samples
                break

    def _gns_comm_hook(self, state, bucket):  # unannotated: DDP rejects string annotations here
        """DDP communication hook: the squared norm of this rank's gradient bucket before the
        all-reduce (for the gradient noise scale), then DDP's own averaging all-reduce."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self._gns_local.append(bucket.buffer().detach().float().pow(2).sum())
        return default_hooks.allreduce_hook(state, bucket)

    def _measure_gns(self, n_global: int, n_local: int) -> None:
        """Squared norms of this rank's mean-loss gradient (from the hook) and of the averaged one."""
        inv_scale_sq = 1.0 / float(self.scaler.get_scale()) ** 2 if self.scaler.is_enabled() else 1.0
        grads = [p.grad.detach().float().pow(2).sum() for p in self.model.parameters() if p.grad is not None]
        self._gns_global_sq = float(torch.stack(grads).sum()) * inv_scale_sq if grads else 0.0
        local = float(sum(self._gns_local)) if self._gns_local else float("nan")
        # The local mean loss is scaled by n_local * W / n_global (see _step): undo it.
        k = n_global / (self.env.world_size * n_local) if n_local else 0.0
        self._gns_local_sq = local * inv_scale_sq * k * k
        self._gns_local.clear()

    def _step(self, batch: Any, n_local: int, n_global: int) -> torch.Tensor:
        """One optimizer step; returns this rank's loss sum (float64: the task's batch mean x n_local).

        The task's loss is the mean over this rank's ``n_local`` samples; it is weighted by
        ``n_local * W / n_global`` so that DDP's gradient average equals the gradient of the mean loss
        over the whole global batch, however unevenly it is split over ranks. A rank without samples
        (``n_local`` 0) computes the loss of its placeholder sample with weight 0: DDP's all-reduce
        still runs on every rank, and its gradient contribution is nothing."""
        t0 = time.perf_counter()
        batch = move_to_device(batch, self.device, non_blocking=True)
        self.net.train()
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None else contextlib.nullcontext()
        )
        with autocast:
            mean = self.task.loss(self.net, batch)
            if not isinstance(mean, torch.Tensor) or mean.numel() != 1:
                raise ConfigError(f"task {self.cfg.model.task!r}: loss must return a scalar tensor (the batch "
                                  f"mean), got {type(mean).__name__}"
                                  f"{'' if not isinstance(mean, torch.Tensor) else f' of shape {tuple(mean.shape)}'}")
            mean = mean.reshape(())
            loss = mean * (n_local * self.env.world_size / n_global)
        self.optimizer.zero_grad(set_to_none=True)
        if self.adaptive is not None:
            self._gns_local.clear()
        self.scaler.scale(loss).backward()
        if self.adaptive is not None:
            self._measure_gns(n_global, n_local)
            lr = goodput.lr_factor(self.adaptive.progress_samples, self.adaptive.target_samples,
                                   warmup_samples=self.cfg.optim.warmup_steps * self.adaptive.base_batch,
                                   schedule=self.cfg.optim.lr_schedule,
                                   base_batch=self.adaptive.base_batch) * self.adaptive.gain(n_global)
            for group, base_lr in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
                group["lr"] = base_lr * lr
        if self.cfg.optim.grad_clip_norm:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip_norm)
        t_wait = time.perf_counter()
        self.ckpt.wait_for_staging()  # the weights must not change while a snapshot reads them
        waited_s = time.perf_counter() - t_wait
        self._step_lr = float(self.optimizer.param_groups[0]["lr"])  # the LR this step uses (the record's)
        stepped = step_optimizer(self.scaler, self.optimizer)
        if self.adaptive is None and stepped:
            self.scheduler.step()
        else:  # compute time only: a wait for a checkpoint snapshot is no property of the batch size
            self._step_s = time.perf_counter() - t0 - waited_s
        return mean.detach().double() * n_local

    def _after_step(self, loss_sum, ids, n_global, t_start, epoch) -> None:
        self.state.advance(n_global, self.num_samples)
        step = self.state.step
        # rank 0 decides; a save that cannot start yet (the previous one still persists) stays due
        # and is made at the first step after it, at no cost to the steps in between
        save_due = 1.0 if self.env.is_main and self.schedule.due(step) and self.ckpt.ready_for_periodic(step) else 0.0
        fenced = 1.0 if self.env.is_main and self.ckpt.fenced is not None else 0.0
        agreed = torch.stack([loss_sum.cpu(), torch.tensor(save_due, dtype=torch.float64),
                              torch.tensor(1.0 if self._stop_requested else 0.0, dtype=torch.float64),
                              torch.tensor(fenced, dtype=torch.float64)])
        if self.adaptive is not None:
            # + [local squared norm, 1 / local batch, rank had samples, averaged gradient's squared norm,
            # re-pick due (rank 0's clock)] at indices 4..8: summed here so that every rank derives phi, progress, the
            # end and the moment of the next batch choice from the same numbers.
            n_local = len(ids)
            retune = self.env.is_main and time.monotonic() - self._picked_at_s >= self.cfg.data.adaptive_interval_s
            agreed = torch.cat([agreed, torch.tensor(
                [self._gns_local_sq if n_local else 0.0, 1.0 / n_local if n_local else 0.0, 1.0 if n_local else 0.0,
                 self._gns_global_sq, 1.0 if retune else 0.0], dtype=torch.float64)])
        if self.dist_active and self.device.type == "cuda":
            agreed = dist_utils.all_reduce_sum(agreed.to(self.device)).cpu()
        else:
            dist_utils.all_reduce_sum(agreed)
        loss = float(agreed[0]) / n_global
        self._last_loss = loss
        adaptive_rec = self._adaptive_after_step(agreed, n_global) if self.adaptive is not None else {}
        if self._sample_log:
            self._sample_log.record({
                "step": step, "epoch": epoch, "rank": self.env.rank, "world_size": self.env.world_size,
                "incarnation": self.incarnation["id"], "incarnation_started": self.incarnation["started"],
                "ids": ids.tolist()})
        stall = 0.0

        def record_step() -> dict[str, Any]:
            dt = time.perf_counter() - t_start
            rec = {"step": step, "epoch": epoch, "loss": loss, "samples_per_s": n_global / dt if dt > 0 else 0.0,
                   "step_seconds": dt, "world_size": self.env.world_size, "lr": self._step_lr, "ckpt_stall_s": stall,
                   **adaptive_rec}
            self.metrics.record(rec)
            if self._pending_first_step_event:
                self._pending_first_step_event = False
                self.metrics.record({"event": "first_step_after_resume", "step": step})
            return rec

        # The step is recorded before a stop too: a SIGTERM save commits this step, so the resumed run
        # never trains it again, and its loss would be missing from the metrics for good.
        if float(agreed[3]) > 0:  # rank 0's writer was fenced: another run owns the key now
            record_step()
            raise WriterFencedError(str(self.ckpt.fenced) if self.ckpt.fenced else
                                    "a newer writer took over this job key; this run stops")
        if float(agreed[2]) > 0:  # any rank got SIGTERM: everyone saves (within the deadline), then stops
            # The deadline counts from the start of the save. Counting it from the signal (as the
            # grace period does) was tried and reverted: a save that would commit within the grace
            # period's margin was abandoned at the deadline (the process then exits at once).
            since_sigterm_s = self._since_sigterm_s()
            record_step()
            self._save(blocking=True, reason="preempted", deadline_s=self.cfg.checkpoint.preemption_save_deadline_s)
            outcome = dist_utils.broadcast_object(self._last_outcome)
            self.metrics.record({"event": "preempted", "step": step, "outcome": outcome,
                                 "since_sigterm_s": since_sigterm_s})
            if outcome == "committed":
                raise Preempted(f"SIGTERM received; checkpoint saved at step {step}")
            if outcome == "fenced":  # a newer run owns the key: this one must not be restarted (exit 2)
                raise WriterFencedError(str(self.ckpt.fenced) if self.ckpt.fenced else
                                        "a newer writer took over this job key; this run stops")
            last = self.ckpt.stats.last_committed_step
            newest = f"; the newest checkpoint this run committed is {'none' if last is None else f'step {last}'}"
            raise Preempted(f"SIGTERM received; checkpoint NOT saved at step {step} ({outcome})"
                            + (newest if self.env.is_main else ""))
        if float(agreed[1]) > 0 and not self._done():
            stall = self._save(blocking=False, reason="periodic")
        rec = record_step()
        if self.env.is_main and (step % self.cfg.log_every_steps == 0 or self._done()):
            log.info("step %d/%d epoch %d loss %.4f %.0f samples/s world %d", step, self.total_steps, epoch, loss,
                     rec["samples_per_s"], self.env.world_size)
        self.faults.maybe_fire(step)
        if self.cfg.throttle_step_s:
            time.sleep(self.cfg.throttle_step_s)

    def _adaptive_after_step(self, agreed: torch.Tensor, n_global: int) -> dict[str, Any]:
        """Adaptive mode, after the per-step all-reduce: count progress (at the phi this step's LR
        used), update the noise scale, record the step time; returns the metrics fields."""
        a = self.adaptive
        assert a is not None
        world = self.env.world_size
        self._retune_due = float(agreed[8]) > 0
        gain = a.gain(n_global)
        a.advance(n_global)
        full_batch = n_global == a.batch_size
        # Full batches only: the estimate's spread grows as the local batch shrinks, and one epoch's
        # short last batch (1-2 samples a rank) weighed as much as a full one in the averages: its
        # wild |G|^2 inflated phi 4-5x, and with it the LR (AdaScale's gain) and the progress counted.
        if world >= 2 and int(agreed[6]) == world and full_batch:
            est = goodput.gns_sample(float(agreed[4]) / world, float(agreed[5]) / world, float(agreed[7]) / world,
                                     float(n_global))
            if est is not None:
                a.gns.update(*est)
        if self._time_next_step and full_batch:
            a.observations.add(world, n_global / world, self._step_s)
        self._time_next_step = full_batch
        return {"global_batch_size": a.batch_size, "step_samples": n_global, "gradient_noise_scale": a.phi,
                "adascale_gain": gain,
                "progress_samples": a.progress_samples, "remaining_samples": a.remaining_samples,
                "goodput_samples_per_second": {str(w): g for w, g in a.goodput_by_world().items()}
                if self.env.is_main else {}}

    # ------------------------------------------------------------------------ checkpointing
    def _training_state(self, rng_by_rank: list[dict]) -> dict[str, Any]:
        return {
            "model": model_state_for_checkpoint(self.model, copy_buffers=self.device.type == "cuda"),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict(),
            "train_state": {**asdict(self.state), "world_size": self.env.world_size, "seed": self.seed,
                            "lr_plan": self._lr_plan(in_use=True)},
            "rng": {"world_size": self.env.world_size, "ranks": rng_by_rank},
            **({"adaptive_batch": self.adaptive.state_dict()} if self.adaptive is not None else {}),
            "task_state": self.task.state_dict(),
        }

    def _lr_plan(self, *, in_use: bool = False) -> dict[str, Any] | None:
        """The built-in LR schedule's inputs (see :func:`lr_plan_change`); None where a task brings its
        own schedule or adaptive batch sets the learning rate each step. ``in_use``: the
        ``--learning-rate`` the schedule's base rate came from (a resumed checkpoint's, which a
        changed flag does not replace; carried from plan to plan, so that a task whose optimizer
        scales it per parameter group is not told its flag did not apply), else this run's flag."""
        if self.adaptive is not None or not self._builtin_schedule:
            return None
        rate = self._plan_rate if in_use else self.cfg.optim.learning_rate
        return {"learning_rate": rate, "total_steps": self.total_steps,
                "warmup_steps": self.cfg.optim.warmup_steps, "lr_schedule": self.cfg.optim.lr_schedule}

    def _save(self, *, blocking: bool, reason: str, deadline_s: float | None = None) -> float:
        """Checkpoint at the current step on every rank's behalf; returns the blocking seconds.
        Rank 0's outcome (``CheckpointManager.save``) is left in ``_last_outcome``."""
        t0 = time.perf_counter()
        rng_by_rank = dist_utils.gather_objects(rng.capture())  # all ranks take part
        outcome = None
        if self.env.is_main:
            outcome = self.ckpt.save(
                self.state.step, self._training_state(rng_by_rank), blocking=blocking,
                manifest_fields={"epoch": self.state.epoch, "samples_in_epoch": self.state.samples_in_epoch,
                                 "world_size": self.env.world_size, "reason": reason},
                deadline_s=deadline_s,
            )
            if outcome in ("staged", "committed"):  # not "skipped": the save stays due
                self.schedule.mark(self.state.step)
        self._last_outcome = outcome
        stall = time.perf_counter() - t0
        if self.env.is_main:
            self.metrics.record({"event": "checkpoint", "step": self.state.step, "outcome": outcome,
                                 "reason": reason, "stall_s": stall})
        return stall

    def _load(self) -> None:
        """Resume from the newest committed checkpoint that verifies (rank 0 chooses for everyone)."""
        loaded: LoadedCheckpoint | None = None
        mismatch = None
        if self.env.is_main:
            mismatch = self._foreign_key
            if mismatch is None:
                loaded = self.ckpt.load_latest()
                mismatch = self._identity_mismatch(loaded.manifest) if loaded else None
        # One id and start time per worker group ("incarnation"), shared by its ranks: audits use it to
        # tell a step's final execution from executions rolled back by a restart.
        step, self.incarnation, mismatch = dist_utils.broadcast_object(
            (loaded.step if loaded else None, {"id": uuid.uuid4().hex[:12], "started": time.time()}, mismatch)
        )
        if mismatch:
            raise ConfigError(mismatch)
        self.metrics.record({"event": "start", "world_size": self.env.world_size, "total_steps": self.total_steps,
                             "global_batch_size": self.cfg.data.global_batch_size,
                             "restart_count": self.env.restart_count, "resume_step": step,
                             "incarnation": self.incarnation["id"]})
        if step is None:
            log.info("no checkpoint under %s: starting fresh", self.storage.uri) if self.env.is_main else None
            return
        if loaded is None:
            loaded = self.ckpt.load_step(step)
        st = loaded.state
        self._apply_state(step, st)
        ts = st["train_state"]
        self.state = TrainState(step=ts["step"], epoch=ts["epoch"], samples_in_epoch=ts["samples_in_epoch"])
        seed_change = self._keep_checkpoint_seed(ts.get("seed"))
        adaptive_rec: dict[str, Any] = {}
        if self.adaptive is None and "adaptive_batch" in st:
            # Its LR schedule and step count are in progress units, not fixed-batch steps.
            raise ConfigError(f"the checkpoint at step {step} was written with --adaptive-batch; resume it with "
                              "--adaptive-batch, or start afresh under another --job-key")
        if self.adaptive is not None:
            if "adaptive_batch" in st:
                self.adaptive.load_state_dict(st["adaptive_batch"])
            else:  # a fixed-batch checkpoint: every sample so far was at B0 (E = 1)
                self.adaptive.progress_samples = float(self.state.epoch * self.num_samples + self.state.samples_in_epoch)
            adaptive_rec = {"global_batch_size": self.adaptive.batch_size,
                            "progress_samples": self.adaptive.progress_samples,
                            "gradient_noise_scale": self.adaptive.phi}
        saved_world = st["rng"]["world_size"]
        if saved_world == self.env.world_size:
            rng.restore(st["rng"]["ranks"][self.env.rank])
        else:
            rng.seed_all(self.seed * 1_000_003 + self.state.step * 1_000 + self.env.rank)
            if self.env.is_main:
                log.warning("world size changed %d -> %d: data continues exactly-once from sample %d of epoch %d; "
                            "RNG streams re-derived (not a bit-exact resume)", saved_world, self.env.world_size,
                            self.state.samples_in_epoch, self.state.epoch)
        ours = self._lr_plan()
        plan_change = lr_plan_change(ts.get("lr_plan"), ours, self.scheduler.last_epoch) if ours else None
        if ours and ts.get("lr_plan"):
            self._plan_rate = float(ts["lr_plan"]["learning_rate"])
        if plan_change:
            # the restored optimizer holds the old plan's learning rate for the next step: this plan's
            # instead, so the change is at once (an unchanged plan is left alone: a bit-exact resume)
            for group, base_lr, f in zip(self.optimizer.param_groups, self.scheduler.base_lrs,
                                         self.scheduler.lr_lambdas, strict=True):
                group["lr"] = base_lr * f(self.scheduler.last_epoch)
            self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # get_last_lr()
            if self.env.is_main:
                log.warning("resuming step %d: %s", self.state.step, plan_change)
        if seed_change and self.env.is_main:
            log.warning("resuming step %d: %s", self.state.step, seed_change)
        if "task_state" in st:  # after model, optimizer, scheduler, scaler, RNG and data position
            try:
                self.task.load_state_dict(st["task_state"])
            except _DEVICE_ERRORS:
                raise  # the device, not the checkpoint: retried
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:  # TaskError is a ValueError
                raise ConfigError(
                    f"the checkpoint at step {self.state.step} under {self.storage.uri} does not fit this run: its "
                    f"task state cannot be loaded by {type(self.task).__name__}.load_state_dict "
                    f"({describe_error(e)}); resume it with the task that wrote it, or start afresh "
                    "under another --job-key") from e
        self.schedule.mark(self.state.step)
        self.resumed_from = self.state.step
        self._pending_first_step_event = True
        self.metrics.record({"event": "resume", "resumed_from_step": self.state.step, "epoch": self.state.epoch,
                             "world_size": self.env.world_size, "saved_world_size": saved_world,
                             "restart_count": self.env.restart_count, "load_seconds": loaded.load_seconds,
                             **adaptive_rec})
        if self.env.is_main:
            log.info("resumed from step %d (epoch %d, sample %d) in %.2f s", self.state.step, self.state.epoch,
                     self.state.samples_in_epoch, loaded.load_seconds)

    def _keep_checkpoint_seed(self, saved: Any) -> str | None:
        """Continue under the seed the resumed checkpoint was written with (``saved``, its
        ``train_state["seed"]``; None in a checkpoint that stored none); returns the warning's line
        when ``--seed`` differs, else None.

        The seed is part of the job's state, as the base learning rate is (:func:`lr_plan_change`):
        the epoch's sample order is ``epoch_permutation(N, seed, epoch)`` and the position in it is
        global, so an epoch begun under seed A and continued under seed B would train
        ``permB[pos:]`` after ``permA[:pos]`` (with N = 1000 and pos = 500, about 250 samples twice
        and 250 not at all in that epoch); the restored RNG streams and the initial weights came
        from A too. Keeping A makes the resume the uninterrupted run's continuation, exactly-once
        and bit-exact; refusing it (exit 2) would turn an Airflow task cleared after its parameters
        were edited into a permanent failure for a value the checkpoint already answers. The same
        at an epoch boundary: one rule, whatever step the last checkpoint happened to be at.
        """
        if saved is None or int(saved) == self.cfg.seed:
            return None
        self.seed = int(saved)
        return (f"--seed {self.cfg.seed} does not apply: the checkpoint's seed {self.seed} is kept (its data order "
                "and random streams follow it; start afresh under another --job-key to change it)")

    def _apply_state(self, step: int, st: dict[str, Any]) -> None:
        """Load a checkpoint's model, optimizer, LR scheduler and grad scaler states.

        Raises:
            ConfigError: one line, when a state does not fit this run (another parameter layout,
                optimizer or schedule): the checkpoint is fine, the run is not the one that wrote it;
                retrying cannot help (exit 2).
        """
        scaler_state = st.get("grad_scaler") or {}
        if self.scaler.is_enabled() and not scaler_state:
            log.warning("the checkpoint at step %d was saved without --amp fp16: the loss scale starts afresh", step)
        for part, target in (("model", self.model), ("optimizer", self.optimizer), ("lr_scheduler", self.scheduler)):
            try:
                target.load_state_dict(st[part])
            except _DEVICE_ERRORS:
                raise  # the device, not the checkpoint: retried
            except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
                # load_state_dict's first line is only "Error(s) in loading state_dict for Net:"
                first = " ".join(line.strip() for line in str(e).strip().splitlines()[:2])[:300]
                raise ConfigError(
                    f"the checkpoint at step {step} under {self.storage.uri} does not fit this run: its {part} state "
                    f"cannot be loaded ({type(e).__name__}: {first}); resume it with the task, model and optimizer "
                    "that wrote it, or start afresh under another --job-key") from e
        if self.scaler.is_enabled() and scaler_state:  # saved without fp16 (empty) or run without it: not carried over
            self.scaler.load_state_dict(scaler_state)

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this run (stored in its manifest): the task,
        the model (architecture name of the built-in task, structure signature of any task), the
        data (the task's fingerprint, else its training sample count) and the global batch size
        (adaptive mode: the base batch ``B0``), in whose batches the steps done, the end of training
        and the LR schedule are counted; the optimizer's class (its state does not carry over to
        another optimizer)."""
        return {"task": self.cfg.model.task, "model": self.cfg.model.name if self.cfg.model.builtin else None,
                "model_signature": self.model_signature, "dataset_fingerprint": self.fingerprint,
                "num_samples": self.num_samples, "global_batch_size": self.cfg.data.global_batch_size,
                "optimizer": type(self.optimizer).__name__}

    def _identity_mismatch(self, manifest: dict[str, Any]) -> str | None:
        """Why the checkpoint with ``manifest`` belongs to another job (one line), or None. Fields a
        checkpoint lacks (written before they were stored) are not compared."""
        ours = self._identity()
        labels = {"dataset_fingerprint": "dataset", "num_samples": "training set of", "task": "task",
                  "model": "model", "model_signature": "model structure", "global_batch_size": "global batch size",
                  "optimizer": "optimizer"}
        diffs = [key for key in labels if manifest.get(key) is not None and manifest[key] != ours[key]]
        if "model_signature" in diffs and ("task" in diffs or "model" in diffs):
            diffs.remove("model_signature")  # implied by another task or architecture
        if "num_samples" in diffs and "dataset_fingerprint" in diffs:
            diffs.remove("num_samples")
        if not diffs:
            return None
        said = " and ".join(f"{labels[k]} {manifest[k]!s:.40} (this run: {ours[k]!s:.40})" for k in diffs)
        same = ("global batch size (its steps, end and LR schedule count in those batches)"
                if diffs == ["global_batch_size"] else "data and model")
        return (f"the checkpoint at step {manifest['step']} under {self.storage.uri} was written for another "
                f"{said}: resume it with the same {same}, or start afresh under another --job-key")

    # -------------------------------------------------------------------------------- close
    def _close(self) -> None:
        """The final save and the model's export. Rank 0 decides and every rank follows its
        broadcast decisions (only rank 0's checkpoint manager saves, so only its state counts).

        A final save that fails (after its retries) with no model output to export would lose the
        trained state: rank 0 raises :class:`CheckpointStorageError` (its cause the storage's error),
        the other ranks return. With a model output, the model is exported and a warning says which
        checkpoint a rerun under the job key would resume from."""
        step = self.state.step
        final_failure: BaseException | None = None
        if self.cfg.checkpoint.save_final:
            need = None
            if self.env.is_main:  # a step committed here, or one that verifies, needs no final save
                need = self.ckpt.stats.last_committed_step != step and not self.ckpt.has_good(step)
            if dist_utils.broadcast_object(need):
                self._save(blocking=True, reason="final")
                if self.env.is_main and self._last_outcome == "failed":
                    final_failure = self.ckpt.last_failure or TimeoutError("the save did not finish")
        fenced = lost = None
        unreadable: CheckpointStorageError | None = None
        if self.env.is_main:
            try:
                self.ckpt.check_fence()  # a run that lost the key must not export over the new run's model
            except WriterFencedError:
                pass
            except CheckpointStorageError as e:  # the store is down (often why a final save failed)
                unreadable = e
            fenced = str(self.ckpt.fenced) if self.ckpt.fenced else None
            if final_failure is not None:
                lost = (f"the final checkpoint at step {step} was not saved under {self.storage.uri}: "
                        f"{describe_error(final_failure)}")
        # every rank learns the outcome: none waits in a collective that rank 0 left by raising
        fenced, lost, fence_unread = dist_utils.broadcast_object((fenced, lost, unreadable is not None))
        if fenced:
            raise WriterFencedError(fenced)
        if lost and not self.cfg.model_output:  # the trained state would be gone with this process
            if self.env.is_main:
                raise CheckpointStorageError(f"{lost}; with no model output to export, the trained state would "
                                             "be lost") from final_failure
            return
        if fence_unread and not lost:  # saved, but whether a newer run owns the key cannot be read
            if self.env.is_main:
                raise unreadable  # type: ignore[misc]
            return
        if self.env.is_main:
            self.ckpt.close()
            if self.cfg.model_output:
                self.export_model(self.cfg.model_output)
                if lost:
                    newest = self.ckpt.stats.last_committed_step
                    log.warning("%s; the model is exported to %s, but a rerun under job key %s resumes from %s",
                                lost, self.cfg.model_output, self.cfg.checkpoint.job_key,
                                f"step {newest}" if newest is not None else "an earlier run's checkpoint")
            self.metrics.record({"event": "finished", "step": self.state.step, "final_loss": self._last_loss,
                                 "checkpoints_committed": self.ckpt.stats.committed,
                                 "checkpoint_stall_seconds_total": self.ckpt.stats.stall_seconds_total})
        dist_utils.barrier()

    def export_model(self, out: str) -> None:
        """Write ``model.pt`` (state_dict) and ``model.json`` (how to rebuild it) into ``out``
        (a local folder or a storage URI such as ``s3://bucket/prefix/final-model``).

        ``model.json`` names the task and its ``task_args`` (``load_task(...).build_model()``
        rebuilds the module) and the model signature; for the built-in task also today's fields
        (architecture, image shape, classes, normalisation) that ``evaluate`` reads."""
        target = storage_for(out)
        with target.open_write("model.pt") as f:
            torch.save(self.model.state_dict(), f)
        meta: dict[str, Any] = {"format": "trainflow-model/1", "task": self.cfg.model.task,
                                "task_args": self.task_args, "model_signature": self.model_signature}
        if self.cfg.model.builtin:
            info = self.task.prepared.info  # type: ignore[attr-defined]
            meta.update({"model": self.cfg.model.name, "channels": info.channels, "num_classes": info.num_classes,
                         "classes": info.classes, "image_size": list(info.image_size), "mean": info.mean,
                         "std": info.std})
        meta.update({"dataset_fingerprint": self.fingerprint, "steps": self.state.step,
                     "job_key": self.cfg.checkpoint.job_key})
        with target.open_write("model.json") as f:
            f.write(json.dumps(meta, indent=1).encode())
