"""The task API: what a user's own model plugs into so trainflow's harness can train it.

A *task* is a small object naming a model, its data, its loss and its metrics. The harness (the
elastic-DDP trainer) keeps everything else: processes and DDP, choosing each step's sample indices,
the optimizer step, mixed precision, checkpoints and resume, SIGTERM saves, metrics. Write a
subclass of :class:`Task`, name it by import path (``"my_pkg.tasks:Regression"``) with JSON
``task_args`` (its constructor's keyword arguments), and :func:`load_task` builds it.

**Status (issue 11, step 7b):** the trainer (``components.training.trainer``) trains a task:
``--task``/``--task-args`` of ``python -m components.training`` and ``trainflow run``, the ``task``
and ``task_args`` pipeline parameters; the default is the built-in ``image_classification``
(:mod:`trainflow.tasks.image_classification`).

Where the line is drawn, and why
--------------------------------
* PyTorch Lightning's ``LightningModule`` *is* the model and also owns its data loaders (the trainer
  slips a ``DistributedSampler`` in); HF Accelerate leaves the whole loop to the user; Composer's
  ``ComposerModel`` splits ``forward`` and ``loss``; torchtitan's train spec is a table of builder
  functions (model, loss, optimizer, LR schedulers, data loader, validator).
* trainflow takes torchtitan's "builders beside the model" shape, because the model stays a plain
  ``nn.Module`` (export, DDP wrapping and the identity check need nothing else), with two cuts:

  - The task returns **map-style datasets**, never data loaders or samplers. Which samples a step
    reads is the harness's decision: step ``s`` takes the next global batch of an epoch's seeded
    permutation by *global sample index* and each rank a contiguous slice of it. That is what makes
    data exactly-once across a resize (2 → 1 → 2 ranks) and resume bit-exact; a task-owned
    loader or a stateful iterator would put the data position where a checkpoint cannot re-shard it.
  - ``loss(model, batch)`` does the forward pass and returns one scalar (Composer's two methods in
    one: the harness needs nothing from the outputs). No ``training_step`` with optimizer calls:
    the harness owns backward, gradient scaling, clipping and the step, so a SIGTERM save or a
    checkpoint always falls between two whole steps.

  Everything else is optional with a default (optimizer, LR schedule, collate, evaluation, extra
  state, data fingerprint), so the smallest task is three methods. A base class rather than a
  ``typing.Protocol`` because the optional methods need defaults and :func:`load_task` must tell a
  task from any other callable.

Call order (every rank unless it says rank 0)
---------------------------------------------
1. ``load_task(spec, task_args)`` → ``Task(**task_args)``. Also called once before any worker
   starts, to validate the job: keep the constructor cheap (open files lazily).
2. ``train_dataset()``, once. ``len()`` of it is the epoch's sample count.
3. The harness seeds torch, NumPy and ``random`` with the job's seed, then ``build_model()``: every
   rank gets identical initial weights. The model moves to the device and is wrapped in DDP.
4. ``configure_optimizer(model, learning_rate=...)`` (``None``: the harness's SGD/AdamW) and
   ``configure_lr_scheduler(optimizer, total_steps=...)`` (``None``: the harness's warm-up + cosine
   or constant schedule, stepped once per optimizer step).
5. On resume: model, optimizer, scheduler, scaler, RNG and data position are restored, then
   ``load_state_dict(state)`` with what ``state_dict()`` returned at that checkpoint.
6. Each step: the harness picks this rank's sample indices, builds
   ``batch = collate([dataset[i] for i in ids])`` (or ``collate(dataset.__getitems__(ids))`` when the
   dataset has PyTorch's batched ``__getitems__``), moves its tensors to the device
   (:func:`move_to_device`), puts the model in train mode and calls ``loss(ddp_model, batch)``
   (inside ``torch.autocast`` when mixed precision is on); then backward, clip, optimizer and
   scheduler step.
7. At each checkpoint (between steps): rank 0 saves ``state_dict()`` with the rest.
8. Evaluation (rank 0 or the single-process evaluate step): ``eval_dataset()``, then
   ``evaluate(model, loader)`` with the unwrapped model in eval mode under ``torch.no_grad()``.

Rules a task keeps so the guarantees hold
-----------------------------------------
* ``build_model`` draws its random initial weights from torch's global generator (ordinary
  ``nn.Module`` initialisation does) and nothing else random: same seed, same weights on every rank.
* ``dataset[i]`` is a pure function of ``i``: the same sample on every rank, in every run and in
  any order, in the training process or a DataLoader worker. Derive augmentation from the index
  (``torch.Generator().manual_seed(base + i)``), never from global random state. The length never
  changes during a job.
* ``loss`` may use torch's random generators (dropout): the harness saves and restores every
  rank's generator states, so a resume at the same world size replays the same masks.
* ``state_dict()`` holds plain values (tensors, numbers, strings, bools, ``None``, lists and dicts of
  them; the checkpoint is read with ``torch.load(weights_only=True)``) and is the same on every rank.

Errors: :func:`load_task` raises :class:`TaskError`, a one-line message naming the spec.
"""

