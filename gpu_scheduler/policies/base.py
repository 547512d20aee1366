"""The policy interface and the registry of policies by name.

A policy is a small, immutable, configured object with one pure method::

    decide(snapshot: ClusterSnapshot, now_s: float) -> Decision

Contract (both harnesses rely on it):

* **Pure.** No I/O, no wall clock, no randomness, no mutation of the policy or the snapshot: the
  same snapshot and ``now_s`` always give the same decision. State a policy needs across rounds
  (e.g. a queue level) lives in the cluster, as :attr:`JobDecision.annotations` handed back in
  the next snapshot's :attr:`Job.annotations`.
* **Total.** The decision names every snapshot job exactly once (use
  :meth:`Decision.from_placements`) and passes :meth:`Decision.validate`.
* **Observable inputs only.** Policies read only what the live controller can observe
  (:class:`~gpu_scheduler.model.Job` fields). A policy that needs perfect knowledge (an "oracle"
  baseline such as Optimus+Oracle) sets ``uses_oracle = True``; the simulator then fills
  ``Job.throughput`` for every worker count and ``Job.remaining_samples``. Oracle policies are
  benchmarks only; the live controller refuses them. A policy that reads a job agent's
  goodput model (Pollux, Sia: ``Job.goodput_model``) sets ``uses_goodput_model = True``; the
  simulator fits and fills it only for such policies (fitting costs time).

Switching policy at run time is just calling another object's ``decide`` on the next round
(the policies keep no state), as Schedulearn requires.

Registry::

    from gpu_scheduler.policies import create, names
    policy = create("tiresias", queue_thresholds_gpu_s=(57600.0,))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

from gpu_scheduler.model import ClusterSnapshot, Decision, SchedulerError

__all__ = ["Policy", "UnknownPolicy", "annotation_float", "create", "describe", "names", "parse_params", "register"]


def annotation_float(raw: str | None, default: float) -> float:
    """A policy's number kept in a job annotation (``raw``, e.g. since when a job waits, Unix s), or
    ``default`` when absent or not a finite number: annotations are the cluster's, anyone may edit
    them, and a policy must not raise over one (:class:`Policy`, "Total")."""
    try:
        value = float(raw) if raw else default
    except (ValueError, OverflowError):
        return default
    return value if math.isfinite(value) else default


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy (see the module docstring for the contract).

    Attributes:
        name: Registry name (``"tiresias"``); also recorded in each :class:`Decision`.
        uses_oracle: True if the policy needs simulator-only perfect knowledge.
    """

    name: ClassVar[str]
    uses_oracle: ClassVar[bool]

    def decide(self, snapshot: ClusterSnapshot, now_s: float) -> Decision:
        """Targets for every job in ``snapshot`` at time ``now_s`` (seconds)."""
        ...


class UnknownPolicy(SchedulerError):
    """No policy is registered under the requested name, or its parameters are wrong."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Policy]
    summary: str


_REGISTRY: dict[str, _Entry] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: register a policy class under ``name`` and set its ``name`` attribute.

    The first line of the class docstring becomes its one-line summary.

    Raises:
        ValueError: if ``name`` is already registered to another class.
    """

    def wrap(cls: type) -> type:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.factory is not cls:
            raise ValueError(f"policy name {name!r} already registered")
        cls.name = name  # type: ignore[attr-defined]
        if not hasattr(cls, "uses_oracle"):
            cls.uses_oracle = False  # type: ignore[attr-defined]
        if not hasattr(cls, "uses_goodput_model"):
            cls.uses_goodput_model = False  # type: ignore[attr-defined]
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        _REGISTRY[name] = _Entry(cls, summary)
        return cls

    return wrap


def names() -> tuple[str, ...]:
    """Registered policy names, sorted."""
    return tuple(sorted(_REGISTRY))


def describe() -> dict[str, str]:
    """One-line summary by policy name."""
    return {name: _REGISTRY[name].summary for name in names()}


def create(name: str, **params: Any) -> Policy:
    """A configured policy.

    Args:
        name: Registry name (see :func:`names`).
        **params: Keyword parameters of the policy class (its documented fields).

    Raises:
        UnknownPolicy: for an unknown name or a parameter the policy does not take / rejects.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnknownPolicy(f"unknown policy {name!r}; choose one of: {', '.join(names())}")
    _check_types(name, entry.factory, params)
    try:
        return entry.factory(**params)
    except TypeError as exc:
        raise UnknownPolicy(f"policy {name!r}: bad parameters {sorted(params)}: {exc}") from exc
    except ValueError as exc:
        raise UnknownPolicy(f"policy {name!r}: {exc}") from exc


def _check_types(name: str, factory: Any, params: Mapping[str, Any]) -> None:
    """Refuse a parameter whose value is not of its field's default's type (a YAML ``"false"`` for a
    bool field was truthy; a string for a number failed later, mid-decision). Numbers of any kind are
    numbers (an int for a float field; numpy scalars); a tuple field takes a list or tuple of numbers.
    Parameters the policy does not take are left to its constructor (a TypeError, named)."""
    import numbers

    if not dataclasses.is_dataclass(factory):
        return
    defaults = {f.name: f.default for f in dataclasses.fields(factory) if f.init}
    for key, value in params.items():
        default = defaults.get(key, dataclasses.MISSING)
        if default is dataclasses.MISSING or default is None:
            continue
        if isinstance(default, bool):
            ok = isinstance(value, bool) or type(value).__name__ == "bool_"
        elif isinstance(default, numbers.Integral):
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        elif isinstance(default, numbers.Real):
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        elif isinstance(default, tuple):
            ok = isinstance(value, tuple | list) and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value)
        elif isinstance(default, str):
            ok = isinstance(value, str)
        else:
            ok = True
        if not ok:
            kind = "a list of numbers" if isinstance(default, tuple) else f"a {type(default).__name__}"
            raise UnknownPolicy(f"policy {name!r}: parameter {key} must be {kind}, got {value!r} "
                                f"({type(value).__name__})")


def parse_params(name: str, pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse ``key=value`` strings into typed keyword parameters for policy ``name``.

    Values are converted to the type of the field's default (int, float, bool, str, or a tuple
    of floats written ``a,b,c``).

    Raises:
        UnknownPolicy: for an unknown policy, a malformed pair or an unknown field.
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnknownPolicy(f"unknown policy {name!r}; choose one of: {', '.join(names())}")
    fields: Mapping[str, dataclasses.Field] = (
        {f.name: f for f in dataclasses.fields(entry.factory) if f.init}  # type: ignore[arg-type]
        if dataclasses.is_dataclass(entry.factory) else {}
    )
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UnknownPolicy(f"policy parameter {pair!r} is not key=value")
        if key not in fields:
            raise UnknownPolicy(f"policy {name!r} has no parameter {key!r}; it has: {', '.join(sorted(fields))}")
        default = fields[key].default
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                value: Any = raw.lower() in ("true", "1", "yes")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            elif isinstance(default, tuple):
                value = tuple(float(v) for v in raw.split(",") if v.strip())
            else:
                value = raw
        except ValueError:
            raise UnknownPolicy(f"policy {name!r}: parameter {key}={raw!r} is not a valid "
                                f"{type(default).__name__}") from None
        out[key] = value
    return out
