"""The one table of a training job's parameters, and the configs built from it.

Every parameter of a training job is one dataclass field below, whose metadata (:func:`param`)
gives its flat, unique **name** (the flag is ``--`` + name with ``-``), help, unit, bounds,
choices and the **surfaces** that expose it. :data:`SPEC` is the table built from those fields,
in order; everything else derives from it:

=====  =====================================================================================
R      the training runtime: ``python -m components.training`` flags and its flat JSON config
       (``--config``/``--config-json``, ``train-config.json``), :class:`TrainConfig`
S      the KFP ``train`` component (``components/specs/train.py``) and :class:`TrainJobSpec`
P      the ``training_pipeline`` signature (``pipelines/training.py``)
C      ``trainflow run``'s options and ``trainflow.local_run.RunOptions``
=====  =====================================================================================

The Airflow example DAG's Trigger form is the P rows without an ``ops_variable`` (their section,
description and bounds from here; types and defaults from the compiled pipeline), and its
ops/security settings are the P rows with one (:func:`form_fields`, :func:`ops_settings`).

KFP needs literal signatures, so the ``train`` component and the pipelines keep theirs, and
``tests/pipelines/test_training_spec_signatures.py`` asserts that each equals this table (names,
types, defaults). A new knob costs one field here plus a line in each signature and the call;
that test names any place forgotten. ``docs/training-parameters.md`` is generated from the table
(:func:`markdown_table`; a test keeps it current).

Conventions: one sentinel for optional counts and durations, ``0`` = off (or "the default", as
the row's help says) — KFP has no ``None``; negative values are a one-line error. Validation is
per row (type, bounds, choices: :meth:`Row.check`, one line such as ``learning_rate must be > 0,
got -1.0``); cross-field rules stay in each section's ``__post_init__``. Invalid values raise
:class:`ConfigError` before any worker starts.

Shape taken from torchtitan's ``torchtitan/config/job_config.py`` (kw-only config dataclasses per
concern, units in names). Standard library only (pyproject's import-linter contract): the Airflow
bridge, the pipelines and the pod runtime all import this module.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_type_hints

from trainflow.common.coerce import CoerceError, coerce


class ConfigError(ValueError):
    """An invalid training configuration; the message is one line naming the parameter."""


#: The surfaces a row can be on (see the module docstring).
SURFACES = frozenset("RSPC")
#: Sections of the Airflow Trigger form, in display order.
FORM_SECTIONS = ("Training", "Checkpointing", "Advanced")
MODELS = ("small_cnn", "resnet18", "wide_resnet101_2")
BUILTIN_TASK = "image_classification"
"""The default task (``trainflow.task.BUILTIN_TASKS``): today's image classifiers."""
BACKENDS = ("local", "pytorchjob")
#: A registered model's name (``registered_model_name``): a folder of the model registry
#: (``components.registry.store``), so lowercase letters, digits, ``.``, ``_``, ``-``, at most 100.
MODEL_NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,99}$"


