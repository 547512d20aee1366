"""Built-in tasks, written on the public task API (:mod:`trainflow.task`) like any user's task.

Each is registered by import path in :data:`trainflow.task.BUILTIN_TASKS`; a contract in
pyproject.toml keeps them off the trainer's internals (they may reuse its models and datasets).
"""
