"""Airflow 3 provider for Kubeflow Pipelines (REST v2beta1; never imports kfp or torch)."""


def get_provider_info() -> dict:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "trainflow",
        "name": "trainflow Kubeflow Pipelines",
        "description": "Run Kubeflow Pipelines from Airflow: hook, deferrable operator, trigger, sensor, link.",
        "versions": ["0.1.0"],
    }
