"""A local Kubeflow Pipelines API server for development: ``trainflow kfp-server --port N``.

One process serves the KFP REST API v2beta1 endpoints that clients use (pipelines and versions
upload, experiments, runs create/get/list/terminate/delete) and executes each run with
``kfp.local`` (``SubprocessRunner(use_venv=False)``) in a child process of its own process group,
so a laptop can go Airflow UI -> trigger -> pipeline run -> succeeded with no Kubernetes.

Request and response shapes follow the real API (``backend/api/v2beta1/*.proto`` in
kubeflow/pipelines); the tests check them with the ``kfp-server-api`` package's models and with
``kfp.Client`` itself.

Modules:
    spec: compiled pipeline documents, root parameters and their coercion (pure).
    filters: the v2beta1 ``Filter`` (predicates) parser and evaluator (pure).
    store: objects in API shape, kept in memory and mirrored to ``<data_dir>/state.json``.
    runner: one child process per run, its state machine, terminate by process group.
    execute: the child's entry point (``python -m trainflow.kfp_server.execute``), imports kfp.
    app: the FastAPI application.
"""

from trainflow.kfp_server.app import create_app, serve

__all__ = ["create_app", "serve"]
