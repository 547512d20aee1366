"""The local KFP API server refuses what a web page or another host could send it.

Every run executes its spec's commands on the developer's machine, so the server must not run a
request it cannot attribute to a client of its own:

* a body that is not ``application/json`` on a mutating route (a CORS "simple request" a page can
  send without a preflight) gets 415 and creates nothing;
* a request whose ``Origin`` is another site, or that a browser marks ``Sec-Fetch-Site:
  cross-site``/``same-site``, gets 403;
* a ``Host`` header other than the loopback names (DNS rebinding) gets 400;
* ``--host`` other than loopback without a token is refused at start (exit 2, one line);
* with a token, the run log (``/local/runs/{id}/log``) needs it too, and the token comes from a
  file or the environment, never the command line (``ps`` shows argv);
* the run browser sends the token it was given, and the log it shows has no ANSI codes.

Covered through the real server process (``trainflow kfp-server``) and, for the run browser,
headless Chromium.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.kfp_server import KfpServer, start_kfp_server
from tests.support.processes import free_port

API = "/apis/v2beta1"
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))

pytestmark = pytest.mark.slow


def run_body(compiled_pipelines: dict[str, Path], name: str) -> dict:
    import yaml

    spec = yaml.safe_load(compiled_pipelines["tiny"].read_text())
    return {"display_name": name, "pipeline_spec": spec, "runtime_config": {"parameters": {"a": 1, "b": 2}}}


def run_names(server: KfpServer) -> list[str]:
    runs = httpx.get(f"{server.url}{API}/runs", params={"page_size": 1000}).json().get("runs") or []
    return [r["display_name"] for r in runs]


def test_a_non_json_body_is_refused_and_runs_nothing(kfp_server: KfpServer, compiled_pipelines) -> None:
    body = json.dumps(run_body(compiled_pipelines, "sent-as-text-plain"))
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        response = httpx.post(f"{kfp_server.url}{API}/runs", content=body, headers=headers)
        assert response.status_code == 415, (content_type, response.text)
        assert response.json()["code"] == 3 and "application/json" in response.json()["message"]
    assert "sent-as-text-plain" not in run_names(kfp_server)


def test_cross_site_requests_are_refused(kfp_server: KfpServer, compiled_pipelines) -> None:
    body = run_body(compiled_pipelines, "cross-site")
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": f"http://127.0.0.1:{free_port()}"},  # another local port is another origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ):
        response = httpx.post(f"{kfp_server.url}{API}/runs", json=body, headers=headers)
        assert response.status_code == 403, (headers, response.text)
        assert response.json()["code"] == 7
    assert "cross-site" not in run_names(kfp_server)
    # its own page (same origin) and non-browser clients (no Origin) are served
    same = httpx.post(
        f"{kfp_server.url}{API}/experiments",
        json={"display_name": "same-origin"},
        headers={"Origin": kfp_server.url, "Sec-Fetch-Site": "same-origin"},
    )
    assert same.status_code == 200, same.text


def test_a_foreign_host_header_is_refused(kfp_server: KfpServer) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 sends ``Host: evil.example``."""
    for host in ("evil.example", "evil.example:8888", "10.0.0.1"):
        response = httpx.get(f"{kfp_server.url}{API}/runs", headers={"Host": host})
        assert response.status_code == 400, (host, response.text)
    port = kfp_server.url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        assert httpx.get(f"{kfp_server.url}{API}/runs", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "::"])
def test_a_non_loopback_host_without_a_token_is_refused(tmp_path: Path, host: str) -> None:
    done = subprocess.run(
        [TRAINFLOW, "kfp-server", "--host", host, "--port", str(free_port()), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TRAINFLOW_KFP_SERVER_TOKEN": ""},
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a token" in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_the_token_is_read_from_a_file_and_never_on_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [TRAINFLOW, "kfp-server", "--auth-token", "s3cret", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "--auth-token" in done.stderr  # not an option: ps would show it
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    token_file.chmod(0o600)
    server = start_kfp_server(tmp_path, token_file=token_file, name="kfp-token-file")
    try:
        cmdline = " ".join(psutil.Process(server.process.pid).cmdline())
        assert "from-a-file" not in cmdline and str(token_file) in cmdline
        url = f"{server.url}{API}/healthz"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer from-a-file"}).status_code == 200
    finally:
        server.process.stop()


@pytest.mark.browser
def test_with_a_token_the_run_log_needs_it_and_the_browser_sends_it(
    tmp_path: Path, compiled_pipelines, chromium
) -> None:
    server = start_kfp_server(tmp_path, token="ui-s3cret", name="kfp-ui-token")
    auth = {"Authorization": "Bearer ui-s3cret"}
    try:
        run = httpx.post(
            f"{server.url}{API}/runs", json=run_body(compiled_pipelines, "logged"), headers=auth
        ).raise_for_status().json()
        run_id = run["run_id"]
        deadline = time.monotonic() + 180
        while httpx.get(f"{server.url}{API}/runs/{run_id}", headers=auth).json()["state"] not in (
            "SUCCEEDED", "FAILED"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        log_url = f"{server.url}/local/runs/{run_id}/log"
        assert httpx.get(log_url).status_code == 401
        assert httpx.get(log_url, headers={"Authorization": "Bearer wrong"}).status_code == 403
        log = httpx.get(log_url, headers=auth)
        assert log.status_code == 200 and "Executing task" in log.text
        assert "\x1b[" not in log.text  # kfp.local colours task names; the page shows plain text
        assert "\x1b[" in (server.data_dir / "runs" / run_id / "run.log").read_text()

        chromium.get(f"{server.url}/#/runs/details/{run_id}")
        field = WebDriverWait(chromium, 30).until(lambda d: d.find_elements(By.ID, "token"))[0]
        field.send_keys("ui-s3cret")
        chromium.find_element(By.ID, "token-save").click()
        WebDriverWait(chromium, 30).until(lambda d: d.find_elements(By.ID, "run-log"))
        assert chromium.find_element(By.ID, "run-id").text == run_id
        assert chromium.find_element(By.ID, "run-state").text == "SUCCEEDED"
        shown = chromium.find_element(By.ID, "run-log").text
        assert "Executing task" in shown and "\x1b" not in shown and "[0m" not in shown
        chromium.refresh()  # the token is remembered for this origin
        WebDriverWait(chromium, 30).until(lambda d: d.find_elements(By.ID, "run-log"))
    finally:
        server.process.stop()
