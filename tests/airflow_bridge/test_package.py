"""package: compiled pipeline files read without kfp; parameters and their conversion (pure).

Uses pipelines compiled by kfp in the session fixture ``compiled_pipelines``.
"""

from __future__ import annotations

import json
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from airflow_bridge.exceptions import KfpPackageError
from airflow_bridge.package import load_pipeline_package


def test_parameters_are_read_with_types_and_defaults(compiled_pipelines: dict[str, Path]) -> None:
    package = load_pipeline_package(compiled_pipelines["training_pipeline"])
    params = package.parameters
    assert {"dataset_source", "model_name", "epochs", "global_batch_size", "job_key", "backend"} <= set(
        params
    )
    assert params["epochs"].parameter_type == "NUMBER_INTEGER" and params["epochs"].default == 2
    assert isinstance(params["epochs"].default, int)
    assert params["learning_rate"].json_schema_type == "number"
    assert params["job_key"].default == "" and params["job_key"].optional


def test_template_strings_are_converted_to_declared_types(compiled_pipelines: dict[str, Path]) -> None:
    package = load_pipeline_package(compiled_pipelines["training_pipeline"])
    args = package.prepare_arguments({"epochs": "3", "learning_rate": "0.5", "dataset_source": "mnist"})
    assert args == {"epochs": 3, "learning_rate": 0.5, "dataset_source": "mnist"}
    assert package.parameters["adaptive_batch"].parameter_type == "BOOLEAN"
    # What Airflow renders from a boolean Param ("{{ params['adaptive_batch'] }}") comes back a bool.
    for rendered, value in (("False", False), ("True", True), ("true", True), ("0", False)):
        assert package.prepare_arguments({"adaptive_batch": rendered}) == {"adaptive_batch": value}
    with pytest.raises(KfpPackageError, match="parameter 'adaptive_batch' expects BOOLEAN, got 'maybe'"):
        package.prepare_arguments({"adaptive_batch": "maybe"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            {"epoch": 3},
            "pipeline 'training-pipeline' has no parameter(s) epoch; it declares: adaptive_batch, backend",
        ),
        ({"epochs": "three"}, "parameter 'epochs' expects NUMBER_INTEGER, got 'three'"),
        ({"epochs": 2.5}, "parameter 'epochs' expects NUMBER_INTEGER, got 2.5"),
    ],
)
def test_bad_arguments_fail_with_one_line(compiled_pipelines, args: dict, message: str) -> None:
    package = load_pipeline_package(compiled_pipelines["training_pipeline"])
    with pytest.raises(KfpPackageError) as info:
        package.prepare_arguments(args)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_platform_document_is_sent_beside_the_spec(compiled_pipelines: dict[str, Path]) -> None:
    package = load_pipeline_package(compiled_pipelines["platform"])
    assert package.platform_spec and "platforms" in package.platform_spec
    body = package.api_pipeline_spec()
    assert set(body) == {"pipeline_spec", "platform_spec"}
    assert (
        load_pipeline_package(compiled_pipelines["tiny"]).api_pipeline_spec()["pipelineInfo"]["name"]
        == "tiny"
    )


def test_caching_override_rewrites_every_root_task(compiled_pipelines: dict[str, Path]) -> None:
    package = load_pipeline_package(compiled_pipelines["tiny"])
    spec = package.api_pipeline_spec(enable_caching=False)
    flags = [t["cachingOptions"]["enableCache"] for t in spec["root"]["dag"]["tasks"].values()]
    assert flags == [False, False]
    assert package.pipeline_spec["root"]["dag"]["tasks"]["add"]["cachingOptions"]["enableCache"] is True


