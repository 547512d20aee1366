"""The only module that knows which Airflow version is installed; everything else imports from here.

The bridge targets Airflow 3.3 (``airflow.sdk``; ``BaseTrigger.on_kill`` and the task state store
are 3.3 features). On an older Airflow 3 it still imports, but ``on_kill`` of deferred tasks is
never called and the state store is absent (the run lookup by task key still prevents
duplicates). Airflow 2 is refused with a one-line error.
"""

from __future__ import annotations

from typing import Any

from airflow import __version__ as AIRFLOW_VERSION
from packaging.version import Version

_BASE_VERSION = Version(Version(AIRFLOW_VERSION).base_version)

if Version("3.0.0") > _BASE_VERSION:  # pragma: no cover - the airflow extra pins >=3.3
    raise ImportError(f"airflow_bridge needs Airflow 3 (installed: {AIRFLOW_VERSION})")

AIRFLOW_V_3_3_PLUS: bool = Version("3.3.0") <= _BASE_VERSION

from airflow.sdk import (  # noqa: E402
    Asset,
    BaseHook,
    BaseOperator,
    BaseOperatorLink,
    BaseSensorOperator,
    Context,
)
from airflow.sdk._shared.secrets_masker import redact  # noqa: E402 - the path Airflow 3.3 names
from airflow.sdk.configuration import conf  # noqa: E402
from airflow.sdk.exceptions import (  # noqa: E402
    AirflowFailException,
    AirflowNotFoundException,
    AirflowSensorTimeout,
    AirflowSkipException,
)
from airflow.sdk.execution_time.xcom import XCom  # noqa: E402
from airflow.triggers.base import BaseTrigger, TriggerEvent  # noqa: E402


async def task_instance_is_deferred(ti: Any) -> bool:
    """Whether Airflow still has the task instance ``ti`` (a trigger's ``task_instance``) DEFERRED.

    Read through the triggerer's supervisor channel, as the standard provider's ``WorkflowTrigger``
    reads task states (``RuntimeTaskInstance.get_ti_count`` in a thread: ``sync_to_async``).

    Raises:
        Exception: whatever the read raises (e.g. ``RuntimeError``/``AttributeError`` outside a
            triggerer, where there is no supervisor channel; an API error from the supervisor).
    """
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from asgiref.sync import sync_to_async

    count = await sync_to_async(RuntimeTaskInstance.get_ti_count)(
        dag_id=ti.dag_id,
        task_ids=[ti.task_id],
        run_ids=[ti.run_id],
        map_index=ti.map_index,
        states=["deferred"],
    )
    return int(count) > 0


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` from the Airflow configuration (False if unset)."""
    return conf.getboolean("operators", "default_deferrable", fallback=False)


__all__ = [
    "AIRFLOW_VERSION",
    "AIRFLOW_V_3_3_PLUS",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "Asset",
    "BaseHook",
    "BaseOperator",
    "BaseOperatorLink",
    "BaseSensorOperator",
    "BaseTrigger",
    "Context",
    "TriggerEvent",
    "XCom",
    "conf",
    "default_deferrable",
    "redact",
    "task_instance_is_deferred",
]
