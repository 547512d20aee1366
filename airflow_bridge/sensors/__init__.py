"""Sensors."""

from airflow_bridge.sensors.kfp import KfpRunSensor

__all__ = ["KfpRunSensor"]
