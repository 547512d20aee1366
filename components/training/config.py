"""Training configuration: small keyword-only dataclasses validated on creation.

Every field carries its command-line flag in ``metadata["flag"]`` so the CLI, the JSON form and the
KFP component all describe the same thing once (shape taken from torchtitan's
``torchtitan/config/configurable.py``: kw_only + slots config nested per concern, units in names,
cross-field rules in ``__post_init__`` with messages that name the fields).

Invalid values raise :class:`ConfigError` — a one-line message, raised before any worker starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin, get_type_hints


class ConfigError(ValueError):
    """An invalid training configuration; the message is one line naming the field."""


def _opt(flag: str, help: str, **kw: Any) -> dict[str, Any]:
    return {"flag": flag, "help": help, **kw}


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    path: str = field(metadata=_opt("--dataset", "prepared dataset (output of prepare_dataset): a folder, "
                                    "s3://BUCKET/PREFIX, or a built-in source (mnist, digits, synthetic-cifar[:N]) "
                                    "prepared on the spot"))
    global_batch_size: int = field(
        default=64,
        metadata=_opt("--global-batch-size", "samples per optimizer step over all ranks; fixed when the world size changes"),
    )
    loader_workers: int = field(default=0, metadata=_opt("--loader-workers", "DataLoader processes per rank (image folders)"))
    adaptive_batch: bool = field(
        default=False,
        metadata=_opt("--adaptive-batch", "opt-in: pick the global batch of largest goodput at every (re)start and "
                      "epoch end, starting from --global-batch-size (components/training/goodput.py)"),
    )
    max_global_batch_size: int | None = field(
        default=None, metadata=_opt("--max-global-batch-size", "adaptive batch: largest global batch (default 8x "
                                    "--global-batch-size)")
    )
    max_local_batch_size: int | None = field(
        default=None, metadata=_opt("--max-local-batch-size", "adaptive batch: largest batch per rank (memory bound)")
    )
    adaptive_interval_s: float = field(
        default=60.0, metadata=_opt("--adaptive-interval-s", "adaptive batch: also re-pick the batch this often "
                                    "(seconds; in place, no restart)")
    )

    def __post_init__(self) -> None:
        _check(bool(self.path), "dataset path must not be empty (--dataset)")
        _check(self.global_batch_size >= 1, f"global_batch_size must be >= 1, got {self.global_batch_size}")
        _check(self.loader_workers >= 0, f"loader_workers must be >= 0, got {self.loader_workers}")
        _check(self.max_global_batch_size is None or self.max_global_batch_size >= self.global_batch_size,
               f"max_global_batch_size must be >= global_batch_size ({self.global_batch_size}), "
               f"got {self.max_global_batch_size}")
        _check(self.max_local_batch_size is None or self.max_local_batch_size >= 1,
               f"max_local_batch_size must be >= 1, got {self.max_local_batch_size}")
        _check(math.isfinite(self.adaptive_interval_s) and self.adaptive_interval_s > 0,
               f"adaptive_interval_s must be a positive number of seconds, got {self.adaptive_interval_s}")

    @property
    def max_global_batch(self) -> int:
        """``max_global_batch_size`` or its default, 8 x ``global_batch_size`` (adaptive batch)."""
        return self.max_global_batch_size or 8 * self.global_batch_size


ModelName = Literal["small_cnn", "resnet18", "wide_resnet101_2"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    name: ModelName = field(default="small_cnn", metadata=_opt("--model", "small_cnn | resnet18 | wide_resnet101_2"))

    def __post_init__(self) -> None:
        _check(self.name in get_args(ModelName), f"model must be one of {get_args(ModelName)}, got {self.name!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    optimizer: Literal["sgd", "adamw"] = field(default="sgd", metadata=_opt("--optimizer", "sgd | adamw"))
    lr: float = field(default=0.05, metadata=_opt("--lr", "peak learning rate"))
    momentum: float = field(default=0.9, metadata=_opt("--momentum", "SGD momentum"))
    weight_decay: float = field(default=5e-4, metadata=_opt("--weight-decay", "L2 / decoupled weight decay"))
    lr_schedule: Literal["constant", "cosine"] = field(default="cosine", metadata=_opt("--lr-schedule", "constant | cosine"))
    warmup_steps: int = field(default=0, metadata=_opt("--warmup-steps", "linear warm-up steps"))
    amp: Literal["off", "bf16", "fp16"] = field(default="off", metadata=_opt("--amp", "mixed precision: off | bf16 | fp16"))
    grad_clip_norm: float | None = field(default=None, metadata=_opt("--grad-clip-norm", "clip the global grad norm"))

    def __post_init__(self) -> None:
        _check(self.optimizer in ("sgd", "adamw"), f"optimizer must be sgd or adamw, got {self.optimizer!r}")
        _check(math.isfinite(self.lr) and self.lr > 0, f"lr must be a positive number, got {self.lr}")
        _check(0 <= self.momentum < 1, f"momentum must be in [0, 1), got {self.momentum}")
        _check(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        _check(self.lr_schedule in ("constant", "cosine"), f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
        _check(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        _check(self.amp in ("off", "bf16", "fp16"), f"amp must be off, bf16 or fp16, got {self.amp!r}")
        _check(self.grad_clip_norm is None or self.grad_clip_norm > 0, "grad_clip_norm must be > 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    uri: str = field(metadata=_opt("--checkpoint-uri", "checkpoint root: a local folder or s3://bucket/prefix"))
    job_key: str = field(
        metadata=_opt("--job-key", "stable identity of this training job; checkpoints live under <uri>/<job_key>")
    )
    interval_steps: int | None = field(default=None, metadata=_opt("--checkpoint-interval-steps", "save every N steps"))
    interval_s: float | None = field(default=30.0, metadata=_opt("--checkpoint-interval-s", "save every N seconds"))
    keep_last_k: int = field(default=3, metadata=_opt("--keep-last-k", "committed checkpoints kept"))
    save_final: bool = field(default=True, metadata=_opt("--save-final", "save once more after the last step"))
    preemption_save_deadline_s: float = field(
        default=20.0,
        metadata=_opt("--preemption-save-deadline-s", "on SIGTERM, give up the blocking checkpoint save after this many "
                      "seconds (keep it below the pod's terminationGracePeriodSeconds minus ~5 s and below "
                      "torchrun's 30 s stop timeout)"),
    )

    def __post_init__(self) -> None:
        _check(bool(self.uri), "checkpoint uri must not be empty (--checkpoint-uri)")
        _check(bool(self.job_key), "job_key must not be empty (--job-key)")
        _check(self.job_key.strip("/") == self.job_key and ".." not in self.job_key.split("/"),
               f"job_key {self.job_key!r} must be a relative key without leading/trailing '/' or '..'")
        _check(self.interval_steps is None or self.interval_steps >= 1,
               f"checkpoint interval_steps must be >= 1, got {self.interval_steps}")
        _check(self.interval_s is None or self.interval_s > 0, f"checkpoint interval_s must be > 0, got {self.interval_s}")
        _check(self.keep_last_k >= 1, f"keep_last_k must be >= 1, got {self.keep_last_k}")
        _check(math.isfinite(self.preemption_save_deadline_s) and self.preemption_save_deadline_s > 0,
               f"preemption_save_deadline_s must be a positive number of seconds, got {self.preemption_save_deadline_s}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Everything one training job needs; identical on every rank."""

    data: DataConfig
    checkpoint: CheckpointConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    epochs: int = field(default=3, metadata=_opt("--epochs", "passes over the training split"))
    max_steps: int | None = field(default=None, metadata=_opt("--max-steps", "stop after this many steps"))
    seed: int = field(default=0, metadata=_opt("--seed", "seed of weights, data order and RNG streams"))
    deterministic: bool = field(default=True, metadata=_opt("--deterministic", "deterministic kernels (bit-exact resume)"))
    threads_per_rank: int | None = field(default=None, metadata=_opt("--threads-per-rank", "torch CPU threads per rank"))
    metrics_path: str | None = field(default=None, metadata=_opt("--metrics-path", "per-step JSONL (rank 0): a file, "
                                     "or a storage URI of segment objects (components/training/metrics.py)"))
    metrics_port: int = field(default=0, metadata=_opt("--metrics-port", "Prometheus /metrics port on rank 0; 0 = off"))
    metrics_addr: str = field(default="127.0.0.1", metadata=_opt("--metrics-addr", "address /metrics binds to"))
    model_output: str | None = field(default=None, metadata=_opt("--model-output", "folder for the final model (rank 0)"))
    fault_at_step: int | None = field(
        default=None, metadata=_opt("--fault-at-step", "SIGKILL one worker once after this step (fault injection)")
    )
    throttle_step_s: float = field(default=0.0, metadata=_opt("--throttle-step-s", "sleep after each step (demos, tests)"))
    sample_log_dir: str | None = field(
        default=None, metadata=_opt("--sample-log-dir", "log every consumed sample id per step here (audits)")
    )
    log_every_steps: int = field(default=10, metadata=_opt("--log-every-steps", "console progress every N steps"))

    def __post_init__(self) -> None:
        _check(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        _check(self.max_steps is None or self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        _check(self.threads_per_rank is None or self.threads_per_rank >= 1, "threads_per_rank must be >= 1")
        _check(0 <= self.metrics_port <= 65535, f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        _check(self.fault_at_step is None or self.fault_at_step >= 1, f"fault_at_step must be >= 1, got {self.fault_at_step}")
        _check(self.throttle_step_s >= 0, "throttle_step_s must be >= 0")
        _check(self.log_every_steps >= 1, "log_every_steps must be >= 1")

    # ------------------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build and validate from a dict (unknown keys are an error)."""
        return _build(cls, data, "")

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"training config is not valid JSON: {e}") from e
        return cls.from_dict(data)


_SECTIONS = {"data": DataConfig, "checkpoint": CheckpointConfig, "model": ModelConfig, "optim": OptimConfig}


def _build(cls: type, data: Any, where: str) -> Any:
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be an object, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"unknown training option(s) {', '.join(where + u for u in unknown)}")
    missing = _missing_required(cls, data)
    if missing:
        raise ConfigError(missing)
    kwargs = {}
    for name, value in data.items():
        section = _SECTIONS.get(name) if cls is TrainConfig else None
        kwargs[name] = _build(section, value, f"{name}.") if section else _coerce(value, hints[name], where + name)
    return cls(**kwargs)


def _required(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def _missing_required(cls: type, data: dict[str, Any]) -> str | None:
    """A one-line sentence naming the first required option ``data`` lacks (by its flag), or None."""
    for f in _required(cls):
        if f.name in data:
            continue
        section = _SECTIONS.get(f.name) if cls is TrainConfig else None
        sub = _required(section)[0] if section else f
        return f"{sub.metadata['flag']} is required: {sub.metadata['help']}"
    return None


def _coerce(value: Any, hint: Any, name: str) -> Any:
    if value is None:
        return None
    types = [t for t in (get_args(hint) if get_origin(hint) is not Literal else ()) if t is not type(None)]
    target = types[0] if types else hint
    if get_origin(target) is Literal or get_origin(hint) is Literal:
        return value
    try:
        if target is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if target is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if target is float:
            return float(value)
        if target is str:
            return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{name} must be a {target.__name__}, got {value!r}") from e
    return value


# ----------------------------------------------------------------------------------- command line
def _flag_fields() -> list[tuple[str, str | None, dataclasses.Field]]:
    out = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SECTIONS:
            out.extend((sf.metadata["flag"], f.name, sf) for sf in dataclasses.fields(_SECTIONS[f.name]))
        else:
            out.append((f.metadata["flag"], None, f))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per config field (``--lr``, ``--checkpoint-uri``, ...) plus ``--config FILE``."""
    parser.add_argument("--config", help="JSON training config file; flags override its values")
    parser.add_argument("--config-json", help="JSON training config given inline")
    hints = {**get_type_hints(TrainConfig), **{n: t for sec in _SECTIONS.values() for n, t in get_type_hints(sec).items()}}
    for flag, _section, f in _flag_fields():
        # A bool flag alone means true (``--adaptive-batch``); ``--flag false`` still works.
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if hints.get(f.name) is bool else {}
        parser.add_argument(flag, dest=flag[2:].replace("-", "_"), default=None, help=f.metadata["help"], **extra)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """Merge ``--config`` / ``--config-json`` with individual flags and validate."""
    data: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config) as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read training config {args.config}: {e}") from e
    if args.config_json:
        data = json.loads(args.config_json) if args.config_json.strip() else {}
    for flag, section, f in _flag_fields():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None:
            continue
        target = data.setdefault(section, {}) if section else data
        target[f.name] = value
    return TrainConfig.from_dict(data)
