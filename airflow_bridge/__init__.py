"""Airflow 3 provider for Kubeflow Pipelines (REST v2beta1; never imports kfp or torch).

Pieces (one job each):

* :class:`airflow_bridge.hooks.KfpHook` / :class:`~airflow_bridge.hooks.KfpAsyncHook` -- REST client
  for a ``kubeflow_pipelines`` connection;
* :class:`airflow_bridge.operators.KfpRunPipelineOperator` -- submit (or reattach to) a run, wait in
  the worker or the triggerer, terminate on kill;
* :class:`airflow_bridge.triggers.KfpRunTrigger` -- the deferrable wait, one event;
* :class:`airflow_bridge.sensors.KfpRunSensor` -- wait on an existing run id;
* :class:`airflow_bridge.links.KfpRunLink` -- "Kubeflow Pipelines run" button on the task page;
* :mod:`airflow_bridge.events` -- run states and the event payload, shared by all of them.

This module stays import-light: Airflow's providers manager imports it through the
``apache_airflow_provider`` entry point to read :func:`get_provider_info`.
"""

from __future__ import annotations

from typing import Any

CONNECTION_TYPE = "kubeflow_pipelines"


def _string(label: str, description: str, **schema: Any) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"], **schema}}


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point.

    ``connection-types`` declares the ``kubeflow_pipelines`` connection form (Airflow 3
    ``conn-fields`` / ``ui-field-behaviour``), so the UI renders it without importing the hook.
    """
    return {
        "package-name": "trainflow",
        "name": "trainflow Kubeflow Pipelines",
        "description": "Run Kubeflow Pipelines from Airflow: hook, deferrable operator, trigger, sensor, link.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Kubeflow Pipelines",
                "external-doc-url": "https://www.kubeflow.org/docs/components/pipelines/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "Kubeflow Pipelines", "python-modules": ["airflow_bridge.operators.kfp"]}
        ],
        "sensors": [
            {"integration-name": "Kubeflow Pipelines", "python-modules": ["airflow_bridge.sensors.kfp"]}
        ],
        "hooks": [{"integration-name": "Kubeflow Pipelines", "python-modules": ["airflow_bridge.hooks.kfp"]}],
        "triggers": [
            {"integration-name": "Kubeflow Pipelines", "python-modules": ["airflow_bridge.triggers.kfp"]}
        ],
        "extra-links": ["airflow_bridge.links.kfp.KfpRunLink"],
        "connection-types": [
            {
                "hook-class-name": "airflow_bridge.hooks.kfp.KfpHook",
                "hook-name": "Kubeflow Pipelines",
                "connection-type": CONNECTION_TYPE,
                "conn-fields": {
                    "ui_url": _string(
                        "KFP UI URL",
                        "Base URL of the KFP UI for run links (default: the API URL, which serves no UI "
                        "when it is an in-cluster *.svc address), or a pattern with "
                        "{run_id} and {namespace}, e.g. https://kf.example.com/_/pipeline/?ns={namespace}"
                        "#/runs/details/{run_id}",
                    ),
                    "namespace": _string(
                        "Namespace", "Kubeflow profile namespace (multi-user Kubeflow only)"
                    ),
                    "auth_mode": {
                        "label": "Auth mode",
                        "description": "empty: bearer_token when Password holds a token, else none; "
                        "none; bearer_token (token in Password); sa_token_file (projected ServiceAccount "
                        "token, re-read on every request). none with a token in Password is refused",
                        # no default: a stored "none" would override a token typed into Password
                        "schema": {
                            "type": ["string", "null"],
                            "enum": ["none", "bearer_token", "sa_token_file", None],
                        },
                    },
                    "sa_token_path": _string(
                        "Service-account token file",
                        "Path of the projected token (audience pipelines.kubeflow.org); it must lie "
                        "under a folder of [kubeflow_pipelines] sa_token_dirs (default /var/run/secrets)",
                        default="/var/run/secrets/kubeflow/pipelines/token",
                    ),
                    "verify_ssl": {
                        "label": "Verify TLS",
                        "description": "Verify the API's TLS certificate",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                    "ca_bundle_path": _string("CA bundle", "CA bundle file for TLS verification"),
                    "default_experiment": _string(
                        "Default experiment", "Experiment for runs that name none", default="Default"
                    ),
                    "request_timeout_s": {
                        "label": "Request timeout (s)",
                        "description": "Per-request timeout in seconds",
                        "schema": {"type": ["number", "null"], "default": 30},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port"],
                    "relabeling": {"host": "KFP API URL", "password": "Bearer token"},
                    "placeholders": {
                        "host": "http://127.0.0.1:8888 or https://kubeflow.example.com/pipeline",
                        "password": "only for auth mode bearer_token",
                    },
                },
            }
        ],
        "config": {
            "kubeflow_pipelines": {
                "description": "Settings of the trainflow Kubeflow Pipelines provider.",
                "options": {
                    "sa_token_dirs": {
                        "description": "Comma-separated folders a kubeflow_pipelines connection may read "
                        "its service-account token file from (auth mode sa_token_file). A connection "
                        "whose sa_token_path resolves elsewhere is refused, so whoever may edit "
                        "connections cannot send an arbitrary file of the worker as a bearer token.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "/var/run/secrets,/opt/tokens",
                        "default": "/var/run/secrets",
                    },
                },
            },
        },
    }
