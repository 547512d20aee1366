"""ModelRegistry: versions with lineage, create-only version claims, current pointer, rollback, and
promotion conditional on the version compared with. Runs on a local folder and on S3 (MinIO on 127.0.0.1)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from components.registry.promotion import Comparison, compare_with_current, promote_if_better
from components.registry.store import MODEL_FILES, ModelRegistry, Pointer, RegistryError
from trainflow.storage import ObjectWriteConflict, write_bytes
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


def _register_scored(registry: ModelRegistry, model_dir, name: str, accuracy: float, *, promote: bool) -> int:
    (model_dir / "model.pt").write_bytes(f"weights scoring {accuracy}".encode())
    lineage = {"metrics": {"test_accuracy": accuracy}}
    return registry.register(name, model_dir, lineage, promote=promote).version


@pytest.mark.parametrize("first_to_land", ["better", "worse"])
def test_interleaved_promotions_end_with_the_better_model_current(registry, model_dir, first_to_land) -> None:
    """Review: must_beat_current compared with the current version, then register appended its
    pointer entry unconditionally (a conflict went to the next sequence number). Runs A (0.95) and B
    (0.93) both compared with v1 (0.90) before either pointer entry landed: whichever landed last was
    current, so B could end current without ever beating A. Now each promotion lands only over the
    version it was compared with; the one that lost the race compares again and wins only if better."""
    name = "race"
    v1 = _register_scored(registry, model_dir, name, 0.90, promote=True)

    def score(version: int) -> float:  # the held-out evaluation, as recorded in the lineage
        return registry.get(name, version).lineage["metrics"]["test_accuracy"]

    a_compared = compare_with_current(registry, name, score)
    b_compared = compare_with_current(registry, name, score)  # before A's pointer entry lands
    assert a_compared == b_compared == Comparison(pointer=Pointer(seq=1, version=v1), accuracy=0.90)
    a = _register_scored(registry, model_dir, name, 0.95, promote=False)
    b = _register_scored(registry, model_dir, name, 0.93, promote=False)

    if first_to_land == "better":
        assert promote_if_better(registry, name, a, 0.95, a_compared, score) == (True, a_compared)
        promoted, last = promote_if_better(registry, name, b, 0.93, b_compared, score)
        assert not promoted and last.pointer == Pointer(seq=2, version=a) and last.accuracy == 0.95
        assert [h["version"] for h in registry.history(name)] == [v1, a]
    else:
        assert promote_if_better(registry, name, b, 0.93, b_compared, score) == (True, b_compared)
        promoted, last = promote_if_better(registry, name, a, 0.95, a_compared, score)
        assert promoted and last.pointer == Pointer(seq=2, version=b) and last.accuracy == 0.93  # beat B too
        assert [h["version"] for h in registry.history(name)] == [v1, b, a]
    assert registry.current(name).version == a
    assert [v.version for v in registry.versions(name)] == [v1, a, b]  # the loser stays registered


def test_promote_writes_only_the_entry_after_the_pointer_it_was_given(registry, model_dir) -> None:
    v1 = _register_scored(registry, model_dir, "cond", 0.90, promote=True)
    v2 = _register_scored(registry, model_dir, "cond", 0.91, promote=False)
    v3 = _register_scored(registry, model_dir, "cond", 0.92, promote=False)
    seen = registry.pointer("cond")
    assert seen == Pointer(seq=1, version=v1)
    registry.rollback("cond", v1)  # any move in between: a rollback too
    assert not registry.promote("cond", v2, expected=seen)
    assert [h["version"] for h in registry.history("cond")] == [v1, v1]  # nothing written
    assert registry.promote("cond", v2, expected=registry.pointer("cond"))
    assert registry.promote("cond", v2, expected=seen)  # a retry: promoted once already, nothing written
    assert registry.pointer("cond") == Pointer(seq=3, version=v2)
    assert registry.promote("cond", v3, expected=registry.pointer("cond"))
    assert [h["reason"] for h in registry.history("cond")] == ["registered", "rollback", "registered", "registered"]
    with pytest.raises(RegistryError, match="has no version 9"):
        registry.promote("cond", 9, expected=registry.pointer("cond"))

    # A registry from before the pointer log: its CURRENT.json is sequence number 0.
    legacy = {"history": [{"version": 1, "at": "2026-01-01T00:00:00+00:00", "reason": "registered"}]}
    write_bytes(registry.storage, "old/CURRENT.json", json.dumps(legacy).encode())
    old1 = _register_scored(registry, model_dir, "old", 0.90, promote=False)
    old2 = _register_scored(registry, model_dir, "old", 0.95, promote=False)
    assert registry.pointer("old") == Pointer(seq=0, version=old1)
    assert registry.promote("old", old2, expected=registry.pointer("old"))
    assert registry.pointer("old") == Pointer(seq=1, version=old2)
    assert registry.pointer("never-registered") == Pointer(seq=0, version=None)


def test_a_retried_register_model_returns_the_version_its_first_attempt_promoted(tmp_path, model_dir) -> None:
    """With must_beat_current, a KFP retry of register_model compared this job's model with itself,
    the current version its first attempt promoted, and reported "not registered" (version 0)."""
    import types

    from components.specs.register_model import register_model

    registry = ModelRegistry(LocalStorage(str(tmp_path / "models")))
    first = registry.register("m", model_dir, {"job_key": "job-7", "metrics": {"test_accuracy": 0.95}},
                              idempotency_key="job-7")
    artifact = lambda **kw: types.SimpleNamespace(**{"uri": "", "metadata": {}, **kw})  # noqa: E731
    out = register_model.python_func(
        model=artifact(path=str(model_dir), metadata={"job_key": "job-7"}),
        eval_metrics=artifact(metadata={"test_accuracy": 0.95}),
        dataset=artifact(path=str(tmp_path / "no-dataset")),  # never read: nothing is scored again
        registry_uri=str(tmp_path / "models"), model_name="m", must_beat_current=True,
    )
    assert (out.version, out.promoted) == (first.version, True)
    assert [h["version"] for h in registry.history("m")] == [1]


def test_register_model_refuses_a_promotion_threshold_outside_0_to_1(tmp_path, model_dir) -> None:
    """Review (2026-11-29): promotion_threshold=80 (meant as 80 %) from the KFP UI registered every
    version and never promoted one, silently; the form's and the CLI's 0..1 bounds hold here too."""
    import types

    from components.specs.register_model import register_model
    from trainflow.common.training_spec import ConfigError

    artifact = lambda **kw: types.SimpleNamespace(**{"uri": "", "metadata": {}, **kw})  # noqa: E731
    with pytest.raises(ConfigError, match=r"^promotion_threshold must be <= 1, got 80\.0$"):
        register_model.python_func(model=artifact(path=str(model_dir)), eval_metrics=artifact(metadata={}),
                                   dataset=artifact(path=str(tmp_path / "no-dataset")),
                                   registry_uri=str(tmp_path / "models"), model_name="m", min_accuracy=80.0)
    assert ModelRegistry(LocalStorage(str(tmp_path / "models"))).history("m") == []


def test_a_version_promoted_once_but_no_longer_current_is_promoted_only_over_the_pointer(registry, model_dir) -> None:
    """Review (2026-11-29): promote returned True for any version that had ever had a "registered"
    entry. Job A's v1 promoted, another run's v2 promoted, then a retry of A's promotion (an Airflow
    clear of its register step) got True, and register_model reported v1 promoted, while v2 stayed
    current. Now True means current: a stale pointer writes nothing, the fresh one moves it."""
    seen = registry.pointer("again")
    v1 = _register_scored(registry, model_dir, "again", 0.95, promote=False)
    assert registry.promote("again", v1, expected=seen)
    v2 = _register_scored(registry, model_dir, "again", 0.90, promote=True)
    assert not registry.promote("again", v1, expected=seen)  # the pointer A's first attempt read
    assert registry.pointer("again") == Pointer(seq=2, version=v2)  # nothing written
    assert registry.promote("again", v1, expected=registry.pointer("again"))
    assert registry.pointer("again") == Pointer(seq=3, version=v1)
    assert registry.promote("again", v1, expected=seen)  # current: a retry, nothing written
    assert [h["version"] for h in registry.history("again")] == [v1, v2, v1]


def _register_step(tmp_path, model_dir, monkeypatch, *, job_key: str, accuracy: float, kfp_run_id: str = "",
                   must_beat_current: bool = True):
    """register_model as the pipeline runs it, each version scored by the accuracy its lineage records
    (accuracy_of would evaluate it on the held-out split)."""
    import types

    import components.registry.promotion as promotion
    from components.specs.register_model import register_model

    monkeypatch.setattr(promotion, "accuracy_of", lambda registry, name, version, dataset_dir:
                        registry.get(name, version).lineage["metrics"]["test_accuracy"])
    artifact = lambda **kw: types.SimpleNamespace(**{"uri": "", "metadata": {}, **kw})  # noqa: E731
    return register_model.python_func(
        model=artifact(path=str(model_dir), metadata={"job_key": job_key}),
        eval_metrics=artifact(metadata={"test_accuracy": accuracy}),
        dataset=artifact(path=str(tmp_path / "no-dataset")),  # synthetic: no data profile stored
        registry_uri=str(tmp_path / "models"), model_name="m", must_beat_current=must_beat_current,
        kfp_run_id=kfp_run_id)


def test_a_longer_run_under_the_same_job_key_is_compared_and_stored(tmp_path, model_dir, monkeypatch) -> None:
    """Review (2026-11-29): with must_beat_current, a current version of the same job key counted as
    an earlier attempt of this task: run B (job_key=prod, more epochs: a resume that trains on) got
    run A's version back as "current already", promoted=True, and its better weights were never
    stored. Only the same model (same files, or the same KFP run) takes that shortcut now."""
    registry = ModelRegistry(LocalStorage(str(tmp_path / "models")))
    (model_dir / "model.pt").write_bytes(b"weights after 8 epochs")
    a = _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.90, kfp_run_id="run-a")
    assert (a.version, a.promoted) == (1, True)

    (model_dir / "model.pt").write_bytes(b"weights after 16 epochs")
    b = _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.95, kfp_run_id="run-b")
    assert (b.version, b.promoted) == (2, True)
    assert registry.current("m").version == 2 and registry.current("m").holds_model(model_dir)
    assert registry.get("m", 2).lineage["previous_version"] == 1

    (model_dir / "model.pt").write_bytes(b"weights after 24 epochs, overfit")
    c = _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.93, kfp_run_id="run-c")
    assert (c.version, c.uri, c.promoted) == (0, "", False)  # compared, and it does not beat v2
    assert registry.current("m").version == 2 and len(registry.versions("m")) == 2

    # The same model again (a retry of B's register task): the shortcut, by its files ...
    (model_dir / "model.pt").write_bytes(b"weights after 16 epochs")
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.95,
                          kfp_run_id="run-b2")[::2] == (2, True)
    # ... or by its KFP run (a retry of this task within run B), whatever the files.
    (model_dir / "model.json").write_text(json.dumps({"model": "small_cnn", "exported": "again"}))
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.95,
                          kfp_run_id="run-b")[::2] == (2, True)
    assert [h["version"] for h in registry.history("m")] == [1, 2]

    # An unresolved run id placeholder is no run: other files are compared (and lose here).
    (model_dir / "model.pt").write_bytes(b"weights after 32 epochs")
    unresolved = "{{$.pipeline_job_uuid}}"
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.97,
                          kfp_run_id=unresolved)[::2] == (3, True)
    (model_dir / "model.pt").write_bytes(b"weights after 40 epochs")
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="prod", accuracy=0.96,
                          kfp_run_id=unresolved)[::2] == (0, False)
    assert registry.current("m").version == 3


def test_a_retried_register_step_after_another_promotion_reports_what_is_current(tmp_path, model_dir,
                                                                               monkeypatch) -> None:
    """Review (2026-11-29), the register_model side of promote's fix: job A's v1 promoted, another run
    (without must_beat_current) promoted v2, then A's register step ran again (an Airflow clear): it
    output version 1, promoted=True, while v2 stayed current. Now v1 is compared with v2 and, as it
    beats it, made current again over it; the output matches the pointer."""
    registry = ModelRegistry(LocalStorage(str(tmp_path / "models")))
    (model_dir / "model.pt").write_bytes(b"job A's weights")
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="job-a", accuracy=0.95,
                          kfp_run_id="run-a")[::2] == (1, True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.pt").write_bytes(b"another run's weights")
    (other / "model.json").write_text("{}")
    assert _register_step(tmp_path, other, monkeypatch, job_key="job-b", accuracy=0.90, kfp_run_id="run-b",
                          must_beat_current=False)[::2] == (2, True)
    retry = _register_step(tmp_path, model_dir, monkeypatch, job_key="job-a", accuracy=0.95, kfp_run_id="run-a2")
    assert (retry.version, retry.promoted) == (1, True)
    assert registry.current("m").version == 1
    assert [h["version"] for h in registry.history("m")] == [1, 2, 1]


def test_a_retried_register_without_comparison_does_not_claim_a_promotion_another_run_replaced(
        tmp_path, model_dir, monkeypatch) -> None:
    """Review (2026-11-29): without must_beat_current, job A's v1 was promoted, another run promoted
    v2, then a retry of A's register step reported promoted=True for v1 while v2 stayed current."""
    a_weights = (model_dir / "model.pt").read_bytes()
    a = _register_step(tmp_path, model_dir, monkeypatch, job_key="a", accuracy=0.9, must_beat_current=False)
    assert (a.version, a.promoted) == (1, True)
    (model_dir / "model.pt").write_bytes(b"another run's weights")
    b = _register_step(tmp_path, model_dir, monkeypatch, job_key="b", accuracy=0.8, must_beat_current=False)
    assert (b.version, b.promoted) == (2, True)
    (model_dir / "model.pt").write_bytes(a_weights)  # the retry of A: the same job key and weights
    registry = ModelRegistry(LocalStorage(str(tmp_path / "models")))
    retry = _register_step(tmp_path, model_dir, monkeypatch, job_key="a", accuracy=0.9, must_beat_current=False)
    assert retry.version == 1 and retry.promoted is False
    assert registry.pointer("m").version == 2


