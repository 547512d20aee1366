"""The "Kubeflow Pipelines run" extra link on the task page of the Airflow UI.

The link's URL lives in XCom under :attr:`KfpRunLink.XCOM_KEY`. The operator pushes it right after
it submits (or reattaches to) a run, so the button works while the task is still running or
deferred; Airflow's API server reads links from XCom (``XComOperatorLink``). At the end of the
task Airflow calls :meth:`KfpRunLink.get_link` and pushes its result under the same key, so
``get_link`` returns the stored URL rather than rebuilding it.
"""

from __future__ import annotations

from typing import Any

from airflow_bridge.version_compat import BaseOperatorLink, XCom


class KfpRunLink(BaseOperatorLink):
    """Link to the task's KFP run in the Kubeflow Pipelines UI."""

    name = "Kubeflow Pipelines run"
    XCOM_KEY = "kfp_run_url"

    @property
    def xcom_key(self) -> str:
        return self.XCOM_KEY

    @classmethod
    def persist(cls, context: Any, url: str) -> None:
        """Store the run URL for the current task instance (call right after submission)."""
        context["ti"].xcom_push(key=cls.XCOM_KEY, value=url)

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        """The stored URL, or ``""`` when the task never got as far as a run."""
        url = XCom.get_value(ti_key=ti_key, key=self.XCOM_KEY)
        return str(url) if url else ""
