"""The training runtime's command line: one flag per R row of the training spec.

The parameters themselves — names, types, defaults, bounds, help — live in one table,
:mod:`trainflow.common.training_spec`; this module only turns it into ``argparse`` flags
(``--learning-rate``, ``--checkpoint-uri``, ...) plus ``--config FILE`` / ``--config-json TEXT``
(the flat JSON form, ``{row name: value}``), and merges them into a validated
:class:`~trainflow.common.training_spec.TrainConfig`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from trainflow.common.training_spec import ConfigError, TrainConfig, rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per R row plus ``--config FILE`` and ``--config-json TEXT``."""
    parser.add_argument("--config", help="JSON training config file ({name: value}); flags override its values")
    parser.add_argument("--config-json", help="JSON training config given inline")
    for row in rows("R"):
        # A bool flag alone means true (``--adaptive-batch``); ``--flag false`` still works.
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if row.type is bool else {}
        parser.add_argument(row.flag, dest=row.name, default=None, help=row.describe(), **extra)


def from_args(args: argparse.Namespace) -> TrainConfig:
    """Merge ``--config`` / ``--config-json`` with individual flags and validate.

    Raises:
        ConfigError: an unreadable config file, invalid JSON or an invalid value (one line).
    """
    data: dict[str, Any] = {}
    if args.config:
        try:
            with open(args.config) as fh:
                data = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read training config {args.config}: {e}") from e
    if args.config_json:
        try:
            data = json.loads(args.config_json) if args.config_json.strip() else {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"--config-json is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"the training config must be a JSON object, got {type(data).__name__}")
    for row in rows("R"):
        value = getattr(args, row.name)
        if value is not None:
            data[row.name] = value
    return TrainConfig.from_flat(data)
