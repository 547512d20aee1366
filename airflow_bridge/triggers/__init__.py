"""Triggers."""

from airflow_bridge.triggers.kfp import KfpRunTrigger

__all__ = ["KfpRunTrigger"]