@dataclass(frozen=True, slots=True)
class Row:
    """One training parameter: what every surface needs to declare, check and document it."""

    name: str
    type: type
    """``bool``, ``int``, ``float`` or ``str``."""
    default: Any
    help: str
    unit: str = ""
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    exclusive_maximum: float | None = None
    choices: tuple[str, ...] = ()
    non_empty: bool = False
    pattern: str = ""
    """A regular expression a ``str`` value must match (checked before a run starts, not after
    training; the Airflow form's JSON Schema ``pattern``)."""
    surfaces: frozenset[str] = frozenset()
    section: str = ""
    """The Airflow form's section of a P row (empty: an ops setting or not in the form)."""
    ops_variable: str | None = None
    """P rows that are ops/security settings: the Airflow Variable that sets them (``None`` with
    ``ops`` set: derived by the operator, e.g. ``job_key``)."""
    ops: bool = False
    zero: str = ""
    """What 0 means for this row when it is not simply "off" (``8 x global_batch_size``)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def on(self, surface: str) -> bool:
        return surface in self.surfaces

    def check(self, value: Any) -> Any:
        """``value`` converted to the row's type and checked against its bounds and choices.

        Raises:
            ConfigError: one line naming the parameter, e.g. ``epochs must be >= 1, got 0``.
        """
        try:
            value = coerce(value, self.type, self.name)
        except CoerceError as e:
            raise ConfigError(str(e)) from None
        if self.type is float and not math.isfinite(value):
            raise ConfigError(f"{self.name} must be a finite number, got {value}")
        checks = ((self.minimum, ">=", value >= self.minimum if self.minimum is not None else True),
                  (self.maximum, "<=", value <= self.maximum if self.maximum is not None else True),
                  (self.exclusive_minimum, ">", value > self.exclusive_minimum
                   if self.exclusive_minimum is not None else True),
                  (self.exclusive_maximum, "<", value < self.exclusive_maximum
                   if self.exclusive_maximum is not None else True))
        for bound, op, ok in checks:
            if not ok:
                raise ConfigError(f"{self.name} must be {op} {_num(bound)}, got {value}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
        if self.non_empty and not value:
            raise ConfigError(f"{self.name} must not be empty ({self.flag})")
        if self.pattern and not re.match(self.pattern, value):
            raise ConfigError(f"{self.name} must match {self.pattern}, got {value!r}")
        return value

    def describe(self) -> str:
        """Help text with the unit and what 0 means: the form's and the CLI's description."""
        text = self.help
        extras = [self.unit] if self.unit else []
        if self.zero:
            extras.append(f"0 = {self.zero}")
        return f"{text} [{'; '.join(extras)}]" if extras else text

    def json_schema(self) -> dict[str, Any]:
        """Bounds and choices as JSON Schema keywords (Airflow ``Param``)."""
        out: dict[str, Any] = {}
        for key, value in (("minimum", self.minimum), ("maximum", self.maximum),
                           ("exclusiveMinimum", self.exclusive_minimum),
                           ("exclusiveMaximum", self.exclusive_maximum)):
            if value is not None:
                out[key] = value
        if self.choices:
            out["enum"] = list(self.choices)
        if self.non_empty:
            out["minLength"] = 1
        if self.pattern:
            out["pattern"] = self.pattern
        return out


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def param(name: str, surfaces: str, help: str, default: Any = dataclasses.MISSING, *, unit: str = "",
          section: str = "", ops_variable: str | None = None, ops: bool = False, zero: str = "",
          minimum: float | None = None, maximum: float | None = None,
          exclusive_minimum: float | None = None, exclusive_maximum: float | None = None,
          choices: Iterable[str] = (), non_empty: bool = False, pattern: str = "") -> Any:
    """A dataclass field that is a row of the table (its metadata carries the row, less its type)."""
    if not set(surfaces) <= SURFACES:
        raise ValueError(f"{name}: unknown surfaces {surfaces!r}")
    meta = {"row": dict(name=name, default=default, help=help, unit=unit, minimum=minimum, maximum=maximum,
                        exclusive_minimum=exclusive_minimum, exclusive_maximum=exclusive_maximum,
                        choices=tuple(choices), non_empty=non_empty, pattern=pattern, surfaces=frozenset(surfaces),
                        section=section, ops_variable=ops_variable, ops=ops or ops_variable is not None,
                        zero=zero)}
    return field(default=default, metadata=meta)



class _Section:
    """Each section validates its rows on creation (type, bounds, choices) — so a config built
    directly is checked exactly like one built from flags — then its cross-field rules."""

    __slots__ = ()

    def _check_rows(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if "row" in f.metadata:
                row = _ROW_BY_FIELD[(type(self), f.name)]
                object.__setattr__(self, f.name, row.check(getattr(self, f.name)))

    def __post_init__(self) -> None:
        self._check_rows()


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


# ----------------------------------------------------------------------------------------- the table
# Field order is table order (docs/training-parameters.md, the Airflow form within a section).
# The runtime's dataclass field names are kept where they are clear within their section
# (``CheckpointConfig.uri``); the row name is the flat one every surface uses (``checkpoint_uri``).

TRAINING, CHECKPOINTING, ADVANCED = FORM_SECTIONS


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineConfig(_Section):
    """Pipeline-only parameters: what ``prepare_dataset`` reads and where ``register_model`` writes."""

    dataset_source: str = param(
        "dataset_source", "PC", "mnist (5,000 real digits), digits (scikit-learn 8x8), synthetic-imagenet[:N], "
        "synthetic-cifar[:N], a folder in ImageFolder layout, or s3://bucket/prefix", "mnist",
        section=TRAINING, non_empty=True)
    test_fraction: float = param(
        "test_fraction", "PC", "share of the data held out for evaluation, stratified by class", 0.2,
        unit="fraction", section=TRAINING, exclusive_minimum=0, exclusive_maximum=1)
    registry_uri: str = param(
        "registry_uri", "PC", "model registry root: a folder or s3://bucket/prefix", "",
        unit="URI", ops_variable="trainflow_registry_uri")
    registered_model_name: str = param(
        "registered_model_name", "PC", "name the model is registered under in the registry", "mnist-classifier",
        ops_variable="trainflow_registered_model_name", non_empty=True, pattern=MODEL_NAME_PATTERN)
    promotion_threshold: float = param(
        "promotion_threshold", "PC", "make the new version CURRENT only at or above this test accuracy "
        "(0 = always)", 0.0, unit="accuracy", minimum=0, maximum=1,
        ops_variable="trainflow_promotion_threshold")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig(_Section):
    """What is trained: a task (``trainflow.task``; docs/task-api.md) and, for the built-in
    ``image_classification`` task, its architecture."""

    name: str = param("model_name", "RSPC", "architecture to train (the built-in image_classification task)",
                      "small_cnn", choices=MODELS, section=TRAINING)
    task: str = param(
        "task", "RSPC", "what to train: a built-in task (image_classification, language_model, "
        "tabular_regression) or a Task subclass by import path, package.module:Name (docs/task-api.md)",
        BUILTIN_TASK, non_empty=True, section=TRAINING)
    task_args: str = param(
        "task_args", "RSPC", "the task's constructor arguments as a JSON object (empty = none); the built-in "
        "image_classification task takes dataset and model_name from those parameters, so only its other "
        "arguments (eval_split) go here", "", unit="JSON object", section=ADVANCED)

    def __post_init__(self) -> None:
        self._check_rows()
        self.task_kwargs(dataset="(checked)")

    @property
    def builtin(self) -> bool:
        """The built-in image-classification task (``dataset`` and ``model_name`` are its arguments)."""
        return self.task == BUILTIN_TASK

    def task_kwargs(self, *, dataset: str) -> dict[str, Any]:
        """The task's keyword arguments: ``task_args`` parsed; for the built-in task plus
        ``dataset`` (the job's prepared dataset) and ``model_name``.

        Raises:
            ConfigError: ``task_args`` is not a JSON object, or names an argument the built-in task
                takes from a parameter (one line).
        """
        try:
            args = json.loads(self.task_args) if self.task_args.strip() else {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"task_args is not valid JSON: {e}") from None
        if not isinstance(args, dict):
            raise ConfigError(f"task_args must be a JSON object, got {type(args).__name__}")
        if self.builtin:
            clash = sorted(set(args) & {"dataset", "model_name"})
            if clash:
                own = {"dataset": "dataset_source (--dataset-source)", "model_name": "model_name (--model-name)"}
                raise ConfigError(f"task_args: the {BUILTIN_TASK} task takes {' and '.join(clash)} from the job's "
                                  f"{' and '.join(own[c] for c in clash)}, not task_args")
            return {"dataset": dataset, "model_name": self.name, **args}
        return args


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig(_Section):
    path: str = param(
        "dataset", "R", "prepared dataset (output of prepare_dataset): a folder, s3://BUCKET/PREFIX, or a built-in "
        "source (mnist, digits, synthetic-cifar[:N]) prepared on the spot", "", unit="folder or URI")
    global_batch_size: int = param(
        "global_batch_size", "RSPC", "samples per optimizer step over all ranks; fixed when the world size changes",
        64, unit="samples", minimum=1, section=TRAINING)
    dataloader_num_workers: int = param(
        "dataloader_num_workers", "RSPC", "DataLoader worker processes per rank (image folders)", 0,
        unit="processes per rank", minimum=0, section=ADVANCED)
    adaptive_batch: bool = param(
        "adaptive_batch", "RSPC", "opt-in: re-pick the global batch of largest goodput at every (re)start and "
        "epoch end, starting from global_batch_size (docs/training.md, Adaptive batch)", False, section=ADVANCED)
    max_global_batch_size: int = param(
        "max_global_batch_size", "RSPC", "adaptive batch: largest global batch", 0, unit="samples",
        zero="8 x global_batch_size", minimum=0, section=ADVANCED)
    max_local_batch_size: int = param(
        "max_local_batch_size", "RSPC", "adaptive batch: largest batch per rank (memory bound)", 0,
        unit="samples per rank", zero="unbounded", minimum=0, section=ADVANCED)
    adaptive_interval_s: float = param(
        "adaptive_interval_s", "RSPC", "adaptive batch: also re-pick the batch this often (in place, no restart)",
        60.0, unit="s", exclusive_minimum=0, section=ADVANCED)

    def __post_init__(self) -> None:
        self._check_rows()
        _check(not self.max_global_batch_size or self.max_global_batch_size >= self.global_batch_size,
               f"max_global_batch_size must be >= global_batch_size ({self.global_batch_size}) or 0, "
               f"got {self.max_global_batch_size}")

    @property
    def max_global_batch(self) -> int:
        """``max_global_batch_size`` or its default, 8 x ``global_batch_size`` (adaptive batch)."""
        return self.max_global_batch_size or 8 * self.global_batch_size


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig(_Section):
    optimizer: str = param("optimizer", "RSPC", "optimizer", "sgd", choices=("sgd", "adamw"), section=TRAINING)
    learning_rate: float = param("learning_rate", "RSPC", "peak learning rate", 0.05, unit="per step (peak)",
                                 exclusive_minimum=0, section=TRAINING)
    momentum: float = param("momentum", "RSPC", "SGD momentum", 0.9, minimum=0, exclusive_maximum=1,
                            section=ADVANCED)
    weight_decay: float = param("weight_decay", "RSPC", "L2 / decoupled weight decay", 5e-4, minimum=0,
                                section=ADVANCED)
    lr_schedule: str = param("lr_schedule", "RSPC", "learning-rate schedule after the warm-up", "cosine",
                             choices=("constant", "cosine"), section=ADVANCED)
    warmup_steps: int = param("warmup_steps", "RSPC", "linear learning-rate warm-up", 0, unit="steps", minimum=0,
                              section=ADVANCED)
    amp: str = param("amp", "RSPC", "mixed precision", "off", choices=("off", "bf16", "fp16"), section=ADVANCED)
    grad_clip_norm: float = param("grad_clip_norm", "RSPC", "clip the global gradient norm to this", 0.0,
                                  unit="L2 norm", minimum=0, section=ADVANCED)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig(_Section):
    uri: str = param("checkpoint_uri", "RSPC", "checkpoint root: a local folder or s3://bucket/prefix", "",
                     unit="URI", ops_variable="trainflow_checkpoint_uri")
    job_key: str = param("job_key", "RSPC", "stable identity of this training job; checkpoints live under "
                         "<checkpoint_uri>/<job_key>", "", ops=True)
    interval_steps: int = param("checkpoint_interval_steps", "RSPC", "save a checkpoint every N steps", 20,
                                unit="steps", minimum=0, section=CHECKPOINTING)
    interval_s: float = param("checkpoint_interval_s", "RSPC", "save a checkpoint at least every N seconds", 30.0,
                              unit="s", minimum=0, section=CHECKPOINTING)
    keep_last_k: int = param("keep_last_k", "RSPC", "committed checkpoints kept; older ones are deleted", 3,
                             unit="checkpoints", minimum=1, section=CHECKPOINTING)
    save_final: bool = param("save_final", "R", "save once more after the last step", True)
    preemption_save_deadline_s: float = param(
        "preemption_save_deadline_s", "RSPC", "on SIGTERM, give up the blocking checkpoint save after this long "
        "(the worker pods' terminationGracePeriodSeconds must be at least this + 10 s, and keep it below "
        "torchrun's 30 s stop timeout)", 20.0, unit="s", exclusive_minimum=0, section=ADVANCED)

    def __post_init__(self) -> None:
        self._check_rows()
        _check(bool(self.uri), "checkpoint_uri must not be empty (--checkpoint-uri)")
        _check(bool(self.job_key), "job_key must not be empty (--job-key)")
        _check(self.job_key.strip("/") == self.job_key and ".." not in self.job_key.split("/"),
               f"job_key {self.job_key!r} must be a relative key without leading/trailing '/' or '..'")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig(_Section):
    """Everything one training run (the pod runtime) needs; identical on every rank."""

    data: DataConfig
    checkpoint: CheckpointConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    epochs: int = param("epochs", "RSPC", "passes over the training split", 8, unit="passes", minimum=1,
                        section=TRAINING)
    max_steps: int = param("max_steps", "RSPC", "stop after this many optimizer steps", 0, unit="steps",
                           zero="no limit", minimum=0, section=ADVANCED)
    seed: int = param("seed", "RSPC", "seed of the weights, the data split and order, and every random stream (a resumed "
                      "job keeps its checkpoint's)", 0,
                      minimum=0, section=TRAINING)
    deterministic: bool = param("deterministic", "RSPC", "deterministic kernels (bit-exact resume)", True,
                                section=ADVANCED)
    fault_at_step: int = param("fault_at_step", "RSPC", "SIGKILL one training worker once after this step (fault "
                               "injection, to test resume)", 0, unit="step", zero="never", minimum=0,
                               section=ADVANCED)
    threads_per_rank: int = param("threads_per_rank", "R", "torch CPU threads per rank", 0, unit="threads",
                                  zero="usable CPUs (the pod's CPU request, else the affinity mask) / local ranks",
                                  minimum=0)
    metrics_path: str = param("metrics_path", "R", "per-step JSONL (rank 0): a file, or a storage URI of segment "
                              "objects (components/training/metrics.py)", "")
    metrics_port: int = param("metrics_port", "R", "Prometheus /metrics port on rank 0", 0, unit="TCP port",
                              minimum=0, maximum=65535)
    metrics_addr: str = param("metrics_addr", "R", "address /metrics binds to", "127.0.0.1")
    model_output: str = param("model_output", "R", "folder for the final model (rank 0)", "")
    throttle_step_s: float = param("throttle_step_s", "R", "sleep after each step (demos, tests)", 0.0, unit="s",
                                   minimum=0)
    sample_log_dir: str = param("sample_log_dir", "R", "log every consumed sample id per step here, a folder or a "
                                "storage URI such as s3://bucket/audit (audits)", "")
    log_every_steps: int = param("log_every_steps", "R", "console progress every N steps", 10, unit="steps",
                                 minimum=1)

    def __post_init__(self) -> None:
        self._check_rows()
        # The built-in task reads the prepared dataset; a user's task names its data in task_args.
        _check(bool(self.data.path) or not self.model.builtin, "dataset must not be empty (--dataset)")

    def task_kwargs(self) -> dict[str, Any]:
        """The task's keyword arguments (:meth:`ModelConfig.task_kwargs` with this job's dataset)."""
        return self.model.task_kwargs(dataset=self.data.path)

    # ------------------------------------------------------------------------- flat form
    def to_flat(self) -> dict[str, Any]:
        """``{row name: value}`` for every R row: the runtime's JSON config."""
        out = {}
        for owner, f, row in _r_fields():
            obj = self if owner is TrainConfig else getattr(self, _SECTION_ATTR[owner])
            out[row.name] = getattr(obj, f.name)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_flat(), sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return self.to_flat()

    @classmethod
    def from_flat(cls, data: Mapping[str, Any]) -> TrainConfig:
        """Build and validate from ``{row name: value}`` (R rows; unknown names are an error)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"the training config must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - {row.name for _, _, row in _r_fields()})
        if unknown:
            raise ConfigError(f"unknown training option(s) {', '.join(unknown)}")
        kwargs: dict[type, dict[str, Any]] = {owner: {} for owner in _SECTION_ATTR}
        kwargs[cls] = {}
        for owner, f, row in _r_fields():
            if row.name in data:
                kwargs[owner][f.name] = row.check(data[row.name])
        sections = {attr: owner(**kwargs[owner]) for owner, attr in _SECTION_ATTR.items()}
        return cls(**sections, **kwargs[cls])

    from_dict = from_flat

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"training config is not valid JSON: {e}") from e
        return cls.from_flat(data)


_SECTION_ATTR: dict[type, str] = {DataConfig: "data", CheckpointConfig: "checkpoint", ModelConfig: "model",
                                  OptimConfig: "optim"}


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchConfig(_Section):
    """How the ``train`` step runs the runtime: torchrun here, or a PyTorchJob (docs/launcher.md)."""

    backend: str = param("backend", "SPC", "where training runs: local (torchrun in the KFP step) or pytorchjob "
                         "(a PyTorchJob on the cluster)", "local", choices=BACKENDS,
                         ops_variable="trainflow_backend")
    min_workers: int = param("min_workers", "SPC", "elastic lower bound on the number of workers (torchrun agents "
                             "= PyTorchJob worker pods)", 1, unit="workers", minimum=1, section=TRAINING)
    max_workers: int = param("max_workers", "SPC", "elastic upper bound on the number of workers (>= "
                             "min_workers)", 1, unit="workers", minimum=1, section=TRAINING)
    nproc_per_node: int = param("nproc_per_node", "SPC", "training processes (DDP ranks) per worker; world size "
                                "= workers x nproc_per_node; on GPU workers one per GPU (the default follows "
                                "gpus_per_worker)", 2, unit="ranks per worker", minimum=1,
                                section=TRAINING)
    max_restarts: int = param("max_restarts", "SPC", "torchrun restarts of the worker group before the step fails",
                              3, unit="restarts", minimum=0, section=ADVANCED)
    image: str = param("image", "SPC", "container image of the PyTorchJob's workers (empty = the step's own)", "",
                       ops_variable="trainflow_image")
    namespace: str = param("namespace", "SPC", "Kubernetes namespace of the PyTorchJob (empty = the step's own, "
                           "i.e. the KFP profile's)", "", ops_variable="trainflow_namespace")
    gpus_per_worker: int = param("gpus_per_worker", "SPC", "GPUs per worker pod (pytorchjob; 0 = CPU)", 0,
                                 unit="nvidia.com/gpu", minimum=0, section=TRAINING)
    worker_cpu: str = param("worker_cpu", "SPC", "CPU request of each worker pod (pytorchjob; a limit: "
                            "worker_pod_settings resources)", "1",
                            unit="Kubernetes quantity, e.g. 2 or 500m", section=TRAINING)
    worker_memory: str = param("worker_memory", "SPC", "memory request and limit of each worker pod (pytorchjob)",
                               "4Gi", unit="Kubernetes quantity, e.g. 4Gi", section=TRAINING)
    worker_pod_settings: str = param(
        "worker_pod_settings", "SPC", "JSON object for the worker pods: tolerations, node_selector, "
        "service_account_name, priority_class_name, termination_grace_period_s, more resources, labels, "
        "pod_annotations, env, image_pull_secrets, run_as_user (docs/launcher.md)", "", unit="JSON object",
        ops_variable="trainflow_worker_pod_settings")
    s3_secret_name: str = param(
        "s3_secret_name", "SPC", "Kubernetes Secret with the S3 credentials the steps and workers get as environment "
        "(the pipeline's default is set at compile time, pipelines/platform.py)", "",
        ops_variable="trainflow_s3_secret_name")
    s3_access_key_key: str = param("s3_access_key_key", "S", "the Secret's key holding the access key id (compile "
                                   "time, pipelines/platform.py)", "AWS_ACCESS_KEY_ID", non_empty=True)
    s3_secret_key_key: str = param("s3_secret_key_key", "S", "the Secret's key holding the secret access key "
                                   "(compile time, pipelines/platform.py)", "AWS_SECRET_ACCESS_KEY", non_empty=True)
    s3_endpoint_key: str = param("s3_endpoint_key", "S", "the Secret's optional key holding the endpoint URL, "
                                 "read when s3_endpoint_url is empty (compile time, pipelines/platform.py)",
                                 "AWS_ENDPOINT_URL_S3", non_empty=True)
    s3_endpoint_url: str = param("s3_endpoint_url", "SPC", "S3 endpoint for every step and worker (empty = the "
                                 "Secret's endpoint key, s3_endpoint_key, or the SDK's default)", "", unit="URL",
                                 ops_variable="trainflow_s3_endpoint_url")
    keep_failed_job: bool = param("keep_failed_job", "SPC", "keep a failed PyTorchJob and its pods for inspection "
                                  "instead of deleting them (the step's retries then report its failure instead of "
                                  "replacing it)", False, ops_variable="trainflow_keep_failed_job")

    def __post_init__(self) -> None:
        self._check_rows()
        _check(self.min_workers <= self.max_workers,
               f"need min_workers <= max_workers, got {self.min_workers}..{self.max_workers}")


#: Every dataclass whose fields are rows, in table order.
_ROW_CLASSES: tuple[type, ...] = (PipelineConfig, ModelConfig, TrainConfig, DataConfig, OptimConfig,
                                  CheckpointConfig, LaunchConfig)
_ROW_BY_FIELD: dict[tuple[type, str], Row] = {}
for _cls in _ROW_CLASSES:
    _hints = get_type_hints(_cls)
    for _f in dataclasses.fields(_cls):
        if "row" in _f.metadata:
            _ROW_BY_FIELD[(_cls, _f.name)] = Row(type=_hints[_f.name], **_f.metadata["row"])
del _cls, _hints, _f


def _table_order() -> list[Row]:
    # Table order: the pipeline's data rows, then the model, then the job-wide rows, the data loader,
    # the optimizer, checkpoints, the launch, and the registry rows last.
    by_cls = {cls: [r for (c, _), r in _ROW_BY_FIELD.items() if c is cls] for cls in _ROW_CLASSES}
    pipeline = by_cls[PipelineConfig]
    train_top = by_cls[TrainConfig]
    order = [*pipeline[:2], *by_cls[ModelConfig], *train_top[:3], *by_cls[DataConfig], *by_cls[OptimConfig],
             *train_top[3:], *by_cls[CheckpointConfig], *by_cls[LaunchConfig], *pipeline[2:]]
    return order


SPEC: tuple[Row, ...] = tuple(_table_order())
"""The table: every training parameter once, in order."""
ROWS: dict[str, Row] = {row.name: row for row in SPEC}
#: Rows that shape the PyTorchJob's worker pods: with ``backend="local"`` torchrun runs in the train
#: step's own process (its pod, on a cluster) and nothing reads them, so a value other than the
#: default is refused instead of ignored (a GPU asked for and a CPU run given).
WORKER_POD_ROWS = ("gpus_per_worker", "worker_cpu", "worker_memory", "worker_pod_settings")
if len(ROWS) != len(SPEC):  # pragma: no cover - a duplicate name is a programming error
    raise RuntimeError("duplicate row names in the training spec")


def rows(surface: str) -> tuple[Row, ...]:
    """The rows on ``surface`` (``R``, ``S``, ``P`` or ``C``), in table order."""
    if surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}")
    return tuple(row for row in SPEC if row.on(surface))


def names(surface: str) -> tuple[str, ...]:
    return tuple(row.name for row in rows(surface))


def _r_fields() -> list[tuple[type, dataclasses.Field, Row]]:
    out = []
    for cls in (TrainConfig, DataConfig, ModelConfig, OptimConfig, CheckpointConfig):
        for f in dataclasses.fields(cls):
            row = _ROW_BY_FIELD.get((cls, f.name))
            if row is not None and row.on("R"):
                out.append((cls, f, row))
    return out


def _sets_worker_pods(name: str, value: Any) -> bool:
    """Whether row ``name`` (one of :data:`WORKER_POD_ROWS`) asks for something other than its default:
    an empty ``worker_pod_settings`` (``""``, ``"{}"``, blanks) and blanks around a quantity do not."""
    if isinstance(value, str):
        value = value.strip()
        if name == "worker_pod_settings" and value == "{}":
            return False
    return value != ROWS[name].default


def check_values(values: Mapping[str, Any], surface: str) -> dict[str, Any]:
    """``values`` (names of ``surface``'s rows; missing ones take the default) converted and
    checked row by row.

    Raises:
        ConfigError: an unknown name, or a value a row refuses (one line).
    """
    allowed = names(surface)
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown training parameter(s) {', '.join(unknown)}")
    return {name: ROWS[name].check(values[name]) if name in values else ROWS[name].default for name in allowed}


# -------------------------------------------------------------------------------------- the step
@dataclass(frozen=True, kw_only=True)
class TrainJobSpec:
    """A validated ``train`` step: every S row (defaults filled) plus the component's plumbing.

    Built with :meth:`from_kwargs` from the component's parameters (``components/specs/train.py``)
    or from ``trainflow run``'s options; :meth:`train_config` then gives the runtime config once
    the step knows the job key, checkpoint root, dataset location and output paths.
    """

    values: Mapping[str, Any]
    """``{row name: value}`` for every S row."""
    launch: LaunchConfig
    dataset_path: str = ""
    """The prepared dataset folder of this step (KFP ``dataset.path``)."""
    dataset_uri: str = ""
    """The prepared dataset artifact's URI (KFP ``artifact.uri``): what workers read on a cluster."""
    kfp_run_id: str = ""
    kfp_task_name: str = ""
    kfp_task_id: str = ""
    """The KFP task id (``dsl.PIPELINE_TASK_ID_PLACEHOLDER``: KFP 2.14 resolves it to the id of the
    task's parent DAG execution, so it tells apart the iterations of a ``dsl.ParallelFor`` loop and
    the calls of a sub-pipeline, which share run id and task name); empty for pipelines compiled
    before it was passed (docs/training.md, "Job key")."""
    pipeline_root: str = ""
    poll_interval_s: float = 5.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    runtime: Mapping[str, Any] = field(default_factory=dict)
    """Runtime-only (R) rows for the workers, e.g. ``{"sample_log_dir": "s3://b/audit"}`` (audits,
    tests); never a pipeline parameter. The step's own paths (dataset, job key, checkpoints,
    metrics, model) override them; an unknown name or a bad value is a :class:`ConfigError`."""

    PLUMBING: ClassVar[tuple[str, ...]] = ("dataset_path", "dataset_uri", "kfp_run_id", "kfp_task_name",
                                           "kfp_task_id", "pipeline_root", "poll_interval_s", "extra_env",
                                           "runtime")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], **plumbing: Any) -> TrainJobSpec:
        """Validate ``kwargs`` (S row names; missing ones take the table's default).

        Raises:
            ConfigError: one line — an unknown name, a bad value, or a cross-field rule
                (``min_workers <= max_workers``, ``max_global_batch_size >= global_batch_size``,
                no :data:`WORKER_POD_ROWS` setting with ``backend="local"``).
        """
        values = check_values(kwargs, "S")
        if values["backend"] == "local":
            shaped = [name for name in WORKER_POD_ROWS if _sets_worker_pods(name, values[name])]
            if shaped:
                said = ", ".join(f"{name}={values[name]!r}" for name in shaped)
                raise ConfigError(f"{said}: {'it shapes' if len(shaped) == 1 else 'they shape'} the PyTorchJob's "
                                  "worker pods, but backend 'local' trains in this step's own process (its pod's "
                                  "CPUs, memory and GPUs): set backend 'pytorchjob', or leave "
                                  f"{'it' if len(shaped) == 1 else 'them'} at the default")
        launch = LaunchConfig(**{f.name: values[_ROW_BY_FIELD[(LaunchConfig, f.name)].name]
                                 for f in dataclasses.fields(LaunchConfig)})
        spec = cls(values=values, launch=launch, **plumbing)
        # The runtime's cross-field rules, with placeholders for what the step resolves later.
        spec.train_config(dataset=spec.dataset_path or "(prepared)", job_key=values["job_key"] or "validate",
                          checkpoint_uri=values["checkpoint_uri"] or "validate")
        return spec

    @classmethod
    def build(cls, **fields: Any) -> TrainJobSpec:
        """:meth:`from_kwargs` with rows and plumbing (:attr:`PLUMBING`) given together."""
        plumbing = {name: fields.pop(name) for name in cls.PLUMBING if name in fields}
        return cls.from_kwargs(fields, **plumbing)

    def replace(self, **changes: Any) -> TrainJobSpec:
        """A copy with ``changes`` (rows or plumbing), validated again."""
        return TrainJobSpec.build(**{**self.values, **{name: getattr(self, name) for name in self.PLUMBING},
                                     **changes})

    def __getattr__(self, name: str) -> Any:  # spec.epochs, spec.backend, ...: the row's value
        if name.startswith("_") or name == "values":
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def train_config(self, *, dataset: str, job_key: str, checkpoint_uri: str, metrics_path: str = "",
                     model_output: str = "") -> TrainConfig:
        """The runtime config of this step (R rows from ``values`` plus the step's own paths).

        Raises:
            ConfigError: one line.
        """
        flat = {name: self.values[name] for name in names("R") if name in self.values}
        flat.update(self.runtime)
        flat.update(dataset=dataset, job_key=job_key, checkpoint_uri=checkpoint_uri, metrics_path=metrics_path,
                    model_output=model_output)
        return TrainConfig.from_flat(flat)