def test_a_retried_register_step_that_no_longer_beats_current_returns_its_earlier_version(tmp_path, model_dir,
                                                                                        monkeypatch) -> None:
    """Review (2026-11-29, left then): job A's register step registered and promoted v1, another run
    promoted a better v2, then A's step ran again (a KFP retry or an Airflow clear after its pod died
    before its outputs were written): it no longer beats v2 and reported "not registered" (version 0)
    while its v1 exists. It returns v1, not current, and writes nothing."""
    registry = ModelRegistry(LocalStorage(str(tmp_path / "models")))
    (model_dir / "model.pt").write_bytes(b"job A's weights")
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="job-a", accuracy=0.90,
                          kfp_run_id="run-a")[::2] == (1, True)
    b_dir = tmp_path / "b"
    shutil.copytree(model_dir, b_dir)
    (b_dir / "model.pt").write_bytes(b"job B's weights")
    assert _register_step(tmp_path, b_dir, monkeypatch, job_key="job-b", accuracy=0.95,
                          kfp_run_id="run-b")[::2] == (2, True)
    history = registry.history("m")
    retry = _register_step(tmp_path, model_dir, monkeypatch, job_key="job-a", accuracy=0.90, kfp_run_id="run-a")
    assert (retry.version, retry.uri, retry.promoted) == (1, registry.get("m", 1).uri, False)
    assert registry.history("m") == history and len(registry.versions("m")) == 2
    # other weights under the same job key (a longer run) were never registered: compared, and they lose
    (model_dir / "model.pt").write_bytes(b"job A's weights after more epochs")
    assert _register_step(tmp_path, model_dir, monkeypatch, job_key="job-a", accuracy=0.91,
                          kfp_run_id="run-a2")[::2] == (0, False)
    assert registry.registered("m", model_dir, idempotency_key="job-a") is None


