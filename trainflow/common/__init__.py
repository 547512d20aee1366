"""The pure kernel every part of trainflow may import (components, pipelines, airflow_bridge,
gpu_scheduler, the CLI).

Standard-library code only — no third-party package and no other trainflow part (pyproject's
import-linter contract, and tests/common/test_stdlib_only.py, which checks every import against
``sys.stdlib_module_names``) — so that the three parts stay independent while a rule has exactly
one home:

* :mod:`trainflow.common.training_spec` — the one table of the training job's parameters;
* :mod:`trainflow.common.coerce` — how a text or JSON value becomes a parameter's type;
* :mod:`trainflow.common.listing` — how a dataset's listing is fingerprinted;
* :mod:`trainflow.common.cpus` — how many CPUs (and torch threads per rank) a trainer may use.
"""