from __future__ import annotations

import abc
import hashlib
import importlib
import inspect
import json
import math
import re
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

__all__ = ["BUILTIN_TASKS", "Task", "TaskError", "load_task", "model_signature", "move_to_device"]


class TaskError(ValueError):
    """A task spec or its ``task_args`` cannot make a task (one line, naming the spec)."""


class Task(abc.ABC):
    """Base class of a training task. Subclass it; implement the three abstract methods.

    The constructor's keyword arguments are the task's ``task_args``: JSON values (str, int,
    float, bool, None, lists, objects), so a pipeline parameter or a CLI flag can carry them.
    Methods are called in the order of the module docstring.
    """

    # ------------------------------------------------------------------------------ required
    @abc.abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (CPU, float32 parameters; the harness moves it to the device).

        Called once per rank after the harness seeded torch's global generator with the job's seed:
        draw the initial weights from it and from nothing else, so every rank builds the same
        model. Also called to rebuild an exported model from ``task_args`` alone.
        """

    @abc.abstractmethod
    def train_dataset(self) -> Dataset:
        """The training samples: a map-style dataset (``__len__`` and ``__getitem__(int)``).

        ``dataset[i]`` for ``0 <= i < len(dataset)`` must be a pure function of ``i`` (module
        docstring). Samples are what :meth:`collate` accepts; the harness chooses the indices.
        Optionally ``__getitems__(list[int]) -> list[sample]`` reads many at once (PyTorch's
        batched-read hook; the built-in task uses it).
        """

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of one batch: a scalar float32 tensor, the **mean over the batch's
        samples**, differentiable in the model's parameters.

        Args:
            model: during training the DDP wrapper of :meth:`build_model`'s module, in train mode.
                Call it (``model(x)``), not its submodules, so DDP synchronises the gradients.
            batch: ``collate(samples)`` of this rank's share of the global batch (at least one
                sample; ranks may hold different counts), every tensor already on the model's device.

        The harness weights each rank's mean by its sample count, so the gradient equals that of
        the mean over the whole global batch however it is split. Under mixed precision this is
        called inside ``torch.autocast``: compute the loss itself in float32 (``logits.float()``).
        """

    # ------------------------------------------------------------------------------ optional
    def eval_dataset(self) -> Dataset | None:
        """The held-out samples (same sample format as :meth:`train_dataset`), or ``None``
        (default): no evaluation."""
        return None

    def evaluate(self, model: nn.Module, loader: Iterable[Any]) -> dict[str, float]:
        """Metrics of ``model`` over every batch of ``loader``: ``{metric name: value}``, e.g.
        ``{"accuracy": 0.97, "loss": 0.11}`` or ``{"perplexity": 31.2}``.

        ``model`` is the unwrapped module in eval mode; the harness calls this under
        ``torch.no_grad()``. ``loader`` yields ``collate``\\ d batches of :meth:`eval_dataset`, in
        order, each sample once, tensors on the model's device.

        Default: ``{"loss": ...}``, the sample-weighted mean of :meth:`loss` (the sample count of a
        batch is the first dimension of its first tensor).
        """
        total = 0.0
        samples = 0
        for batch in loader:
            n = _batch_size(batch)
            total += float(self.loss(model, batch)) * n
            samples += n
        return {"loss": total / samples if samples else math.nan}

    def collate(self, samples: list[Any]) -> Any:
        """One batch from a list of samples (default: ``torch.utils.data.default_collate``, which
        stacks tensors and numbers and keeps tuples/dicts of them)."""
        return default_collate(samples)

    def configure_optimizer(self, model: nn.Module, *, learning_rate: float) -> torch.optim.Optimizer | None:
        """The optimizer of ``model``'s parameters, or ``None`` (default): the harness builds its own
        (``optimizer``, ``momentum``, ``weight_decay`` of the job).

        Args:
            model: the unwrapped module, already on the device.
            learning_rate: the job's base learning rate (per optimizer step of one global batch).
        """
        return None

    def configure_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, *, total_steps: int
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """The learning-rate schedule, stepped once after each optimizer step, or ``None``
        (default): the harness's (``warmup_steps``, ``lr_schedule`` of the job).

        ``total_steps`` is the number of optimizer steps of the whole job. With adaptive batch
        the harness sets the learning rate itself each step: a task schedule is then refused.
        """
        return None

    def data_fingerprint(self) -> str | None:
        """A short string that changes when the training data changes (e.g. a content hash), or
        ``None`` (default). The harness stores it in each checkpoint and refuses to resume one
        written for other data; without it only ``len(train_dataset())`` is compared."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """The task's own state to checkpoint (default: none). Plain values only (module docstring);
        rank 0's is saved, at a step boundary."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned, on every rank, after the model and optimizer.

        Raises:
            TaskError: (default) ``state`` is not empty: override both methods or neither.
        """
        if state:
            raise TaskError(f"{type(self).__name__} got task state {sorted(state)} but does not override "
                            "load_state_dict")


# ----------------------------------------------------------------------------------- load_task
BUILTIN_TASKS: Mapping[str, str] = {
    "image_classification": "trainflow.tasks.image_classification:ImageClassification",
    "language_model": "trainflow.tasks.language_model:LanguageModel",
    "tabular_regression": "trainflow.tasks.tabular:TabularRegression",
}
"""Short names of the built-in tasks → their import paths (they use this API like any user task)."""

_IMPORT_PATH = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")


def load_task(spec: str, task_args: Mapping[str, Any] | str | None = None) -> Task:
    """Build the task ``spec`` names with ``task_args`` as keyword arguments.

    Args:
        spec: a built-in name (:data:`BUILTIN_TASKS`, e.g. ``"image_classification"``) or an import
            path ``"package.module:Name"``, where ``Name`` (``Outer.Inner`` allowed) is a
            :class:`Task` subclass or a function declared to return one (``-> Task``, or a subclass;
            anything else is refused before it is called). The module must be importable
            (installed, or on ``PYTHONPATH``); importing it runs its top-level code, as any import does.
        task_args: the keyword arguments, as a dict or its JSON text; ``None`` or ``""`` = none.
            Dict values must be JSON values; they are passed as JSON would carry them (a tuple
            arrives as a list), so both forms build the same task.

    Raises:
        TaskError: a malformed spec, a module that does not import, a missing attribute, an object
            that is not a task (a function without ``-> Task``), ``task_args`` that are not a JSON object or do not fit the
            signature, or a constructor that raised (the cause is chained). One line, naming the spec.
    """
    where = f"task {spec!r}"
    if not isinstance(spec, str):
        raise TaskError(f"{where}: a task is named by a string, got {type(spec).__name__}")
    kwargs = _parse_task_args(task_args, where)
    path = BUILTIN_TASKS.get(spec, spec)
    m = _IMPORT_PATH.match(path)
    if m is None:
        raise TaskError(f"{where}: not a built-in task ({', '.join(BUILTIN_TASKS)}) nor an import path "
                        "'package.module:Name'")
    module_name, attr = m["module"], m["attr"]
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise TaskError(f"{where}: cannot import module {module_name!r}: {_one_line(e)} (the package must be "
                        "installed where the task runs: in a cluster, in the workers' image; docs/task-api.md)") from e
    except Exception as e:  # the module's own code failed: say so in one line, keep the cause
        raise TaskError(f"{where}: importing module {module_name!r} failed: {type(e).__name__}: {_one_line(e)}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TaskError(f"{where}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        if not issubclass(obj, Task):
            raise TaskError(f"{where}: {attr} is a class but not a subclass of trainflow.task.Task")
        if inspect.isabstract(obj):
            missing = ", ".join(sorted(obj.__abstractmethods__))
            raise TaskError(f"{where}: {attr} does not implement {missing}")
    elif not callable(obj):
        raise TaskError(f"{where}: {attr} is an object of type {type(obj).__name__}, not a Task subclass or a "
                        "function returning a Task")
    else:
        _check_declares_task(obj, attr, where)
    try:
        inspect.signature(obj).bind(**kwargs)
    except TypeError as e:
        raise TaskError(f"{where}: task_args do not fit {attr}: {_one_line(e)}") from e
    except ValueError:  # no signature to check (some builtins): let the call decide
        pass
    try:
        task = obj(**kwargs)
    except Exception as e:
        raise TaskError(f"{where}: {attr}(**task_args) failed: {type(e).__name__}: {_one_line(e)}") from e
    if not isinstance(task, Task):
        raise TaskError(f"{where}: {attr}(**task_args) returned an object of type {type(task).__name__}, not a Task")
    return task


def _check_declares_task(func: Any, attr: str, where: str) -> None:
    """Refuse a callable that is not declared to return a :class:`Task` (its return annotation, a
    ``Task`` subclass), before it is called: a task's name may come from a pipeline parameter or an
    Airflow trigger form, and ``builtins:exec`` or ``subprocess:run`` with ``task_args`` must not run.

    Raises:
        TaskError: no return annotation, one that does not resolve, or one that is not a Task subclass.
    """
    try:
        declared = typing.get_type_hints(func).get("return")
    except Exception as e:  # a forward reference that does not resolve, a builtin, ...
        raise TaskError(f"{where}: the return annotation of {attr} does not resolve ({type(e).__name__}: "
                        f"{_one_line(e)}); a function that builds a task is declared '-> Task'") from e
    if declared is None:
        raise TaskError(f"{where}: {attr} is not a Task subclass and has no return annotation: a function that "
                        "builds a task is declared '-> Task' (nothing else is called)")
    if not (isinstance(declared, type) and issubclass(declared, Task)):
        shown = declared.__name__ if isinstance(declared, type) else str(declared)
        raise TaskError(f"{where}: {attr} is declared to return {shown}, not a Task (a function that builds a "
                        "task is declared '-> Task'; nothing else is called)")


def _parse_task_args(task_args: Mapping[str, Any] | str | None, where: str) -> dict[str, Any]:
    if task_args is None:
        return {}
    if isinstance(task_args, str):
        if not task_args.strip():
            return {}
        try:
            value = json.loads(task_args)
        except json.JSONDecodeError as e:
            raise TaskError(f"{where}: task_args is not valid JSON: {_one_line(e)}") from e
        if not isinstance(value, dict):
            raise TaskError(f"{where}: task_args must be a JSON object, got {_json_kind(value)}")
        return value
    if not isinstance(task_args, Mapping):
        raise TaskError(f"{where}: task_args must be a JSON object (a dict or its text), got "
                        f"{type(task_args).__name__}")
    bad_keys = [k for k in task_args if not isinstance(k, str)]
    if bad_keys:
        raise TaskError(f"{where}: task_args keys must be strings, got {bad_keys[0]!r}")
    try:
        return json.loads(json.dumps(dict(task_args), allow_nan=False))
    except (TypeError, ValueError) as e:
        raise TaskError(f"{where}: task_args must hold JSON values only: {_one_line(e)}") from e


def _json_kind(value: Any) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


# ------------------------------------------------------------------------------------- helpers
def model_signature(model: nn.Module) -> str:
    """16 hex digits identifying a model's *structure*: a SHA-256 of every ``state_dict`` entry's
    name, shape and dtype (parameters and persistent buffers; values are ignored).

    The same for two builds of the same task and ``task_args`` (whatever the seed), different when
    a layer is added, removed, renamed or resized. A checkpoint stores it, so a resume with another
    model fails with one line instead of a ``load_state_dict`` traceback. A DDP wrapper is looked
    through (its ``module.`` prefix would change the names).
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        if isinstance(value, torch.Tensor):
            digest.update(f"{name}\t{tuple(value.shape)}\t{value.dtype}\n".encode())
        else:  # a module's extra state (get_extra_state): its type only
            digest.update(f"{name}\t{type(value).__name__}\n".encode())
    return digest.hexdigest()[:16]


def move_to_device(batch: Any, device: torch.device | str, *, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor moved to ``device``, looking inside tuples, lists and dicts
    (named tuples keep their type); other values are returned as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        moved = {k: move_to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()}
        try:
            return type(batch)(moved)
        except TypeError:  # a mapping type that cannot be built from a dict (defaultdict): a plain dict
            return moved
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking=non_blocking) for v in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(move_to_device(v, device, non_blocking=non_blocking) for v in batch)
    return batch


def _batch_size(batch: Any) -> int:
    """The first dimension of the first tensor in ``batch`` (tuples, lists, dicts searched in order)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, tuple | list) else ()
    for item in items:
        n = _batch_size_or_none(item)
        if n is not None:
            return n
    raise TaskError("the default evaluate needs a tensor in each batch to count its samples; override evaluate")


def _batch_size_or_none(batch: Any) -> int | None:
    try:
        return _batch_size(batch)
    except TaskError:
        return None
