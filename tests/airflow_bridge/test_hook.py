"""KfpHook and KfpAsyncHook against the real local KFP server (``trainflow kfp-server``).

Covers every hook call the operator uses: get-or-create experiment (also under a race), upload a
pipeline and a version, create runs from a package file (single- and multi-document YAML), from
an uploaded pipeline, with parameters converted to the declared types and caching forced off;
get, find by name/marker, terminate, wait (incl. CANCELED, kubeflow/pipelines#14473, and the
deadline); bearer-token and service-account-token auth against a server that requires a token.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import yaml

from airflow_bridge.exceptions import KfpAuthError, KfpPackageError, KfpRunTimeoutError
from airflow_bridge.hooks import AuthMode, KfpAsyncHook, KfpConnectionConfig, KfpHook
from tests.support.kfp_server import FAILURE_MESSAGE, KfpServer, start_kfp_server

pytestmark = pytest.mark.slow


@pytest.fixture()
def hook(kfp_server: KfpServer) -> KfpHook:
    h = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    yield h
    h.close()


def test_healthz_and_test_connection(hook: KfpHook) -> None:
    ok, message = hook.test_connection()
    assert ok and message.startswith("KFP API at http://127.0.0.1:")


def test_get_or_create_experiment_is_idempotent(hook: KfpHook) -> None:
    first = hook.get_or_create_experiment("hook-exp", description="d")
    again = hook.get_or_create_experiment("hook-exp")
    assert first["experiment_id"] == again["experiment_id"]
    assert hook.get_or_create_experiment()["display_name"] == "Default"


def test_create_run_from_package_converts_parameters_and_succeeds(hook: KfpHook, compiled_pipelines) -> None:
    run = hook.create_run(
        display_name="hook tiny",
        package_path=compiled_pipelines["tiny"],
        parameters={"a": "4", "b": 5},
        enable_caching=False,
    )
    assert run["state"] == "PENDING" and run["runtime_config"]["parameters"] == {"a": 4, "b": 5}
    assert run["pipeline_spec"]["root"]["dag"]["tasks"]["add"]["cachingOptions"]["enableCache"] is False
    done = hook.wait_for_run(run["run_id"], poll_interval_s=0.5, deadline_s=None)
    assert done["state"] == "SUCCEEDED"


def test_caching_forced_on_warns_about_the_steps_compiled_not_to_cache(
    hook: KfpHook, compiled_pipelines, tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    """kfp's override semantics are kept (every step cached), but the DAG author is told which steps
    the pipeline meant never to cache (trainflow's dataset step: a cached one reuses an old file list)."""
    spec = yaml.safe_load(Path(compiled_pipelines["tiny"]).read_text())
    tasks = spec["root"]["dag"]["tasks"]
    uncached = sorted(tasks)[0]
    tasks[uncached]["cachingOptions"] = {}  # what set_caching_options(False) compiles to
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    arguments = {"a": 1, "b": 2}
    with caplog.at_level(logging.WARNING):
        run = hook.create_run(display_name="hook cached", package_path=tmp_path / "p.yaml", parameters=arguments,
                              enable_caching=True)
    assert run["pipeline_spec"]["root"]["dag"]["tasks"][uncached]["cachingOptions"]["enableCache"] is True
    log = capsys.readouterr().out + caplog.text  # Airflow's structlog prints; plain logging records
    assert f"caching on for {uncached}, which pipeline 'tiny' was compiled not to cache" in log, log
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        hook.create_run(display_name="hook compiled", package_path=tmp_path / "p.yaml", parameters=arguments)
        hook.create_run(display_name="hook uncached", package_path=tmp_path / "p.yaml", parameters=arguments,
                        enable_caching=False)
    log = capsys.readouterr().out + caplog.text
    assert "enable_caching" not in log, log


def test_multi_document_package_is_sent_with_its_platform_spec(hook: KfpHook, compiled_pipelines) -> None:
    run = hook.create_run(display_name="hook platform", package_path=compiled_pipelines["platform"])
    assert set(run["pipeline_spec"]) == {"pipeline_spec", "platform_spec"}
    assert hook.wait_for_run(run["run_id"], poll_interval_s=0.5)["state"] == "SUCCEEDED"


def test_failed_run_carries_the_error(hook: KfpHook, compiled_pipelines) -> None:
    run = hook.create_run(display_name="hook failing", package_path=compiled_pipelines["failing"])
    done = hook.wait_for_run(run["run_id"], poll_interval_s=0.5)
    assert done["state"] == "FAILED" and FAILURE_MESSAGE in done["error"]["message"]


def test_unknown_parameter_is_refused_before_any_request(hook: KfpHook, compiled_pipelines) -> None:
    with pytest.raises(KfpPackageError, match="has no parameter"):
        hook.create_run(display_name="x", package_path=compiled_pipelines["tiny"], parameters={"z": 1})


def test_upload_pipeline_and_version_then_run_by_id(hook: KfpHook, compiled_pipelines) -> None:
    pipeline = hook.upload_pipeline(compiled_pipelines["tiny"], name="hook-uploaded")
    version = hook.upload_pipeline_version(
        compiled_pipelines["tiny"], pipeline_id=pipeline["pipeline_id"], name="hook-v2"
    )
    run = hook.create_run(
        display_name="by id",
        pipeline_id=pipeline["pipeline_id"],
        pipeline_version_id=version["pipeline_version_id"],
        parameters={"a": 1},
    )
    assert run["pipeline_version_reference"]["pipeline_version_id"] == version["pipeline_version_id"]
    assert hook.wait_for_run(run["run_id"], poll_interval_s=0.5)["state"] == "SUCCEEDED"


def test_find_terminate_and_wait_returns_on_canceled(hook: KfpHook, compiled_pipelines) -> None:
    marker = "[af-hooktest00000000]"
    run = hook.create_run(
        display_name=f"slow {marker}", package_path=compiled_pipelines["slow"], parameters={"seconds": 300}
    )
    found = hook.find_runs(display_name_contains=marker)
    assert [r["run_id"] for r in found] == [run["run_id"]]
    assert hook.find_runs(display_name=f"slow {marker}")[0]["run_id"] == run["run_id"]
    # an exact name is not a substring match (other tests of the session may have a run named "slow")
    assert all(r["display_name"] == "slow" for r in hook.find_runs(display_name="slow"))
    with pytest.raises(KfpRunTimeoutError, match=r"still (PENDING|RUNNING) at its deadline"):
        hook.wait_for_run(run["run_id"], poll_interval_s=0.2, deadline_s=time.time() + 1.0)
    hook.terminate_run(run["run_id"])
    done = hook.wait_for_run(run["run_id"], poll_interval_s=0.2, deadline_s=time.time() + 60)
    assert done["state"] == "CANCELED"  # kfp's wait_for_run_completion would hang here (#14473)
    # the server refuses to terminate a finished run (400, as KFP 2.14); the hook takes that as done
    hook.terminate_run(run["run_id"])


async def test_async_hook_waits_and_terminates(kfp_server: KfpServer, compiled_pipelines) -> None:
    sync = KfpHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    run = sync.create_run(
        display_name="async", package_path=compiled_pipelines["slow"], parameters={"seconds": 300}
    )
    hook = KfpAsyncHook("kfp", config=KfpConnectionConfig(api_url=kfp_server.url))
    assert (await hook.get_run(run["run_id"]))["run_id"] == run["run_id"]
    await hook.terminate_run(run["run_id"])
    done = await hook.wait_for_run(run["run_id"], poll_interval_s=0.2)
    assert done["state"] == "CANCELED"
    assert await hook.run_url(run["run_id"]) == f"{kfp_server.url}/#/runs/details/{run['run_id']}"


def test_token_auth_modes_against_a_server_that_requires_a_token(tmp_path: Path) -> None:
    server = start_kfp_server(tmp_path, token="tok-abc123", name="kfp-token")
    try:
        with pytest.raises(KfpAuthError, match=r"HTTP 401.*auth mode 'none'"):
            KfpHook("kfp", config=KfpConnectionConfig(api_url=server.url)).healthz()
        wrong = KfpConnectionConfig(api_url=server.url, auth_mode=AuthMode.BEARER_TOKEN, token="nope")
        with pytest.raises(KfpAuthError, match=r"HTTP 403.*auth mode 'bearer_token'"):
            KfpHook("kfp", config=wrong).healthz()
        right = KfpConnectionConfig(api_url=server.url, auth_mode=AuthMode.BEARER_TOKEN, token="tok-abc123")
        assert KfpHook("kfp", config=right).get_or_create_experiment("authed")["display_name"] == "authed"
        token_file = tmp_path / "sa-token"
        token_file.write_text("tok-abc123\n")
        sa = KfpConnectionConfig(
            api_url=server.url,
            auth_mode=AuthMode.SA_TOKEN_FILE,
            sa_token_path=str(token_file),
            sa_token_dirs=(str(tmp_path),),
        )
        assert KfpHook("kfp", config=sa).healthz() == {"multi_user": False, "pipeline_store": "local"}
    finally:
        server.process.stop()
