"""Hooks for the Kubeflow Pipelines REST API v2beta1 (sync and async)."""

from airflow_bridge.hooks.config import CONN_TYPE, DEFAULT_CONN_ID, AuthMode, KfpConnectionConfig
from airflow_bridge.hooks.kfp import KfpAsyncHook, KfpHook, KfpRunsApi

__all__ = [
    "CONN_TYPE",
    "DEFAULT_CONN_ID",
    "AuthMode",
    "KfpAsyncHook",
    "KfpConnectionConfig",
    "KfpHook",
    "KfpRunsApi",
]
