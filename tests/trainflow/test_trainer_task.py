"""The trainer with a task other than the built-in one, in process (one rank): the task and
task_args parameters, what a checkpoint and an exported model record, and the one-line refusals."""

from __future__ import annotations

import errno
import json
import logging
import threading

import pytest
import torch

from components.training.__main__ import transient_storage_failure
from components.training.checkpoint import layout
from components.training.checkpoint.manager import RetryPolicy
from components.training.distributed import DistEnv
from components.training.evaluation import evaluate_task, task_of
from components.training.step import TrainStepError, preflight
from components.training.trainer import Trainer, model_state_for_checkpoint
from trainflow.common.training_spec import ConfigError, TrainConfig
from trainflow.storage import CheckpointStorageError
from trainflow.storage.local import LocalStorage

REGRESSION = "tests.trainflow.example_tasks:Regression"


def _cfg(tmp_path, **flat) -> TrainConfig:
    return TrainConfig.from_flat({"checkpoint_uri": str(tmp_path / "ckpt"), "job_key": "j", "threads_per_rank": 1,
                                  "global_batch_size": 8, "epochs": 2, **flat})


@pytest.mark.parametrize(("flat", "message"), [
    ({"task": REGRESSION, "task_args": "[1]"}, "task_args must be a JSON object, got list"),
    ({"task": REGRESSION, "task_args": "{"}, "task_args is not valid JSON"),
    ({"dataset": "digits", "task_args": '{"dataset": "mnist"}'},
     "task_args: the image_classification task takes dataset from the job's dataset_source (--dataset-source), "
     "not task_args"),
    ({"task": ""}, "task must not be empty"),
    ({}, "dataset must not be empty (--dataset)"),
])
def test_bad_task_parameters_are_one_line(tmp_path, flat, message) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, **flat)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_builtin_task_args_come_from_dataset_and_model_name(tmp_path) -> None:
    cfg = _cfg(tmp_path, dataset="digits", model_name="resnet18", task_args='{"eval_split": "train"}')
    assert cfg.task_kwargs() == {"dataset": "digits", "model_name": "resnet18", "eval_split": "train"}
    user = _cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 40}')  # no dataset needed
    assert user.task_kwargs() == {"num_samples": 40}


def test_a_user_task_trains_checkpoints_and_exports(tmp_path, torch_globals) -> None:
    cfg = _cfg(tmp_path, task="tests.trainflow.example_tasks:Counting", task_args='{"num_samples": 36}',
               model_output=str(tmp_path / "model"), metrics_path=str(tmp_path / "m.jsonl"))
    trainer = Trainer(cfg, DistEnv.from_env({}))
    result = trainer.train()
    assert result.steps == 10 and result.epochs_completed == 2  # 36 samples / 8: 5 steps per epoch
    assert trainer.task.calls == 0  # Counting's counter is its own; the trainer only saves it
    loaded = trainer.ckpt.load_latest()
    assert loaded is not None and loaded.state["task_state"] == {"calls": 0}
    assert (loaded.manifest["task"], loaded.manifest["num_samples"]) == (cfg.model.task, 36)
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["task_args"] == {"num_samples": 36} and "model" not in meta
    assert task_of(tmp_path / "model") == (cfg.model.task, {"num_samples": 36})
    assert evaluate_task(tmp_path / "model") == {}  # Regression has no eval_dataset
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 10 and losses[-1] < losses[0]


def test_another_data_size_under_the_same_job_key_is_refused(tmp_path, torch_globals) -> None:
    first = Trainer(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 16}'), DistEnv.from_env({}))
    first.train()
    again = Trainer(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 24}', epochs=4), DistEnv.from_env({}))
    with pytest.raises(ConfigError, match=r"written for another training set of 16 \(this run: 24\)"):
        again.train()
    again.ckpt.close()
    # Refused without claiming the key (review 2026-11-30): a claim made a newer writer generation,
    # which fenced the job owning the key (its next save failed for good).
    assert again.ckpt.generation is None and first.ckpt._newest_generation() == first.ckpt.generation
    first.ckpt.check_fence()


def test_another_global_batch_size_under_the_same_job_key_is_refused(tmp_path, torch_globals) -> None:
    """Steps done, the end and the LR schedule count in the batches a checkpoint was trained with:
    resuming at 4x the batch ran 0 more steps and called the job done with 2/3 of its samples seen."""
    first = Trainer(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 32}', global_batch_size=4,
                         max_steps=3), DistEnv.from_env({}))
    first.train()
    again = Trainer(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 32}', global_batch_size=16),
                    DistEnv.from_env({}))
    with pytest.raises(ConfigError, match=r"written for another global batch size 4 \(this run: 16\): resume it "
                                          r"with the same global batch size"):
        again.train()
    again.ckpt.close()


