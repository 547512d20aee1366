"""Vocabulary every part of trainflow may import (components, airflow_bridge, gpu_scheduler).

Pure standard-library code only — no third-party package and no other trainflow part — so that the
three parts stay independent (pyproject's import-linter contracts) while a rule such as "how a
dataset's listing is fingerprinted" has exactly one home.
"""
