"""ModelRegistry: versions with lineage, create-only version claims, current pointer, rollback.
Runs on a local folder and on S3 (MinIO on 127.0.0.1)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from components.registry.store import MODEL_FILES, ModelRegistry, RegistryError
from trainflow.storage.local import LocalStorage


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def registry(request, tmp_path) -> ModelRegistry:
    if request.param == "local":
        return ModelRegistry(LocalStorage(str(tmp_path / "models")))
    from trainflow.storage.s3 import S3Settings, S3Storage

    s3 = request.getfixturevalue("s3_server")
    settings = S3Settings(endpoint_url=s3.endpoint_url, access_key=s3.access_key, secret_key=s3.secret_key)
    return ModelRegistry(S3Storage(f"s3://{s3.make_bucket()}/models", settings))


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "exported"
    d.mkdir()
    (d / "model.pt").write_bytes(b"weights")
    (d / "model.json").write_text(json.dumps({"model": "small_cnn"}))
    return d


def test_register_list_current_rollback(registry, model_dir, tmp_path) -> None:
    v1 = registry.register(
        "mnist-classifier", model_dir, {"dataset_fingerprint": "abc", "metrics": {"test_accuracy": 0.97}}
    )
    (model_dir / "model.pt").write_bytes(b"better weights")
    v2 = registry.register(
        "mnist-classifier", model_dir, {"dataset_fingerprint": "abc", "metrics": {"test_accuracy": 0.98}}
    )
    assert (v1.version, v2.version) == (1, 2)
    assert [v.version for v in registry.versions("mnist-classifier")] == [1, 2]
    assert registry.current("mnist-classifier").version == 2
    assert registry.rollback("mnist-classifier", 1).version == 1
    assert registry.current("mnist-classifier").version == 1
    assert [h["reason"] for h in registry.history("mnist-classifier")] == [
        "registered",
        "registered",
        "rollback",
    ]
    out = registry.download("mnist-classifier", 1, tmp_path / "dl")
    assert (out / "model.pt").read_bytes() == b"weights"
    assert registry.get("mnist-classifier", 2).lineage["metrics"]["test_accuracy"] == 0.98


def test_concurrent_registrations_get_distinct_versions(registry, model_dir) -> None:
    with ThreadPoolExecutor(4) as pool:
        versions = list(
            pool.map(lambda _: registry.register("m", model_dir, {}, promote=False).version, range(4))
        )
    assert sorted(versions) == [1, 2, 3, 4]


def test_errors(registry, model_dir, tmp_path) -> None:
    with pytest.raises(RegistryError, match="model name 'Bad Name' must match"):
        registry.register("Bad Name", model_dir, {})
    with pytest.raises(RegistryError, match="has no version 7"):
        registry.rollback("m", 7)
    with pytest.raises(RegistryError, match="is not an exported model"):
        registry.register("m", tmp_path, {})
    assert registry.current("never-registered") is None


def test_concurrent_promotions_all_land_in_the_history(registry, model_dir) -> None:
    """Review finding 12: CURRENT.json was a read-modify-write; two promotions at once lost one."""
    versions = [registry.register("race", model_dir, {}, promote=False).version for _ in range(6)]
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda v: registry.rollback("race", v), versions))
    history = registry.history("race")
    assert sorted(h["version"] for h in history) == versions
    assert registry.current("race").version == history[-1]["version"]


def test_a_retried_registration_returns_the_first_attempts_version(registry, model_dir) -> None:
    """Review finding 12: register was not idempotent across retries (a KFP retry of register_model)."""
    first = registry.register("idem", model_dir, {"job_key": "j"}, idempotency_key="job-j")
    again = registry.register("idem", model_dir, {"job_key": "j"}, idempotency_key="job-j")
    assert again.version == first.version == 1
    assert [h["version"] for h in registry.history("idem")] == [1]  # promoted once
    # An attempt that died after recording its version but before VERSION.json: the retry finishes it.
    (model_dir / "model.pt").write_bytes(b"retrained weights")
    version = registry._version_for("idem", "job-j", {
        f: {"size_bytes": len((model_dir / f).read_bytes()),
            "sha256": __import__("hashlib").sha256((model_dir / f).read_bytes()).hexdigest()} for f in MODEL_FILES})
    assert registry.versions("idem")[-1].version == 1  # nothing committed yet for it
    finished = registry.register("idem", model_dir, {"job_key": "j"}, idempotency_key="job-j")
    assert finished.version == version == 2 and registry.current("idem").version == 2
    with ThreadPoolExecutor(4) as pool:  # the same registration, concurrently: one version
        got = set(pool.map(lambda _: registry.register("idem", model_dir, {}, idempotency_key="job-k").version,
                           range(4)))
    assert len(got) == 1