def test_caching_override_reaches_the_tasks_inside_a_condition(tmp_path: Path) -> None:
    """kfp's client rewrites the root DAG only; a step inside a dsl.If (the retraining pipeline's
    dataset step) would keep its compiled cache setting."""
    spec = {
        "pipelineInfo": {"name": "conditional"},
        "root": {"dag": {"tasks": {"check": {"cachingOptions": {"enableCache": True}},
                                   "condition-1": {"componentRef": {"name": "comp-condition-1"}}}}},
        "components": {"comp-condition-1": {"dag": {"tasks": {"prepare": {"cachingOptions": {"enableCache": True}},
                                                              "train": {}}}},
                       "comp-check": {"executorLabel": "exec-check"}},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    body = load_pipeline_package(tmp_path / "p.yaml").api_pipeline_spec(enable_caching=False)
    inner = body["components"]["comp-condition-1"]["dag"]["tasks"]
    assert inner["prepare"]["cachingOptions"]["enableCache"] is False
    assert inner["train"]["cachingOptions"]["enableCache"] is False
    assert body["root"]["dag"]["tasks"]["check"]["cachingOptions"]["enableCache"] is False


def test_uncached_tasks_are_the_steps_compiled_not_to_cache(tmp_path: Path, training_pipeline_package: Path) -> None:
    """Steps in sub-DAGs count, the condition task itself does not; trainflow's own pipeline
    compiles every step but evaluate uncached."""
    spec = {
        "pipelineInfo": {"name": "conditional"},
        "root": {"dag": {"tasks": {"check": {"cachingOptions": {"enableCache": True}},
                                   "condition-1": {"componentRef": {"name": "comp-condition-1"}}}}},
        "components": {"comp-condition-1": {"dag": {"tasks": {"prepare": {"cachingOptions": {"enableCache": True}},
                                                              "train": {"cachingOptions": {}}}}},
                       "comp-check": {"executorLabel": "exec-check"}},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    assert load_pipeline_package(tmp_path / "p.yaml").uncached_tasks() == ["train"]
    training = load_pipeline_package(training_pipeline_package)
    assert sorted(training.uncached_tasks()) == ["prepare-dataset", "register-model", "train"]


def test_archives_and_json_are_read_like_kfp(tmp_path: Path, compiled_pipelines: dict[str, Path]) -> None:
    src = compiled_pipelines["tiny"]
    with tarfile.open(tmp_path / "p.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="pipeline.yaml")
    with zipfile.ZipFile(tmp_path / "p.zip", "w") as archive:
        archive.write(src, arcname="only.yaml")
    (tmp_path / "p.json").write_text(json.dumps(yaml.safe_load(src.read_text())))
    for name in ("p.tar.gz", "p.zip", "p.json"):
        assert load_pipeline_package(tmp_path / name).name == "tiny"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.yaml", None, "does not exist"),
        ("p.txt", "x: 1", "ends in .yaml, .yml, .json"),
        ("p.yaml", "components: {}", "not a compiled KFP v2 pipeline"),
        ("p.yaml", "a: [", "not valid YAML"),
    ],
)
def test_unusable_packages_are_refused(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(KfpPackageError, match=message):
        load_pipeline_package(tmp_path / name)


def test_an_empty_secret_name_for_a_package_compiled_with_the_secret_is_refused() -> None:
    """Review 2026-11-30: a package compiled with TRAINFLOW_S3_SECRET wires s3_secret_name into every
    task's secretKeyRef; an empty value (an Airflow Variable set to "") gave pods that Kubernetes
    refuses (secretKeyRef.name required), every task failing before it started, with an opaque error."""
    from airflow_bridge.package import PipelinePackage

    spec = {"pipelineInfo": {"name": "training-pipeline"},
            "root": {"inputDefinitions": {"parameters": {
                "s3_secret_name": {"parameterType": "STRING", "defaultValue": "s3creds", "isOptional": True},
                "epochs": {"parameterType": "NUMBER_INTEGER", "defaultValue": 2, "isOptional": True}}}}}
    platform = {"platforms": {"kubernetes": {"deploymentSpec": {"executors": {"exec-train": {"secretAsEnv": [
        {"keyToEnv": [{"envVar": "AWS_ACCESS_KEY_ID", "secretKey": "AWS_ACCESS_KEY_ID"}], "optional": True,
         "secretNameParameter": {"componentInputParameter": "s3_secret_name"}}]}}}}}}
    package = PipelinePackage(spec, platform)
    assert package.secret_name_parameters() == {"s3_secret_name"}
    assert package.prepare_arguments({"epochs": "3"}) == {"epochs": 3}  # the compiled default stands
    assert package.prepare_arguments({"s3_secret_name": "team-a-s3"}) == {"s3_secret_name": "team-a-s3"}
    with pytest.raises(KfpPackageError, match=r"^pipeline 'training-pipeline': parameter 's3_secret_name' names "
                                              r"the Kubernetes Secret .* cannot be empty") as info:
        package.prepare_arguments({"s3_secret_name": ""})
    assert "\n" not in str(info.value)
    assert PipelinePackage(spec).prepare_arguments({"s3_secret_name": ""}) == {"s3_secret_name": ""}  # no Secret wired
