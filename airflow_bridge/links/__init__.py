"""Operator extra links."""

from airflow_bridge.links.kfp import KfpRunLink

__all__ = ["KfpRunLink"]