def test_a_task_schedule_with_adaptive_batch_is_refused(tmp_path, torch_globals) -> None:
    with pytest.raises(ConfigError, match="brings its own learning-rate schedule") as info:
        Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:WithSchedule", adaptive_batch=True),
                DistEnv.from_env({}))
    assert "\n" not in str(info.value)
    trainer = Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:WithSchedule"), DistEnv.from_env({}))
    assert isinstance(trainer.scheduler, torch.optim.lr_scheduler.StepLR)  # without adaptive batch: the task's
    trainer.ckpt.close()


def test_a_loss_that_is_not_a_scalar_is_refused(tmp_path, torch_globals) -> None:
    trainer = Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:VectorLoss"), DistEnv.from_env({}))
    with pytest.raises(ConfigError, match=r"loss must return a scalar tensor \(the batch mean\), got Tensor of shape \(8,\)"):
        trainer.train()
    trainer.ckpt.close()


def test_preflight_builds_the_task_first(tmp_path) -> None:
    with pytest.raises(TrainStepError, match=r"cannot import module 'no_such_pkg\.tasks'"):
        preflight(_cfg(tmp_path, task="no_such_pkg.tasks:X"))
    with pytest.raises(TrainStepError, match="global_batch_size 8 exceeds the 4 training samples of task"):
        preflight(_cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 4}'))
    assert preflight(_cfg(tmp_path, task=REGRESSION)) is None


class _PersistGate(LocalStorage):
    """The trainer's real checkpoint folder, whose state-file write of ``gate_step`` waits for ``release``."""

    def __init__(self, uri: str, gate_step: int) -> None:
        super().__init__(uri)
        self.gate_prefix = layout.step_prefix(gate_step) + "/"
        self.release = threading.Event()

    def open_write(self, key, *, create_only=False):
        if key.startswith(self.gate_prefix) and layout.is_state_name(key.rsplit("/", 1)[-1]):
            assert self.release.wait(60)
        return super().open_write(key, create_only=create_only)


class _BrokenStep(LocalStorage):
    """The trainer's real checkpoint folder, whose writes under ``step``'s prefix fail with EIO (a disk
    or mount that broke at the end of training); with ``whole_store``, from then on every listing too
    (the store is down: the final fence check cannot read it either)."""

    def __init__(self, uri: str, step: int, *, whole_store: bool = False) -> None:
        super().__init__(uri)
        self.prefix = layout.step_prefix(step) + "/"
        self.whole_store, self.down = whole_store, False

    @staticmethod
    def _eio(what: str) -> CheckpointStorageError:
        error = CheckpointStorageError(f"{what} failed: [Errno 5] Input/output error")
        error.__cause__ = OSError(errno.EIO, "Input/output error")
        return error

    def open_write(self, key, *, create_only=False):
        if key.startswith(self.prefix) or self.down:
            self.down = self.whole_store
            raise self._eio(f"writing {key}")
        return super().open_write(key, create_only=create_only)

    def list(self, prefix=""):
        if self.down:
            raise self._eio(f"listing {prefix}")
        return super().list(prefix)


def _failing_final_save(tmp_path, *, whole_store: bool = False, **flat) -> Trainer:
    # 40 samples / 8: 5 steps per epoch, 10 steps; step 5 is saved (or a later one, deferred while the
    # first persists), 10 is the final save
    cfg = _cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 40}', checkpoint_interval_steps=5, **flat)
    trainer = Trainer(cfg, DistEnv.from_env({}))
    trainer.ckpt.storage = _BrokenStep(trainer.storage.uri, step=10, whole_store=whole_store)
    trainer.ckpt.retry = RetryPolicy(attempts=2, base_s=0.01, max_wait_s=0.01)
    return trainer


@pytest.mark.parametrize("whole_store", [False, True], ids=["step-folder", "store-down"])
def test_a_final_save_that_fails_with_no_model_to_export_fails_the_run(tmp_path, torch_globals, whole_store) -> None:
    """Review: a final save that failed (after its retries) ended the run with exit 0 although, with
    no model output, the trained steps after the newest checkpoint were gone with the process. Now
    it raises, as a transient storage failure (exit 1: the worker group restarts from the newest
    checkpoint) -- also when the store is down, so that the final fence check cannot list it either."""
    trainer = _failing_final_save(tmp_path, whole_store=whole_store)
    with pytest.raises(CheckpointStorageError) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith(f"the final checkpoint at step 10 was not saved under {trainer.storage.uri}: ")
    assert "[Errno 5] Input/output error" in message and "\n" not in message
    assert message.endswith("with no model output to export, the trained state would be lost")
    assert transient_storage_failure(info.value)  # EIO: retried (exit 1), not a permanent refusal
    trainer.ckpt.storage.down = False
    committed = trainer.ckpt.committed_steps()
    assert committed and 10 not in committed
    trainer.ckpt.close()


