"""Where the train step puts checkpoints when the pipeline gives no checkpoint_uri (pure)."""

from __future__ import annotations

import pytest

from components.training.step import TrainStepError, pipeline_root_of, resolve_checkpoint_uri

RUN = "b0324f12-db52-47b6-9048-918c42d3ee14"
#: An output URI as KFP 2.14.3's launcher names it on the real backend (test_realkfp, 2026-11-24).
MODEL_URI = f"minio://mlpipeline/v2/artifacts/training-pipeline/{RUN}/train/e4a18921-96e3-4b16-b8fc-1ffff0979b48/model"


def test_a_resolved_placeholder_wins() -> None:
    assert pipeline_root_of("s3://bucket/root", MODEL_URI, RUN) == "s3://bucket/root"


def test_an_unresolved_placeholder_is_derived_from_an_output_artifact_uri() -> None:
    """KFP 2.14's driver leaves ``{{$.pipeline_root}}`` as is; the root precedes
    ``/<pipeline name>/<run id>/`` in every output URI."""
    root = pipeline_root_of("{{$.pipeline_root}}", MODEL_URI, RUN)
    assert root == "minio://mlpipeline/v2/artifacts"
    assert resolve_checkpoint_uri("", root) == "s3://mlpipeline/v2/artifacts/trainflow-checkpoints"


@pytest.mark.parametrize(("uri", "run_id"), [
    (MODEL_URI, "{{$.pipeline_job_uuid}}"),       # the run id is unresolved too
    ("/tmp/outputs/train/model", RUN),             # a URI without the run id
    (f"minio://{RUN}/x", RUN),                      # nothing before the pipeline name
])
def test_nothing_to_derive_from_leaves_the_placeholder_and_the_step_says_so(uri: str, run_id: str) -> None:
    root = pipeline_root_of("{{$.pipeline_root}}", uri, run_id)
    assert root == "{{$.pipeline_root}}"
    with pytest.raises(TrainStepError, match="no checkpoint_uri given and no pipeline root"):
        resolve_checkpoint_uri("", root)
