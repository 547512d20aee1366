"""retraining_pipeline under kfp.local on a real ImageFolder of MNIST digits.

1. empty registry: the drift check says ``no-reference``, the model is trained and registered, with
   the listing fingerprint, the triggering change and a data profile;
2. the same folder again: ``unchanged`` — nothing is trained or registered;
3. the folder's images inverted: ``drift``; the retrained model beats the current one on the new
   held-out split and becomes version 2 (the old version stays in the registry).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.drift.profile import PROFILE_FILE
from components.registry.store import ModelRegistry
from components.training.sources import load_mnist_5k
from trainflow.common.listing import list_folder, listing_fingerprint
from trainflow.storage.local import LocalStorage


def _outcome(outputs) -> tuple[str, bool]:
    verdict = json.loads(Path(outputs["verdict"].path).read_text())
    assert verdict["retrain"] == outputs["retrain"]
    assert outputs["verdict"].metadata["listing_fingerprint"] == verdict["new"]["listing_fingerprint"]
    return verdict["decision"], outputs["retrain"]


def _write(root, images, labels) -> None:
    for i, (img, lbl) in enumerate(zip(images, labels, strict=True)):
        (root / str(lbl)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(img[0]).save(root / str(lbl) / f"{i:05d}.png")


@pytest.mark.slow
def test_retraining_pipeline_decides_trains_and_registers(tmp_path, monkeypatch) -> None:
    from kfp import local

    from pipelines.retraining import retraining_pipeline

    images, labels = load_mnist_5k()
    ids = np.random.default_rng(0).permutation(len(images))[:600]
    data = tmp_path / "data"
    _write(data, images[ids], labels[ids])
    registry_uri = str(tmp_path / "models")
    monkeypatch.setenv("TRAINFLOW_LOG_DIR", str(tmp_path / "logs"))
    (tmp_path / "logs").mkdir()
    (tmp_path / "tmp").mkdir()  # each component's command writes its code to a `mktemp -d` it never removes
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    warnings.filterwarnings("ignore", module=r"kfp\.local.*")
    (tmp_path / "workspace").mkdir()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"),
               workspace_root=str(tmp_path / "workspace"), raise_on_error=True)
    args = dict(dataset_source=str(data), registry_uri=registry_uri, registered_model_name="digits", image_size=28,
                channels=1, epochs=3, global_batch_size=32, learning_rate=0.05, nproc_per_node=1,
                checkpoint_uri=str(tmp_path / "ckpt"), checkpoint_interval_steps=0)
    registry = ModelRegistry(LocalStorage(registry_uri))

    change = {"listing_fingerprint": listing_fingerprint(list_folder(data)), "change": {"added": 600}}
    first = retraining_pipeline(**args, dataset_change=json.dumps(change), job_key="first").outputs
    assert _outcome(first) == ("no-reference", True)
    v1 = registry.current("digits")
    assert v1 is not None and v1.version == 1 and PROFILE_FILE in v1.files
    assert v1.lineage["dataset"]["listing_fingerprint"] == change["listing_fingerprint"]
    assert v1.lineage["dataset"]["change"] == change and v1.lineage["dataset"]["source"] == str(data)
    assert first["model_version"] == 1 and first["test_accuracy"] == v1.lineage["metrics"]["test_accuracy"]
    assert first["verdict"].metadata["listing_fingerprint"] == change["listing_fingerprint"]

    again = retraining_pipeline(**args, job_key="again").outputs
    assert _outcome(again) == ("unchanged", False)
    assert [v.version for v in registry.versions("digits")] == [1]
    assert (again["model_version"], again["test_accuracy"]) == (0, 0.0)  # the "no retraining" branch

    for path in data.rglob("*.png"):
        Image.fromarray(255 - np.asarray(Image.open(path))).save(path)
    shifted = retraining_pipeline(**args, job_key="shifted").outputs
    assert _outcome(shifted) == ("drift", True)
    v2 = registry.current("digits")
    assert v2.version == 2 and v2.lineage["metrics"]["test_accuracy"] > v2.lineage["previous_version_accuracy"]
    assert shifted["model_version"] == 2
    assert os.path.isdir(tmp_path / "models" / "digits" / "v000001")  # the old version stays


def test_compiled_for_kubeflow_the_s3_secret_reaches_every_step_and_the_workers(tmp_path) -> None:
    """As ``training_pipeline``: with a Secret in the compile-time settings, every task pod (the drift
    check too) gets its keys as AWS_* variables, the Secret's name is the ``s3_secret_name``
    parameter, the key names reach the train step for the workers, and the namespace is the run's own."""
    import yaml
    from kfp import compiler

    from pipelines.platform import PlatformSettings
    from pipelines.retraining import build_retraining_pipeline

    out = tmp_path / "retraining.yaml"
    settings = PlatformSettings(s3_secret="mlpipeline-minio-artifact", s3_access_key_key="accesskey",
                                s3_secret_key_key="secretkey")
    compiler.Compiler().compile(build_retraining_pipeline(settings), str(out))
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-drift-check", "exec-prepare-dataset", "exec-train", "exec-evaluate",
                              "exec-register-model"}
    for name, config in executors.items():
        (wiring,) = config["secretAsEnv"]
        # inside the dsl.If, KFP passes the root parameter into the sub-DAG as a pipeline channel
        parameter = "s3_secret_name" if name == "exec-drift-check" else "pipelinechannel--s3_secret_name"
        assert wiring["secretNameParameter"] == {"componentInputParameter": parameter}, name
        assert {(m["secretKey"], m["envVar"]) for m in wiring["keyToEnv"]} >= {
            ("accesskey", "AWS_ACCESS_KEY_ID"), ("secretkey", "AWS_SECRET_ACCESS_KEY")}
    # the dataset step is never cached (a retrain runs because the data changed under the same name)
    condition = next(c for c in spec["components"].values() if "prepare-dataset" in c.get("dag", {}).get("tasks", {}))
    assert condition["dag"]["tasks"]["prepare-dataset"]["cachingOptions"] == {}
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["s3_secret_name"]["defaultValue"] == "mlpipeline-minio-artifact"
    assert params["namespace"]["defaultValue"] == ""


