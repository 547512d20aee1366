"""hooks.config: a kubeflow_pipelines Airflow connection -> validated settings (pure; real
``airflow.sdk.Connection`` objects, no Airflow services)."""

from __future__ import annotations

import json
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
    cfg = KfpConnectionConfig.from_connection(conn(host="http://h", extra=extra))
    assert cfg.namespace == "team-a" and cfg.request_timeout_s == 7.5 and cfg.verify_ssl is False
    assert cfg.auth_headers() == {"Authorization": "Bearer sa-token"}
    token.write_text("rotated")  # projected tokens rotate: read on every request
    assert cfg.auth_headers() == {"Authorization": "Bearer rotated"}
    assert cfg.run_url("r 1") == "https://kf.example.com/_/pipeline/?ns=team-a#/runs/details/r%201"


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
        api_url="http://h", auth_mode=AuthMode.SA_TOKEN_FILE, sa_token_path=str(tmp_path / "x")
    )
    with pytest.raises(KfpConfigError, match="cannot read the service-account token"):
        cfg.auth_headers()
