"""Pure scheduling policies, registered by name.

Every policy implements :class:`~gpu_scheduler.policies.base.Policy`
(``decide(snapshot, now_s) -> Decision``); :func:`create` builds one by name. Importing this
package registers every built-in policy.
"""

from gpu_scheduler.policies.base import Policy, UnknownPolicy, create, describe, names, parse_params, register
from gpu_scheduler.policies.placement import FreeGpus, Strategy

__all__ = [
    "FreeGpus",
    "Policy",
    "Strategy",
    "UnknownPolicy",
    "create",
    "describe",
    "names",
    "parse_params",
    "register",
]

# Register the built-in policies.
from gpu_scheduler.policies import default, fifo, optimus, pollux, round_robin, sia, tiresias  # noqa: F401
