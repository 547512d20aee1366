"""A real Airflow 3.3 on 127.0.0.1 for tests, started once (registered in tests/conftest.py).

``airflow_cluster`` (package fixture: started once for tests/airflow_bridge, stopped when that
package is done so it does not idle through the other tiers) does what a user would, piece by piece -- never
``airflow standalone``, whose log servers bind to all interfaces:

1. ``AIRFLOW_HOME`` in a temp folder; a dags folder holding the example DAG ``trainflow_training``
   (reading the real ``training_pipeline`` compiled by ``trainflow compile``) and the test DAGs of
   tests/airflow_bridge/dags/ (stand-in pipelines of controllable length);
2. ``airflow db migrate`` (SQLite);
3. ``airflow api-server --host 127.0.0.1 --port <free>``, ``airflow scheduler --skip-serve-logs``
   (LocalExecutor, ``parallelism=2``), ``airflow dag-processor``, ``airflow triggerer
   --skip-serve-logs`` -- each a :class:`ManagedProcess`, stopped by PID at the end;
4. a ``kubeflow_pipelines_default`` connection (``AIRFLOW_CONN_...``) pointing at the session's
   local KFP server.

Knobs set for test speed (documented in docs/airflow.md): task heartbeat timeout 20 s (a killed
worker is noticed quickly), supervisor heartbeat every 2 s (a task marked failed is killed
within seconds), DAGs unpaused at creation, the simple auth manager with everyone admin (the
browser test needs no login).

:class:`AirflowCluster` wraps the REST API v2 the way the UI uses it: trigger a DAG run with a
conf, read task instances, XComs and logs, set a task instance state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.support.kfp_server import KfpServer
from tests.support.processes import ManagedProcess, artifacts_root, free_port, http_ok

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DAG = REPO / "airflow_bridge" / "example_dags" / "trainflow_training.py"
TEST_DAGS = REPO / "tests" / "airflow_bridge" / "dags"
COMPONENTS = ("scheduler", "triggerer", "dag_processor")


def _airflow_bin() -> str:
    return str(Path(sys.executable).with_name("airflow"))


@dataclass
class AirflowCluster:
    """A running Airflow (api-server, scheduler, dag-processor, triggerer) and its REST API."""

    home: Path
    url: str
    env: dict[str, str]
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    #: ``(username, password)`` of the simple auth manager; ``None``: everyone is admin.
    credentials: tuple[str, str] | None = None
    _token: str | None = None

    # -- REST --------------------------------------------------------------------------------
    def token(self) -> str:
        if self._token is None:
            if self.credentials is None:
                # simple auth manager with all_admins: GET /auth/token hands out an admin JWT
                response = httpx.get(f"{self.url}/auth/token", timeout=30)
            else:
                username, password = self.credentials
                response = httpx.post(
                    f"{self.url}/auth/token", json={"username": username, "password": password}, timeout=30
                )
            self._token = response.raise_for_status().json()["access_token"]
        return self._token

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.url}/api/v2{path}", headers=headers, timeout=60, **kwargs)

    def api_ui(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The UI's private API (``/ui/...``), e.g. the connection form metadata."""
        headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.url}/ui{path}", headers=headers, timeout=60, **kwargs)

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            response = self.api("GET", f"/dags/{dag_id}")
            if response.status_code == 200:
                return response.json()
            errors = self.api("GET", "/importErrors").json().get("import_errors", [])
            assert not errors, f"DAG import errors: {errors}"
            assert time.monotonic() < deadline, (
                f"DAG {dag_id} not parsed after {timeout_s} s:\n{self.tails()}"
            )
            time.sleep(1)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Trigger a DAG run the way the UI's trigger form does; return the DAG run id."""
        self.wait_for_dag(dag_id)
        body = {"logical_date": None, "conf": conf or {}}
        response = self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").raise_for_status().json()

    def wait_dag_run(
        self, dag_id: str, run_id: str, states: set[str], timeout_s: float = 300
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.dag_run(dag_id, run_id)
            if run["state"] in states:
                return run
            assert time.monotonic() < deadline, (
                f"DAG run {dag_id}/{run_id} still {run['state']}:\n{self.tails()}"
            )
            time.sleep(1)

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return (
            self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
            .raise_for_status()
            .json()
        )

    def wait_task(
        self, dag_id: str, run_id: str, task_id: str, states: set[str], timeout_s: float = 300
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            ti = self.task_instance(dag_id, run_id, task_id)
            if ti["state"] in states:
                return ti
            assert time.monotonic() < deadline, f"task {task_id} still {ti['state']}:\n{self.tails()}"
            time.sleep(0.5)

    def wait_task_log(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, *needles: str, timeout_s: float = 30
    ) -> str:
        """The task log once it contains any of ``needles`` (the worker may still be writing the last
        lines when the task instance already shows its final state), else the log at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            log = self.task_log(dag_id, run_id, task_id, try_number)
            if any(n in log for n in needles) or time.monotonic() >= deadline:
                return log
            time.sleep(0.5)

    def trigger_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """What the triggerer wrote for this task try (``attempt=N.log.trigger.<job id>.log``)."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        return "".join(
            p.read_text(errors="replace") for p in sorted(folder.glob(f"attempt={try_number}.log.trigger.*"))
        )

    def wait_trigger_running(
        self, dag_id: str, run_id: str, task_id: str, try_number: int, timeout_s: float = 60
    ) -> None:
        """Wait until the triggerer has started the deferred task's trigger.

        Between "deferred" and this point, a user's "mark failed" deletes the trigger before it
        runs, and Airflow (3.3) calls ``on_kill`` only for triggers it has started.
        """
        deadline = time.monotonic() + timeout_s
        while "starting" not in self.trigger_log(dag_id, run_id, task_id, try_number):
            assert time.monotonic() < deadline, f"trigger of {task_id} not started:\n{self.tails()}"
            time.sleep(0.2)

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> httpx.Response:
        """What "Mark as failed/success" in the UI does."""
        return self.api(
            "PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}", json={"new_state": state}
        )

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str) -> Any:
        response = self.api(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        )
        if response.status_code == 404:
            return None
        return response.raise_for_status().json()["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The task log as the UI shows it: one JSON record per line (message, level, error detail)."""
        response = self.api(
            "GET",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        content = response.raise_for_status().json().get("content", [])
        return "\n".join(json.dumps(item) if isinstance(item, dict) else str(item) for item in content)

    # -- processes ---------------------------------------------------------------------------
    def pids(self) -> set[int]:
        """Every live process of the cluster (the started ones and all their descendants)."""
        out: set[int] = set()
        for proc in self.processes.values():
            if not proc.alive():
                continue
            try:
                root = psutil.Process(proc.pid)
                out.add(root.pid)
                out.update(c.pid for c in root.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        return out

    def tails(self) -> str:
        return "\n".join(f"--- {name} ---\n{p.tail(1500)}" for name, p in self.processes.items())

    def explain_task(self, dag_id: str, run_id: str, task_id: str, max_lines: int = 40) -> str:
        """For a failure message: the task instance as the API has it, its log files (name, bytes),
        the tail of its log as the UI shows it, and every daemon's log lines naming the DAG run."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        files = [f"{p.name}: {p.stat().st_size} B" for p in sorted(folder.glob("*"))] if folder.is_dir() else []
        ti = self.task_instance(dag_id, run_id, task_id)
        lines = [f"task instance: {json.dumps(ti)[:1500]}", f"log files: {files}"]
        lines.append("task log tail:\n" + self.task_log(dag_id, run_id, task_id, ti["try_number"])[-3000:])
        for name, proc in self.processes.items():
            try:
                text = proc.log_path.read_text(errors="replace")
            except FileNotFoundError:
                continue
            mine = [line for line in text.splitlines() if run_id in line][-max_lines:]
            lines.append(f"--- {name}: {len(mine)} lines naming {run_id} ---\n" + "\n".join(mine))
        return "\n".join(lines)

    def stop(self) -> None:
        for name in ("scheduler", "triggerer", "dag-processor", "api-server"):
            if name in self.processes:
                self.processes[name].stop()


def listening_sockets(pids: set[int]) -> list[tuple[int, str]]:
    """``(pid, local address)`` of TCP listeners owned by ``pids``, read from ``ss -ltnp``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 5:
            continue
        local = cols[3]
        for pid in re.findall(r"pid=(\d+)", line):
            if int(pid) in pids:
                found.append((int(pid), local))
    return found


def _airflow_env(
    home: Path, port: int, kfp_url: str, pipelines: dict[str, Path], training_pipeline: Path
) -> dict[str, str]:
    conn = json.dumps(
        {"conn_type": "kubeflow_pipelines", "host": kfp_url, "extra": {"request_timeout_s": 30}}
    )
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "0",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": os.urandom(16).hex(),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "3",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_KUBEFLOW_PIPELINES_DEFAULT": conn,
        "TRAINFLOW_TRAINING_PIPELINE": str(training_pipeline),  # the real one, for trainflow_training
        "TRAINFLOW_TEST_PIPELINES": str(pipelines["training_pipeline"].parent),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def start_airflow(
    home: Path,
    kfp_url: str,
    pipelines: dict[str, Path],
    training_pipeline: Path,
    *,
    dag_files: list[Path] | None = None,
    extra_env: dict[str, str] | None = None,
) -> AirflowCluster:
    """Migrate the DB and start the four components; raise with their logs if they do not come up.

    ``dag_files`` replaces the default dags folder (the training example DAG and the test DAGs);
    ``extra_env`` is added to every component's environment.
    """
    dags = home / "dags"
    dags.mkdir(parents=True)
    for dag_file in dag_files if dag_files is not None else [EXAMPLE_DAG, *TEST_DAGS.glob("*.py")]:
        shutil.copy(dag_file, dags / dag_file.name)
    port = free_port()
    env = {**_airflow_env(home, port, kfp_url, pipelines, training_pipeline), **(extra_env or {})}
    full_env = {**os.environ, **env}
    migrate = subprocess.run(
        [_airflow_bin(), "db", "migrate"], env=full_env, capture_output=True, text=True, timeout=600
    )
    assert migrate.returncode == 0, (
        f"airflow db migrate failed:\n{migrate.stdout[-3000:]}\n{migrate.stderr[-3000:]}"
    )

    cluster = AirflowCluster(home=home, url=f"http://127.0.0.1:{port}", env=env)
    logs = home / "process-logs"
    specs = {
        "api-server": [
            _airflow_bin(),
            "api-server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        "scheduler": [_airflow_bin(), "scheduler", "--skip-serve-logs"],
        "dag-processor": [_airflow_bin(), "dag-processor"],
        "triggerer": [_airflow_bin(), "triggerer", "--skip-serve-logs"],
    }
    try:
        cluster.processes["api-server"] = ManagedProcess(
            "api-server",
            specs["api-server"],
            log_dir=logs,
            env=env,
            ready=lambda: http_ok(f"{cluster.url}/api/v2/monitor/health"),
            ready_timeout_s=240,
            stop_timeout_s=20,
        ).start()
        for name in ("scheduler", "dag-processor", "triggerer"):
            cluster.processes[name] = ManagedProcess(
                name, specs[name], log_dir=logs, env=env, stop_timeout_s=30
            ).start()
        deadline = time.monotonic() + 240
        while True:
            health = httpx.get(f"{cluster.url}/api/v2/monitor/health", timeout=30).json()
            states = {c: (health.get(c) or {}).get("status") for c in COMPONENTS}
            if all(s == "healthy" for s in states.values()):
                break
            for name, proc in cluster.processes.items():
                assert proc.alive(), f"{name} exited:\n{proc.tail()}"
            assert time.monotonic() < deadline, f"Airflow not healthy: {states}\n{cluster.tails()}"
            time.sleep(2)
        # The api-server builds the execution API's versioned routes (Cadwyn) on its first request,
        # blocking for 15-40 s here; the first task's "start" call would time out (5 s), be re-sent,
        # get 400 "already running" and lose the try. Build them now.
        httpx.get(f"{cluster.url}/execution/health", timeout=600).raise_for_status()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="package")
def airflow_cluster(
    tmp_path_factory: pytest.TempPathFactory,
    kfp_server: KfpServer,
    compiled_pipelines: dict[str, Path],
    training_pipeline_package: Path,
) -> Iterator[AirflowCluster]:
    cluster = start_airflow(
        tmp_path_factory.mktemp("airflow_home"), kfp_server.url, compiled_pipelines, training_pipeline_package
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def artifacts_dir(name: str) -> Path:
    """A folder for files a test keeps after it ends (screenshots): ``$TRAINFLOW_TEST_ARTIFACTS/<name>``,
    by default ``build/test-artifacts/<name>`` in the checkout (git-ignored; CI archives
    ``build/test-artifacts/``). Emptied first, so it shows the last run only."""
    folder = artifacts_root() / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def sign_in(browser: Any, url: str, username: str, password: str) -> None:
    """Sign in on the simple auth manager's login page, as a user would."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{url}/")
    user = WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: next(iter(d.find_elements(By.NAME, "username")), None)
    )
    user.send_keys(username)
    secret = browser.find_element(By.NAME, "password")
    secret.send_keys(password)
    secret.send_keys(Keys.ENTER)
    WebDriverWait(browser, 120, poll_frequency=0.5).until(lambda d: "/auth/login" not in d.current_url)


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,900",
)


@pytest.fixture()
def chromium(tmp_path: Path) -> Iterator[Any]:
    """Debian's headless Chromium driven by selenium through Debian's chromedriver (fresh profile)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail("chromium and chromium-driver are missing: run scripts/install-system-deps.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    browser = webdriver.Chrome(
        service=Service(driver, log_output=str(tmp_path / "chromedriver.log")), options=options
    )
    browser.set_page_load_timeout(120)
    try:
        yield browser
    finally:
        browser.quit()
