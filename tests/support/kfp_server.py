"""Test fixtures for the local KFP API server (``trainflow kfp-server``) and the pipelines it runs.

Registered as a pytest plugin in tests/conftest.py. Fixtures:

* ``compiled_pipelines`` (session): small pipelines compiled with kfp into a temp folder:
  ``tiny`` (adds numbers), ``failing`` (raises with a known message), ``slow`` (sleeps; prints
  its pid), ``stubborn`` (takes ``stop_s`` seconds to stop on SIGTERM, so a terminated run stays
  CANCELING that long), ``platform`` (kfp-kubernetes multi-document YAML), and ``training_pipeline`` -- a
  stand-in with the core parameters of the real training pipeline that sleeps
  ``epochs * step_s`` seconds (for tests that need a run of a chosen length);
* ``training_pipeline_package`` (session): the real ``training_pipeline``, compiled by
  ``trainflow compile --output FILE`` as a user would.
* ``kfp_server`` (session): one server on 127.0.0.1, a free port, data in a temp folder.
* :func:`start_kfp_server`: start another one (e.g. with a token) inside a test.

The pipelines live in tests/support/kfp_pipelines.py (a module without
``from __future__ import annotations``: kfp reads the components' annotations as types).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.kfp_pipelines import FAILURE_MESSAGE, define_pipelines
from tests.support.processes import ManagedProcess, free_port, http_ok

__all__ = ["FAILURE_MESSAGE", "KfpServer", "assert_shape", "compile_pipelines", "start_kfp_server"]


def compile_pipelines(out_dir: Path) -> dict[str, Path]:
    """Compile every test pipeline to ``out_dir/<name>.yaml``; return name -> path."""
    from kfp import compiler

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, func in define_pipelines().items():
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(func, str(path))
        paths[name] = path
    return paths


def assert_shape(obj: Any, type_name: str, path: str = "$") -> None:
    """Every key of ``obj`` is a field of the kfp-server-api model ``type_name`` (recursively)
    and the model can deserialize it (enums and timestamps included)."""
    import kfp_server_api

    if obj is None:
        return
    if type_name.startswith("list["):
        assert isinstance(obj, list), path
        for i, item in enumerate(obj):
            assert_shape(item, type_name[5:-1], f"{path}[{i}]")
        return
    if type_name.startswith("dict(") or type_name in ("object", "str", "int", "bool", "float", "datetime"):
        return
    model = getattr(kfp_server_api, type_name)
    if not model.openapi_types:  # an enum
        allowed = {v for k, v in vars(model).items() if k.isupper()}
        assert obj in allowed, f"{path}: {obj!r} not in {type_name}"
        return
    assert isinstance(obj, dict), f"{path}: expected an object for {type_name}"
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    unknown = set(obj) - set(fields)
    assert not unknown, f"{path}: fields {unknown} are not in {type_name}"
    for key, value in obj.items():
        assert_shape(value, model.openapi_types[fields[key]], f"{path}.{key}")


@dataclass
class KfpServer:
    """A running ``trainflow kfp-server``."""

    url: str
    data_dir: Path
    process: ManagedProcess
    token: str | None = None


def start_kfp_server(
    tmp_dir: Path,
    *,
    token: str | None = None,
    token_file: Path | None = None,
    max_concurrent_runs: int = 2,
    name: str = "kfp-server",
    env: dict[str, str] | None = None,
) -> KfpServer:
    """Start a server on 127.0.0.1 and a free port; the caller stops ``.process``.

    ``token`` goes in through ``TRAINFLOW_KFP_SERVER_TOKEN``, ``token_file`` through
    ``--auth-token-file`` (the server never takes a token on its command line). ``env`` is added to
    the server's environment (and so to its runs', e.g. S3 credentials).
    """
    port = free_port()
    data_dir = tmp_dir / f"{name}-data"
    argv = [
        str(Path(sys.executable).with_name("trainflow")),  # the console script of this venv
        "kfp-server",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--max-concurrent-runs",
        str(max_concurrent_runs),
        *(["--auth-token-file", str(token_file)] if token_file else []),
    ]
    env = {**(env or {}), "TRAINFLOW_KFP_SERVER_TOKEN": token or ""}
    url = f"http://127.0.0.1:{port}"
    # With a token, healthz answers 401: readiness is "the port answers HTTP" then.
    ready_url = f"{url}/" if token or token_file else f"{url}/apis/v2beta1/healthz"
    proc = ManagedProcess(
        name,
        argv,
        log_dir=tmp_dir,
        env=env,
        ready=lambda: http_ok(ready_url),
        ready_timeout_s=90,
        stop_timeout_s=20,
    )
    proc.start()
    return KfpServer(
        url=url, data_dir=data_dir, process=proc, token=token or (token_file.read_text().strip() if token_file else None),
    )


@pytest.fixture(scope="session")
def compiled_pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return compile_pipelines(tmp_path_factory.mktemp("pipelines"))


@pytest.fixture(scope="session")
def training_pipeline_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("training_pipeline") / "training_pipeline.yaml"
    cli = str(Path(sys.executable).with_name("trainflow"))
    done = subprocess.run([cli, "compile", "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and out.is_file(), f"trainflow compile failed:\n{done.stdout}\n{done.stderr}"
    return out


@pytest.fixture(scope="session")
def kfp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KfpServer]:
    server = start_kfp_server(tmp_path_factory.mktemp("kfp"), max_concurrent_runs=4)
    try:
        yield server
    finally:
        server.process.stop()
