"""How many CPUs a training process may use, and so how many torch threads each rank gets.

``os.cpu_count()`` is the *host's* count: in a worker pod on a 64-core node with a 4-CPU request it
is 64, and torch's default of one intra-op thread per core then oversubscribes the node (on the
2-core test machine two such pods ran ~10x slower than with one thread each). The rule, one home
for the trainer (``components/training/trainer.py``) and the local launcher
(``components/training/launch.py``):

1. the container's CPU request, which the PyTorchJob renderer
   (``components/launcher/pytorchjob.py``) passes in :data:`CPU_REQUEST_ENV` through the downward
   API (``resourceFieldRef: requests.cpu``, divisor ``1m``; Kubernetes sets the request to the limit
   when only a limit is given, and reports 0 when neither is), rounded down to whole CPUs, at
   least 1;
2. else the CPUs in this process's affinity mask (``os.sched_getaffinity``; what ``taskset`` or a
   cpuset allows), else ``os.cpu_count()``.

A CPU *limit* (CFS quota) without a request is covered by 1; a quota set outside Kubernetes (e.g.
``docker run --cpus``) is not read: pass ``threads_per_rank`` for that case.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Environment variable holding the container's CPU request in millicores (downward API).
CPU_REQUEST_ENV = "TRAINFLOW_CPU_REQUEST_MILLICORES"


def usable_cpus(environ: Mapping[str, str] | None = None) -> int:
    """Whole CPUs this process may use (the module docstring's rule); always >= 1.

    A malformed :data:`CPU_REQUEST_ENV` value is ignored (the affinity mask decides): the variable
    is set by the renderer, never by a user.
    """
    environ = os.environ if environ is None else environ
    try:
        millicores = int(environ.get(CPU_REQUEST_ENV, "") or 0)
    except ValueError:
        millicores = 0
    if millicores > 0:
        return max(1, millicores // 1000)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def threads_per_rank(local_world_size: int, environ: Mapping[str, str] | None = None) -> int:
    """torch intra-op threads for each of ``local_world_size`` ranks sharing this pod or machine:
    ``usable_cpus() // local_world_size``, at least 1."""
    return max(1, usable_cpus(environ) // max(1, local_world_size))