@pytest.mark.parametrize("whole_store", [False, True], ids=["step-folder", "store-down"])
def test_a_final_save_that_fails_after_the_model_is_exported_warns(tmp_path, torch_globals, caplog,
                                                                    whole_store) -> None:
    """With a model output the trained state is kept in the exported model: the run succeeds and
    says which checkpoint a rerun under the job key would resume from."""
    trainer = _failing_final_save(tmp_path, whole_store=whole_store, model_output=str(tmp_path / "model"))
    with caplog.at_level(logging.WARNING, logger="trainflow.trainer"):
        result = trainer.train()
    trainer.ckpt.storage.down = False
    committed = trainer.ckpt.committed_steps()
    assert result.steps == 10 and committed and 10 not in committed
    assert json.loads((tmp_path / "model" / "model.json").read_text())["steps"] == 10
    warnings = [r.getMessage() for r in caplog.records if "final checkpoint" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("the final checkpoint at step 10 was not saved under ")
    assert warnings[0].endswith(f"the model is exported to {tmp_path / 'model'}, but a rerun under job key j "
                                f"resumes from step {max(committed)}")


def test_a_periodic_save_due_while_one_persists_is_made_at_the_first_step_after_it(tmp_path, torch_globals) -> None:
    """A save that comes due while the previous persist still runs waits for it and is made at the
    first step after it, not dropped until the interval after (before: with a persist a bit longer
    than the interval, every other periodic save was lost). Waiting costs the steps nothing: no
    save is attempted (no RNG gather, no staging) until the persist is done."""
    cfg = _cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 40}', checkpoint_interval_steps=2,
               keep_last_k=20)  # 40 samples / 8: 5 steps per epoch, 10 steps
    trainer = Trainer(cfg, DistEnv.from_env({}))
    gate = _PersistGate(trainer.storage.uri, gate_step=2)
    trainer.ckpt.storage = gate  # step 2's persist waits until the save at step 4 was deferred
    attempts: list[tuple[int, str]] = []
    deferred: list[int] = []
    deferred_events: list[int] = []
    record, ready = trainer.metrics.record, trainer.ckpt.ready_for_periodic

    def watch(rec) -> None:
        record(rec)
        if rec.get("event") == "checkpoint":
            attempts.append((rec["step"], rec["outcome"]))
        if rec.get("event") == "checkpoint_deferred":
            deferred_events.append(rec["step"])

    def ready_for_periodic(step: int) -> bool:
        answer = ready(step)
        if not answer:
            deferred.append(step)
            gate.release.set()
            assert trainer.ckpt.wait(timeout_s=30)  # step 2 committed before step 5 comes
        return answer

    trainer.metrics.record = watch
    trainer.ckpt.ready_for_periodic = ready_for_periodic
    result = trainer.train()
    assert result.steps == 10 and deferred[0] == 4
    assert attempts[:2] == [(2, "staged"), (5, "staged")]  # no attempt at 4: deferred to 5
    assert attempts[-1] == (10, "committed")  # the final save
    assert "skipped" not in {outcome for _, outcome in attempts}
    saved_at = [step for step, _ in attempts]
    # every deferred save was made at the next step (the last step's by the final, blocking save)
    assert all(d not in saved_at and d + 1 in saved_at for d in deferred if d < result.steps), (deferred, attempts)
    assert trainer.ckpt.stats.skipped_in_flight == len(deferred)  # once per persist waited for
    assert deferred_events == deferred  # recorded (checkpoint_deferred), as the metrics endpoint counts them
    committed = trainer.ckpt.committed_steps()
    assert 5 in committed and 2 in committed and 4 not in committed


