"""How an untyped value (a command-line string, a JSON number, a KFP parameter) becomes one of the
four parameter types ``bool``, ``int``, ``float``, ``str`` — one rule for the runtime flags, the
JSON config, the ``train`` step and ``trainflow run``.

* ``bool``: ``True``/``False``, or one of the strings in :data:`TRUE_WORDS`/:data:`FALSE_WORDS`
  (any case), or the integers 0/1; anything else is refused (``"maybe"`` is not false).
* ``int``: an int, an integral float (``3.0``) or a string holding one; never a bool.
* ``float``: an int, a float or a numeric string; never a bool.
* ``str``: a string as is, an int or float as its ``str`` (``worker_cpu=2``); bools and other
  objects are refused.
"""

from __future__ import annotations

from typing import Any

TRUE_WORDS = ("true", "1", "yes", "on")
FALSE_WORDS = ("false", "0", "no", "off")


class CoerceError(ValueError):
    """The value cannot become the requested type; the message is one line naming the field."""


def parse_bool(value: Any, name: str = "value") -> bool:
    """``value`` as a bool (see the module docstring). Raises :class:`CoerceError`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
    raise CoerceError(f"{name} must be true or false, got {value!r}")


def coerce(value: Any, target: type, name: str = "value") -> Any:
    """``value`` converted to ``target`` (``bool``, ``int``, ``float`` or ``str``).

    Raises:
        CoerceError: one line, e.g. ``epochs must be an integer, got '2.5'``.
    """
    if target is bool:
        return parse_bool(value, name)
    if isinstance(value, bool) and target in (int, float):
        raise CoerceError(f"{name} must be {_NOUN[target]}, got {value!r}")
    try:
        if target is int:
            if isinstance(value, int):
                return value
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, float) and number.is_integer():
                return int(number)
            raise ValueError(value)
        if target is float:
            if isinstance(value, int | float):
                return float(value)
            if isinstance(value, str):
                return float(value)
            raise ValueError(value)
        if target is str:
            if isinstance(value, str):
                return value
            if isinstance(value, int | float) and not isinstance(value, bool):
                return str(value)
            raise ValueError(value)
    except (TypeError, ValueError, OverflowError):
        raise CoerceError(f"{name} must be {_NOUN[target]}, got {value!r}") from None
    raise TypeError(f"unsupported parameter type {target!r}")


_NOUN = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
