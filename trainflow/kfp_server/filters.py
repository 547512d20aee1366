"""The v2beta1 list ``filter``: a URL-encoded, JSON-serialized ``Filter`` message (pure).

Shape (``backend/api/v2beta1/filter.proto`` in kubeflow/pipelines)::

    {"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": "x"}]}

Predicates are ANDed. ``operation`` may be the enum name or its number (kfp's client sends
numbers: EQUALS=1, NOT_EQUALS=2, GREATER_THAN=3, GREATER_THAN_EQUALS=5, LESS_THAN=6,
LESS_THAN_EQUALS=7, IN=8, IS_SUBSTRING=9). Value fields are accepted in snake_case and camelCase
(protobuf JSON accepts both).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainflow.kfp_server.errors import invalid_argument

_OPERATIONS = {
    1: "EQUALS",
    2: "NOT_EQUALS",
    3: "GREATER_THAN",
    5: "GREATER_THAN_EQUALS",
    6: "LESS_THAN",
    7: "LESS_THAN_EQUALS",
    8: "IN",
    9: "IS_SUBSTRING",
}
_SCALAR_VALUE_FIELDS = ("string_value", "int_value", "long_value", "timestamp_value")
_LIST_VALUE_FIELDS = ("string_values", "int_values", "long_values")


@dataclass(frozen=True, slots=True)
class Predicate:
    """One parsed predicate: ``key`` ``operation`` ``value`` (a list for ``IN``)."""

    key: str
    operation: str
    value: Any


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _field(raw: Mapping[str, Any], name: str) -> Any:
    return raw.get(name, raw.get(_camel(name)))


def parse_filter(text: str | None) -> list[Predicate]:
    """Parse a ``filter`` query parameter.

    Raises:
        ApiError: INVALID_ARGUMENT when the text is not a valid Filter.
    """
    if not text:
        return []
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise invalid_argument(f"filter is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise invalid_argument("filter must be a JSON object with 'predicates'")
    out = []
    for pred in raw.get("predicates") or []:
        if not isinstance(pred, dict) or not pred.get("key"):
            raise invalid_argument(f"filter predicate without a key: {pred!r}")
        op = pred.get("operation", pred.get("op"))
        if isinstance(op, int):
            op = _OPERATIONS.get(op)
        if op not in _OPERATIONS.values():
            raise invalid_argument(f"filter predicate has an unsupported operation: {pred!r}")
        if op == "IN":
            holder = next((_field(pred, f) for f in _LIST_VALUE_FIELDS if _field(pred, f) is not None), None)
            if not isinstance(holder, dict) or not isinstance(holder.get("values"), list):
                raise invalid_argument(f"IN predicate needs string_values/int_values: {pred!r}")
            value: Any = holder["values"]
        else:
            present = [f for f in _SCALAR_VALUE_FIELDS if _field(pred, f) is not None]
            if len(present) != 1:
                raise invalid_argument(f"filter predicate needs exactly one value: {pred!r}")
            value = _field(pred, present[0])
            if present[0] == "long_value":  # int64 as a JSON string (proto3 JSON) or a number
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise invalid_argument(f"filter predicate's long_value is not an integer: {pred!r}") from None
        out.append(Predicate(key=str(pred["key"]), operation=op, value=value))
    return out


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    """Bring an object's field and a predicate value to one type (timestamps, numbers, text)."""
    if isinstance(a, str) and isinstance(b, str) and a.endswith("Z") and b.endswith("Z"):
        try:
            return datetime.fromisoformat(a), datetime.fromisoformat(b)
        except ValueError:
            return a, b
    if isinstance(a, int | float) and not isinstance(b, int | float):
        try:
            return a, float(b)
        except (TypeError, ValueError):
            return str(a), str(b)
    if isinstance(b, int | float) and not isinstance(a, int | float):
        return str(a), str(b)
    return a, b


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "EQUALS": lambda a, b: a == b,
    "NOT_EQUALS": lambda a, b: a != b,
    "GREATER_THAN": lambda a, b: a > b,
    "GREATER_THAN_EQUALS": lambda a, b: a >= b,
    "LESS_THAN": lambda a, b: a < b,
    "LESS_THAN_EQUALS": lambda a, b: a <= b,
}


def matches(obj: Mapping[str, Any], predicates: list[Predicate], keys: Mapping[str, str]) -> bool:
    """True when ``obj`` satisfies every predicate.

    Args:
        obj: an API object (run, experiment, pipeline, version).
        predicates: from :func:`parse_filter`.
        keys: filterable key -> field of ``obj`` (aliases such as ``name`` -> ``display_name``).

    Raises:
        ApiError: INVALID_ARGUMENT for a key that cannot be filtered on.
    """
    for pred in predicates:
        if pred.key not in keys:
            raise invalid_argument(
                f"cannot filter on '{pred.key}'; filterable keys: {', '.join(sorted(keys))}"
            )
        actual = obj.get(keys[pred.key])
        if pred.operation == "IN":
            if actual not in pred.value and str(actual) not in [str(v) for v in pred.value]:
                return False
            continue
        if pred.operation == "IS_SUBSTRING":
            if str(pred.value) not in str(actual or ""):
                return False
            continue
        if actual is None:
            return False
        a, b = _comparable(actual, pred.value)
        try:
            if not _COMPARE[pred.operation](a, b):
                return False
        except TypeError:
            return False
    return True