# ------------------------------------------------------------------------------ the Airflow form
def form_fields() -> dict[str, dict[str, Any]]:
    """The Trigger form of ``training_pipeline``: P rows that are not ops settings, by section
    (:data:`FORM_SECTIONS`) then table order: ``{name: {"section", "description", bounds...}}``."""
    fields = [row for row in rows("P") if not row.ops]
    fields.sort(key=lambda row: FORM_SECTIONS.index(row.section))
    return {row.name: {"section": row.section, "description": row.describe(), **row.json_schema()}
            for row in fields}


def ops_settings() -> dict[str, dict[str, Any]]:
    """P rows that are ops/security settings: ``{name: {"variable", "description", bounds...}}``."""
    return {row.name: {"variable": row.ops_variable, "description": row.describe(), **row.json_schema()}
            for row in rows("P") if row.ops}


# ---------------------------------------------------------------------------------------- docs
def markdown_table() -> str:
    """``docs/training-parameters.md``'s table (generated; a test keeps the file current)."""
    lines = ["| name | type | default | unit | bounds / choices | surfaces | help |",
             "|---|---|---|---|---|---|---|"]
    for row in SPEC:
        bounds = []
        for label, value in ((">=", row.minimum), ("<=", row.maximum), (">", row.exclusive_minimum),
                             ("<", row.exclusive_maximum)):
            if value is not None:
                bounds.append(f"{label} {_num(value)}")
        if row.choices:
            bounds.append(", ".join(row.choices))
        if row.non_empty:
            bounds.append("non-empty")
        if row.zero:
            bounds.append(f"0 = {row.zero}")
        default = json.dumps(row.default) if row.type is not bool else str(row.default).lower()
        surfaces = "".join(s for s in "RSPC" if row.on(s))
        if row.ops:
            surfaces += " (ops)"
        lines.append(f"| `{row.name}` | {row.type.__name__} | `{default}` | {row.unit or '–'} | "
                     f"{'; '.join(bounds) or '–'} | {surfaces} | {row.help} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """``python -m trainflow.common.training_spec`` prints docs/training-parameters.md."""
    print(_DOC_HEAD + markdown_table() + _DOC_TAIL, end="")


_DOC_HEAD = """# Training parameters

<!-- Generated by `python -m trainflow.common.training_spec > docs/training-parameters.md`
     from trainflow/common/training_spec.py; tests/common/test_training_spec.py keeps it current. -->

Every parameter of a training job, once: name, type, default, unit, bounds and the surfaces that
expose it. **R** the training runtime (`python -m components.training --NAME`, and its flat JSON
config), **S** the KFP `train` component, **P** `training_pipeline`, **C** `trainflow run --NAME`
(`-` for `_`). The Airflow example DAG's Trigger form shows the P rows; those marked *(ops)* are
ops/security settings set by Airflow Variables instead (docs/airflow.md). The literal KFP
signatures are pinned to this table by `tests/pipelines/test_training_spec_signatures.py`.

For optional counts and durations `0` means off (or the stated default); negative values are an
error.

"""
_DOC_TAIL = """
Runtime-only rows (R) are set by the `train` step or by tests. `s3_access_key_key`,
`s3_secret_key_key` and `s3_endpoint_key` (S) are fixed when the pipeline is compiled
(`pipelines/platform.py`); the train step gives the PyTorchJob's workers the same keys.
"""


if __name__ == "__main__":
    main()
