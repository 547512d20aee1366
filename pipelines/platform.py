"""Compile-time settings of the pipeline for a Kubernetes platform (kfp-kubernetes), in one place.

What the compiled YAML must carry because KFP fixes it before a run starts: which Secret's keys
become which environment variables of the task pods. A run can still pick another Secret (the
``s3_secret_name`` pipeline parameter feeds the wiring), but not other key names.

Set them with ``trainflow compile --s3-secret NAME [--s3-access-key-key K ...]`` or, for
``kfp dsl compile``, with the environment variables in :data:`ENV` (read when ``pipelines.training``
is imported). Without ``s3_secret`` the pipeline has no kfp-kubernetes settings at all (the laptop
default: ``kfp.local`` ignores them anyway).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainflow.common.training_spec import ROWS

#: Environment variable → field of :class:`PlatformSettings`.
ENV = {
    "TRAINFLOW_S3_SECRET": "s3_secret",
    "TRAINFLOW_S3_ACCESS_KEY_KEY": "s3_access_key_key",
    "TRAINFLOW_S3_SECRET_KEY_KEY": "s3_secret_key_key",
    "TRAINFLOW_S3_ENDPOINT_KEY": "s3_endpoint_key",
    "TRAINFLOW_KFP_BACKEND_VERSION": "kfp_backend_version",
}

#: The first KFP backend whose platform proto has ``SecretAsEnv.optional`` (kfp-kubernetes 2.15.0 added
#: the field; a 2.14 API server refuses a run carrying it: ``unknown field "optional"``), and the
#: kfp-kubernetes SDK this project locks always writes it.
SECRET_OPTIONAL_SINCE = (2, 15)
#: The oldest KFP backend the pipelines run on: before 2.5 the driver resolves neither the run-id and
#: task placeholders the train step names its job and checkpoint key by (``{{$.pipeline_job_uuid}}``,
#: ``{{$.pipeline_task_name}}``, ``{{$.pipeline_task_uuid}}``) nor ``set_retry``, and its platform proto
#: lacks ``SecretAsEnv.secretNameParameter``, which kfp-kubernetes writes (kubeflow/pipelines#11935:
#: ``unknown field "secretNameParameter"``). Kubeflow 1.10.1 is the first release that ships 2.5.
MIN_KFP_BACKEND = (2, 5)


@dataclass(frozen=True, kw_only=True)
class PlatformSettings:
    """How the pipeline's task pods (and, through the train step, the PyTorchJob's workers) get S3
    credentials.

    Attributes:
        s3_secret: default name of the Secret holding them, in the namespace runs execute in (the
            ``s3_secret_name`` parameter's default); empty: no Secret wiring.
        s3_access_key_key: the Secret's key holding the access key id (KFP's own
            ``mlpipeline-minio-artifact`` Secret: ``accesskey``).
        s3_secret_key_key: the Secret's key holding the secret access key (KFP: ``secretkey``).
        s3_endpoint_key: the Secret's optional key holding the endpoint URL (``AWS_ENDPOINT_URL_S3``;
            used where the ``s3_endpoint_url`` parameter is empty): the task pods' and, through the
            train step, the workers'.
        kfp_backend_version: the KFP backend the package is for, ``"2.14"`` or ``"2.14.3"``; empty: a
            current one (>= 2.15). At least :data:`MIN_KFP_BACKEND` (2.5). Before 2.15 the wiring cannot be ``optional``
            (:data:`SECRET_OPTIONAL_SINCE`): the access and secret keys are then *required* (a
            missing Secret holds the pod in ``CreateContainerConfigError``, which KFP does not fail),
            and the endpoint key is not wired into the task pods (give the ``s3_endpoint_url``
            parameter instead).

    Raises:
        ValueError: a key name is empty, or ``kfp_backend_version`` is not ``MAJOR.MINOR[.PATCH]`` or
            is older than :data:`MIN_KFP_BACKEND`.
    """

    s3_secret: str = ""
    # The key names' defaults are the train component's (rows of trainflow/common/training_spec.py).
    s3_access_key_key: str = ROWS["s3_access_key_key"].default
    s3_secret_key_key: str = ROWS["s3_secret_key_key"].default
    s3_endpoint_key: str = ROWS["s3_endpoint_key"].default
    kfp_backend_version: str = ""

    def __post_init__(self) -> None:
        for name in ("s3_access_key_key", "s3_secret_key_key", "s3_endpoint_key"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        self.secret_optional  # noqa: B018 - validates kfp_backend_version

    @property
    def secret_optional(self) -> bool:
        """Whether the backend accepts ``SecretAsEnv.optional`` (see ``kfp_backend_version``)."""
        if not self.kfp_backend_version:
            return True
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", self.kfp_backend_version):
            raise ValueError(f"kfp_backend_version must be MAJOR.MINOR[.PATCH], e.g. 2.14, not {self.kfp_backend_version!r}")
        major, minor = (int(x) for x in self.kfp_backend_version.split(".")[:2])
        if (major, minor) < MIN_KFP_BACKEND:
            oldest = ".".join(map(str, MIN_KFP_BACKEND))
            raise ValueError(
                f"kfp_backend_version {self.kfp_backend_version}: trainflow's pipelines need a KFP backend >= "
                f"{oldest} (Kubeflow >= 1.10.1): older ones resolve neither the run and task placeholders the "
                f"train step names its job by nor retries, and refuse the Secret wiring (secretNameParameter)")
        return (major, minor) >= SECRET_OPTIONAL_SINCE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PlatformSettings:
        env = os.environ if environ is None else environ
        return cls(**{field: env[var] for var, field in ENV.items() if env.get(var)})

    def apply(self, task: Any, secret_name: Any) -> Any:
        """Wire the Secret named by ``secret_name`` (a pipeline parameter) into ``task``'s environment:
        ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_ENDPOINT_URL_S3``.

        ``optional``: a missing Secret or key leaves the variable unset instead of holding the pod in
        ``CreateContainerConfigError`` (which KFP does not fail); the step then fails at once with
        one line naming the Secret (``components.training.step.check_storage``). For a backend
        before 2.15 (``kfp_backend_version``) the access and secret keys are required, the field is
        left out of the package, and the endpoint key is not wired.
        """
        if not self.s3_secret:
            return task
        from kfp import kubernetes

        key_to_env = {self.s3_access_key_key: "AWS_ACCESS_KEY_ID", self.s3_secret_key_key: "AWS_SECRET_ACCESS_KEY"}
        if self.secret_optional:
            key_to_env[self.s3_endpoint_key] = "AWS_ENDPOINT_URL_S3"
        task = kubernetes.use_secret_as_env(
            task, secret_name=secret_name, secret_key_to_env=key_to_env, optional=self.secret_optional
        )
        if not self.secret_optional:
            # kfp-kubernetes >= 2.15 writes the field even when False; an older API server refuses it.
            for wiring in task.platform_config["kubernetes"]["secretAsEnv"]:
                wiring.pop("optional", None)
        return task
