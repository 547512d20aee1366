"""hooks.config: a kubeflow_pipelines Airflow connection -> validated settings (pure; real
``airflow.sdk.Connection`` objects, no Airflow services)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from airflow.sdk import Connection

from airflow_bridge.exceptions import KfpConfigError
from airflow_bridge.hooks.config import AuthMode, KfpConnectionConfig


def conn(**kwargs) -> Connection:
    extra = kwargs.pop("extra", None)
    return Connection(conn_id="kfp", conn_type="kubeflow_pipelines", extra=json.dumps(extra or {}), **kwargs)


def test_host_with_scheme_and_path_is_the_api_url() -> None:
    cfg = KfpConnectionConfig.from_connection(conn(host="https://kf.example.com/pipeline/"))
    assert cfg.api_url == "https://kf.example.com/pipeline"
    assert cfg.auth_mode is AuthMode.NONE and cfg.auth_headers() == {}


def test_host_without_scheme_uses_schema_and_port() -> None:
    cfg = KfpConnectionConfig.from_connection(conn(host="127.0.0.1", port=8888))
    assert cfg.api_url == "http://127.0.0.1:8888"


def test_password_means_bearer_token_and_is_not_printed() -> None:
    cfg = KfpConnectionConfig.from_connection(conn(host="http://h", password="tok-123"))
    assert cfg.auth_mode is AuthMode.BEARER_TOKEN
    assert cfg.auth_headers() == {"Authorization": "Bearer tok-123"}
    assert "tok-123" not in repr(cfg)


def test_extras_plain_and_prefixed(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    extra = {
        "extra__kubeflow_pipelines__namespace": "team-a",
        "auth_mode": "sa_token_file",
        "sa_token_path": str(token),
        "verify_ssl": "false",
        "request_timeout_s": "7.5",
        "ui_url": "https://kf.example.com/_/pipeline/?ns={namespace}#/runs/details/{run_id}",
    }
    cfg = KfpConnectionConfig.from_connection(conn(host="http://h", extra=extra), sa_token_dirs=(str(tmp_path),))
    assert cfg.namespace == "team-a" and cfg.request_timeout_s == 7.5 and cfg.verify_ssl is False
    assert cfg.auth_headers() == {"Authorization": "Bearer sa-token"}
    token.write_text("rotated")  # projected tokens rotate: read on every request
    assert cfg.auth_headers() == {"Authorization": "Bearer rotated"}
    assert cfg.run_url("r 1") == "https://kf.example.com/_/pipeline/?ns=team-a#/runs/details/r%201"
    # an operator that runs in another profile links to that profile
    assert cfg.run_url("r 1", "team-b") == "https://kf.example.com/_/pipeline/?ns=team-b#/runs/details/r%201"


def test_default_run_url_is_the_kfp_ui_form() -> None:
    cfg = KfpConnectionConfig(api_url="http://127.0.0.1:8888")
    assert cfg.run_url("abc") == "http://127.0.0.1:8888/#/runs/details/abc"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"host": ""}, "has no host"),
        ({"host": "ftp://h"}, "must look like http"),
        ({"host": "http://h", "extra": {"auth_mode": "kerberos"}}, "auth_mode must be one of"),
        ({"host": "http://h", "extra": {"auth_mode": "bearer_token"}}, "needs the token"),
        ({"host": "http://h", "extra": {"verify_ssl": "maybe"}}, "verify_ssl must be true or false"),
        ({"host": "http://h", "extra": {"request_timeout_s": "soon"}}, "must be a number"),
        ({"host": "http://h", "extra": {"ca_bundle_path": "/nope.pem"}}, "does not exist"),
    ],
)
def test_bad_connections_fail_with_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(KfpConfigError, match=message):
        KfpConnectionConfig.from_connection(conn(**kwargs))


def test_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    cfg = KfpConnectionConfig(
        api_url="http://h",
        auth_mode=AuthMode.SA_TOKEN_FILE,
        sa_token_path=str(tmp_path / "x"),
        sa_token_dirs=(str(tmp_path),),
    )
    with pytest.raises(KfpConfigError, match="cannot read the service-account token"):
        cfg.auth_headers()


@pytest.mark.parametrize(
    "ui_url",
    [
        "https://kf.example.com/_/pipeline/?ns={ns}#/runs/details/{run_id}",  # unknown field
        "https://kf.example.com/#/runs/details/{run_id",  # unbalanced
        "https://kf.example.com/?ns={namespace}",  # a pattern without {run_id}
        "https://kf.example.com/{0}/{run_id}",  # positional
    ],
)
def test_a_bad_ui_url_pattern_is_refused_when_the_settings_are_built(ui_url: str) -> None:
    with pytest.raises(KfpConfigError, match="ui_url") as info:
        KfpConnectionConfig.from_connection(conn(host="http://h", extra={"ui_url": ui_url}))
    assert "\n" not in str(info.value)


def test_a_missing_connection_is_an_error_not_a_silent_local_default(monkeypatch) -> None:
    from airflow_bridge.hooks import KfpAsyncHook, KfpHook

    monkeypatch.delenv("AIRFLOW_CONN_KUBEFLOW_PIPELINES_DEFAULT", raising=False)
    monkeypatch.setenv("KF_PIPELINES_ENDPOINT", "http://127.0.0.1:8888")
    with pytest.raises(KfpConfigError, match="'kubeflow_pipelines_default' is not defined"):
        KfpHook().config  # noqa: B018 - the property reads the connection
    with pytest.raises(KfpConfigError, match="'kubeflow_pipelines_default' is not defined"):
        asyncio.run(KfpAsyncHook().get_config())


def test_the_service_account_token_must_live_in_a_token_folder(tmp_path: Path) -> None:
    """A connection editor must not be able to send any file the worker can read (``/etc/shadow``,
    ``~/.aws/credentials``) as a bearer token to a host of their choice."""
    secret = tmp_path / "credentials"
    secret.write_text("not-a-token")
    extra = {"auth_mode": "sa_token_file", "sa_token_path": str(secret)}
    with pytest.raises(KfpConfigError, match="outside the service-account token folders"):
        KfpConnectionConfig.from_connection(conn(host="https://evil.example", extra=extra))
    escape = tmp_path / "tokens" / "link"  # a symlink inside an allowed folder pointing outside
    escape.parent.mkdir()
    escape.symlink_to(secret)
    extra["sa_token_path"] = str(escape)
    with pytest.raises(KfpConfigError, match="outside the service-account token folders"):
        KfpConnectionConfig.from_connection(
            conn(host="https://evil.example", extra=extra), sa_token_dirs=(str(escape.parent),)
        )
    # an Airflow admin (not the connection editor) may allow another folder
    token = tmp_path / "tokens" / "token"
    token.write_text("sa-token")
    extra["sa_token_path"] = str(token)
    cfg = KfpConnectionConfig.from_connection(
        conn(host="https://kf.example", extra=extra), sa_token_dirs=(str(token.parent),)
    )
    assert cfg.auth_headers() == {"Authorization": "Bearer sa-token"}
    assert KfpConnectionConfig(api_url="http://h").sa_token_dirs == ("/var/run/secrets",)


def test_the_token_folders_come_from_the_airflow_config(tmp_path: Path, monkeypatch) -> None:
    from airflow_bridge.hooks import KfpHook

    token = tmp_path / "token"
    token.write_text("tok")
    extra = json.dumps({"auth_mode": "sa_token_file", "sa_token_path": str(token)})
    monkeypatch.setenv(
        "AIRFLOW_CONN_KFP_SA", json.dumps({"conn_type": "kubeflow_pipelines", "host": "https://h", "extra": extra})
    )
    with pytest.raises(KfpConfigError, match="outside the service-account token folders"):
        KfpHook("kfp_sa").config  # noqa: B018
    monkeypatch.setenv("AIRFLOW__KUBEFLOW_PIPELINES__SA_TOKEN_DIRS", f"/var/run/secrets,{tmp_path}")
    assert KfpHook("kfp_sa").config.auth_headers() == {"Authorization": "Bearer tok"}


@pytest.mark.parametrize(
    ("api_url", "warned"),
    [
        ("http://kubeflow.example.com/pipeline", True),
        ("http://10.1.2.3:8888", True),
        ("https://kubeflow.example.com/pipeline", False),
        ("http://127.0.0.1:8888", False),
        ("http://localhost:8888", False),
        ("http://ml-pipeline.kubeflow.svc.cluster.local:8888", False),  # in-cluster service name
    ],
)
def test_a_token_over_plain_http_is_warned_about(api_url: str, warned: bool, capsys, caplog) -> None:
    from airflow_bridge.hooks import KfpHook

    cfg = KfpConnectionConfig(api_url=api_url, auth_mode=AuthMode.BEARER_TOKEN, token="tok-1")
    assert (cfg.cleartext_token_warning() is not None) == warned
    hook = KfpHook("kfp", config=cfg)
    with caplog.at_level(logging.WARNING):
        hook.get_conn()
        hook.close()
        hook.get_conn()  # once per hook
    out = capsys.readouterr().out + caplog.text  # Airflow's structlog prints; plain logging records
    assert out.count("over plain http") == (1 if warned else 0), out
    assert "tok-1" not in out
    assert KfpConnectionConfig(api_url=api_url).cleartext_token_warning() is None  # no token, no warning


def test_auth_mode_none_with_a_token_is_refused_and_the_form_stores_no_default() -> None:
    """The connection form used to default auth_mode to "none": a token typed into Password was then
    stored next to "none" and silently never sent."""
    from airflow_bridge import get_provider_info

    with pytest.raises(KfpConfigError, match="auth_mode 'none' but a token in Password") as info:
        KfpConnectionConfig.from_connection(conn(host="http://h", password="tok-9", extra={"auth_mode": "none"}))
    assert "\n" not in str(info.value) and "tok-9" not in str(info.value)
    # empty (null, as the form now stores it when left alone): chosen from the password
    cfg = KfpConnectionConfig.from_connection(conn(host="http://h", password="tok-9", extra={"auth_mode": None}))
    assert cfg.auth_mode is AuthMode.BEARER_TOKEN and cfg.auth_headers() == {"Authorization": "Bearer tok-9"}
    assert KfpConnectionConfig.from_connection(conn(host="http://h", extra={"auth_mode": "none"})).auth_mode is (
        AuthMode.NONE
    )
    (form,) = get_provider_info()["connection-types"]
    schema = form["conn-fields"]["auth_mode"]["schema"]
    assert "default" not in schema and None in schema["enum"]


@pytest.mark.parametrize(
    ("api_url", "ui_url", "warned"),
    [
        ("http://ml-pipeline.kubeflow.svc.cluster.local:8888", "", True),
        ("http://ml-pipeline.kubeflow.svc:8888", "", True),
        ("http://ml-pipeline.kubeflow.svc.cluster.local:8888", "https://kf.example.com/_/pipeline/", False),
        ("https://kubeflow.example.com/pipeline", "", False),
        ("http://127.0.0.1:8888", "", False),
    ],
)
def test_run_links_on_an_in_cluster_api_url_are_warned_about_once(
    api_url: str, ui_url: str, warned: bool, capsys, caplog
) -> None:
    from airflow_bridge.hooks import KfpAsyncHook, KfpHook

    cfg = KfpConnectionConfig(api_url=api_url, ui_url=ui_url)
    hook = KfpHook("kfp", config=cfg)
    with caplog.at_level(logging.WARNING):
        hook.run_url("r1")
        hook.run_url("r2")  # once per hook
        asyncio.run(KfpAsyncHook("kfp", config=cfg).run_url("r3"))
    out = capsys.readouterr().out + caplog.text
    assert out.count("serves no UI") == (2 if warned else 0), out