def test_compiled_with_an_endpoint_key_the_train_step_passes_it_to_the_workers(tmp_path) -> None:
    """As ``training_pipeline``: the Secret's endpoint key (``TRAINFLOW_S3_ENDPOINT_KEY`` /
    ``--s3-endpoint-key``) reaches the train step, which gives it to the workers."""
    import yaml
    from kfp import compiler

    from pipelines.platform import PlatformSettings
    from pipelines.retraining import build_retraining_pipeline

    out = tmp_path / "retraining.yaml"
    settings = PlatformSettings.from_env({"TRAINFLOW_S3_SECRET": "minio-creds", "TRAINFLOW_S3_ENDPOINT_KEY": "endpoint"})
    compiler.Compiler().compile(build_retraining_pipeline(settings), str(out))
    spec, platform = list(yaml.safe_load_all(out.read_text()))
    for name, config in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        (wiring,) = config["secretAsEnv"]
        assert ("endpoint", "AWS_ENDPOINT_URL_S3") in {(m["secretKey"], m["envVar"]) for m in wiring["keyToEnv"]}, name
    (train,) = [dag["tasks"]["train"]["inputs"]["parameters"] for dag in
                (c.get("dag", {}) for c in spec["components"].values()) if "train" in dag.get("tasks", {})]
    assert train["s3_endpoint_key"] == {"runtimeValue": {"constant": "endpoint"}}
    assert train["s3_endpoint_url"] == {"componentInputParameter": "pipelinechannel--s3_endpoint_url"}


def test_retraining_train_parameters_have_the_components_defaults() -> None:
    """One home per parameter: each retraining pipeline parameter that the train step takes has the
    train component's default (``epochs`` and ``checkpoint_interval_steps`` are pipeline demo
    defaults, as in ``training_pipeline``)."""
    import inspect

    from components.specs import train
    from pipelines.platform import PlatformSettings
    from pipelines.retraining import build_retraining_pipeline

    component = inspect.signature(train.python_func).parameters
    pipeline = inspect.signature(build_retraining_pipeline(PlatformSettings()).pipeline_func).parameters
    shared = [name for name in pipeline if name in component and name not in ("epochs", "checkpoint_interval_steps")]
    assert "namespace" in shared and "s3_secret_name" in shared
    # a GPU pool's tolerations and node selector, and the workers' CPU and memory, can be set
    assert {"worker_pod_settings", "worker_cpu", "worker_memory", "gpus_per_worker"} <= set(shared)
    for name in shared:
        assert pipeline[name].default == component[name].default, name
