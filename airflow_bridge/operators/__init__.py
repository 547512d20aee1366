"""Operators."""

from airflow_bridge.operators.kfp import KfpRunPipelineOperator

__all__ = ["KfpRunPipelineOperator"]