def test_a_checkpoints_batchnorm_statistics_are_those_of_its_step() -> None:
    """On CUDA the staging copies may run while the next forward updates BatchNorm's buffers in place:
    the checkpoint takes copies of the buffers when it saves, and shares the parameters (only
    optimizer.step() changes those, and it waits for the staging)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).train()
    model(torch.randn(8, 4))
    state = model_state_for_checkpoint(model, copy_buffers=True)
    saved = {k: v.clone() for k, v in state.items()}
    model(torch.randn(8, 4) * 5 + 3)  # the next step's forward
    buffers = {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    assert all(torch.equal(state[k], saved[k]) for k in buffers)  # the checkpoint's: still step N's
    assert not torch.equal(model.state_dict()["1.running_mean"], saved["1.running_mean"])  # the model moved on
    params = dict(model.named_parameters())
    assert all(state[k] is not params[k] and state[k].data_ptr() == params[k].data_ptr() for k in params)
    # on CPU (copy_buffers=False: staging copies synchronously) nothing is copied
    plain = model_state_for_checkpoint(model, copy_buffers=False)
    assert plain["1.running_mean"].data_ptr() == model[1].running_mean.data_ptr()


def test_each_step_records_the_learning_rate_it_used(tmp_path, torch_globals) -> None:
    """Fixed-batch mode read the scheduler after its step: the record held the next step's LR (the
    last step showed 0.0 under a cosine schedule although it trained at a positive one)."""
    cfg = _cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 32}', lr_schedule="cosine", warmup_steps=0)
    trainer = Trainer(cfg, DistEnv.from_env({}))
    used: list[float] = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        used.append(trainer.optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    records: list[dict] = []
    record = trainer.metrics.record
    trainer.metrics.record = lambda rec: (records.append(rec), record(rec))
    trainer.train()
    logged = [rec["lr"] for rec in records if "lr" in rec and "step" in rec]
    assert logged == used and len(used) >= 4 and used[-1] > 0


def test_a_task_that_scales_the_learning_rate_is_not_told_its_flag_did_not_apply(tmp_path, torch_globals,
                                                                                caplog) -> None:
    """Review (2026-11-29): the checkpoint's LR plan stored the schedule's base rate (a tenth of the
    flag here), so every resume with the same --learning-rate warned that it did not apply."""
    import logging

    flat = {"task": "tests.trainflow.example_tasks:TenthRate", "task_args": '{"num_samples": 32}',
            "learning_rate": 0.5, "lr_schedule": "constant", "warmup_steps": 0}
    Trainer(_cfg(tmp_path, **flat, max_steps=2), DistEnv.from_env({})).train()
    caplog.set_level(logging.WARNING)
    resumed = Trainer(_cfg(tmp_path, **flat, max_steps=4), DistEnv.from_env({}))
    resumed.train()
    assert resumed.resumed_from == 2
    assert not [r for r in caplog.records if "does not apply" in r.getMessage()]  # (total steps 2 -> 4 is said)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_a_sigterm_save_that_finds_a_newer_writer_stops_the_run_for_good(tmp_path, torch_globals) -> None:
    """Review (2026-11-29): an orphaned run preempted before it noticed a newer writer of its job key
    found it only in its SIGTERM save ("fenced") and exited as preempted (143, restarted under the
    ExitCode policy): the restarted orphan then claimed the key back and fenced the rightful run.
    It now stops with WriterFencedError (exit 2)."""
    from components.training.checkpoint.manager import CheckpointManager, WriterFencedError
    from trainflow.storage import storage_for

    cfg = _cfg(tmp_path, task=REGRESSION, task_args='{"num_samples": 40}', checkpoint_interval_steps=100)
    trainer = Trainer(cfg, DistEnv.from_env({}))
    trainer.ckpt.claim()  # this run's generation (a first save would claim it too)
    record = trainer.metrics.record

    def at_step_3(rec) -> None:
        record(rec)
        if rec.get("step") == 3 and "loss" in rec:  # between two steps: a newer run claims the key
            CheckpointManager(storage_for(trainer.storage.uri)).claim()
            trainer._on_sigterm(15, None)

    trainer.metrics.record = at_step_3
    with pytest.raises(WriterFencedError, match="took over this job key"):
        trainer.train()
    assert trainer.ckpt.committed_steps() == []  # the orphan wrote no manifest
    trainer.ckpt.close()


def test_a_task_state_its_task_cannot_load_is_one_line_and_permanent(tmp_path, torch_globals) -> None:
    """Review (2026-11-29): a task whose ``load_state_dict`` refused the checkpoint's task state (the
    default one raises TaskError when ``state_dict`` alone is overridden) ended in a traceback with
    exit 1, retried by torchrun every time."""
    first = Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:Counting", task_args='{"num_samples": 16}',
                         max_steps=2), DistEnv.from_env({}))
    first.train()
    again = Trainer(_cfg(tmp_path, task="tests.trainflow.example_tasks:Counting", task_args='{"num_samples": 16}'),
                    DistEnv.from_env({}))
    again.task.load_state_dict = lambda state: (_ for _ in ()).throw(KeyError("calls"))  # a task's own bug
    with pytest.raises(ConfigError) as info:
        again.train()
    message = str(info.value)
    assert message.startswith("the checkpoint at step 2 under ") and "\n" not in message
    assert "its task state cannot be loaded by Counting.load_state_dict (KeyError: 'calls')" in message
    again.ckpt.close()