class _ConflictingOnce(LocalStorage):
    """A bucket where a create-only write of each key named in ``conflicts`` first collides with
    another write of it still under way (S3's 409 ConditionalRequestConflict); ``lands`` says whether
    that other write then lands (the key exists on the retry) or not."""

    def __init__(self, root: str, conflicts: tuple[str, ...], *, lands: bool) -> None:
        super().__init__(root)
        self.conflicts, self.lands, self.seen = set(conflicts), lands, []

    def open_write(self, key: str, *, create_only: bool = False):
        suffix = next((c for c in self.conflicts if key.endswith(c)), None)
        if create_only and suffix is not None:
            self.conflicts.discard(suffix)
            self.seen.append(key)
            if self.lands:
                other = b"" if key.endswith("CLAIM") else json.dumps(  # another writer's pointer entry
                    {"version": 1, "at": "2026-11-30T00:00:00+00:00", "reason": "registered"}).encode()
                write_bytes(LocalStorage(str(self.root)), key, other, create_only=True)
            raise ObjectWriteConflict(f"writing {key} failed: ConditionalRequestConflict")
        return super().open_write(key, create_only=create_only)


@pytest.mark.parametrize("lands", [False, True])
def test_a_registration_rides_out_a_conflicting_concurrent_write(monkeypatch, tmp_path, model_dir, lands) -> None:
    """Review 2026-11-30: two create-only PUTs of one key racing on AWS S3 may give the loser 409
    ConditionalRequestConflict ("retry"), not 412; the registry took it for a failure and the
    register step failed. Now the write is retried: if the other write landed, the claim moves on
    to the next version (as after a 412), else it takes the version itself."""
    import components.registry.store as store

    monkeypatch.setattr(store, "CONFLICT_RETRY_PAUSES_S", (0.0, 0.0))
    storage = _ConflictingOnce(str(tmp_path / "reg"), ("v000001/CLAIM", "CURRENT/p0000000001.json"), lands=lands)
    registry = ModelRegistry(storage)
    v = registry.register("m", model_dir, {"metrics": {"test_accuracy": 0.9}})
    assert v.version == (2 if lands else 1)
    assert registry.current("m").version == v.version
    assert [e["version"] for e in registry.history("m")][-1] == v.version
    assert len(storage.seen) == 2


def test_a_conflict_that_outlasts_the_retries_is_a_storage_error(monkeypatch, tmp_path, model_dir) -> None:
    import components.registry.store as store

    class _AlwaysConflicting(LocalStorage):
        def open_write(self, key: str, *, create_only: bool = False):
            if create_only:
                raise ObjectWriteConflict(f"writing {key} failed: ConditionalRequestConflict")
            return super().open_write(key, create_only=create_only)

    monkeypatch.setattr(store, "CONFLICT_RETRY_PAUSES_S", (0.0, 0.0))
    with pytest.raises(ObjectWriteConflict, match="v000001/CLAIM failed: ConditionalRequestConflict"):
        ModelRegistry(_AlwaysConflicting(str(tmp_path / "reg"))).register("m", model_dir, {})
