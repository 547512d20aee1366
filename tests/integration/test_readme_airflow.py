"""The README's Airflow section, as a new user meets it: its commands run as written, then the
Trigger form is used in headless Chromium.

The module fixture copies nothing from the README: it extracts the block marked ``<!-- tested:
tests/integration/test_readme_airflow.py ...`` and runs it with bash, line by line (``bash -e``),
in a fresh folder that links to the checkout's files (so ``$PWD/runs/airflow`` is new), with
a clean environment: no ``AIRFLOW_*`` variables, the venv not on ``PATH`` until the block
activates it, and ``KFP_PORT``/``AIRFLOW_PORT`` set to free ports (the README's documented knobs;
the defaults 8080/8888 may be taken on a shared machine). At the end it runs the README's stop line
in the environment the block left, and checks that every process it started is gone.

Then, as the README tells a user to:

* sign in as ``admin`` with the password from ``simple_auth_manager_passwords.json.generated``;
  the UI lists one DAG, ``trainflow_training``, unpaused, and everything listens on 127.0.0.1;
* press Trigger and submit the form **unchanged**: the run succeeds with the pipeline's defaults,
  the task's page links to the KFP run, and clicking the link opens it;
* change ``epochs`` in the form: the KFP run receives it as a JSON integer.

Screenshots of the form, the task page and the KFP run page are kept in
``build/test-artifacts/airflow-ui/`` (``$TRAINFLOW_TEST_ARTIFACTS`` overrides the root).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import httpx
import psutil
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from airflow_bridge.identity import TaskIdentity
from airflow_bridge.links.kfp import KfpRunLink
from airflow_bridge.package import load_pipeline_package
from tests.support.airflow import AirflowCluster, artifacts_dir, listening_sockets, sign_in
from tests.support.processes import free_port

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
START_MARKER = "<!-- tested: tests/integration/test_readme_airflow.py"
STOP_MARKER = "<!-- tested: the stop line -->"
DAG_ID = "trainflow_training"
SECTIONS = ("Training", "Checkpointing", "Advanced")


def readme_block(marker: str) -> str:
    """The first ```bash block after ``marker`` in the README, as written."""
    text = (REPO / "README.md").read_text()
    assert marker in text, f"README.md lost its marker {marker!r}"
    found = re.search(r"```bash\n(.*?)```", text[text.index(marker) :], re.S)
    assert found, f"no bash block after {marker!r}"
    return found.group(1)


def run_block(block: str, cwd: Path, env: dict[str, str], log: Path, *, timeout_s: float) -> dict[str, str]:
    """Run ``block`` with ``bash -e`` (each line as typed; ``-x`` echoes them into ``log``); return
    the environment it leaves, as the user's shell would keep it."""
    env_file = log.with_suffix(".env")
    script = f"{block}\nenv -0 > {shlex.quote(str(env_file))}\n"
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", "-e", "-x", "-c", script], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            timeout=timeout_s,
        )
    assert done.returncode == 0, f"the README block failed (exit {done.returncode}):\n{log.read_text()[-6000:]}"
    pairs = (item.split("=", 1) for item in env_file.read_bytes().decode().split("\0") if "=" in item)
    return dict(pairs)


@dataclass
class ReadmeAirflow:
    cluster: AirflowCluster
    kfp_url: str
    home: Path
    password: str
    shots: Path


def _fresh_checkout_view(folder: Path) -> None:
    """``folder`` holds links to the checkout's files, as a clone would, with no ``runs/``."""
    for entry in REPO.iterdir():
        if entry.name in ("runs", "build", ".git") or (entry.name.startswith(".") and entry.name != ".venv"):
            continue
        (folder / entry.name).symlink_to(entry)


def _clean_env(kfp_port: int, airflow_port: int) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRAINFLOW", "VIRTUAL_ENV"))}
    keep["PATH"] = "/usr/local/bin:/usr/bin:/bin"  # the block's first line activates the venv
    return {**keep, "KFP_PORT": str(kfp_port), "AIRFLOW_PORT": str(airflow_port), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="module")
def readme_airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReadmeAirflow]:
    work = tmp_path_factory.mktemp("readme-airflow")
    checkout = work / "checkout"
    checkout.mkdir()
    _fresh_checkout_view(checkout)
    kfp_port, airflow_port = free_port(), free_port()
    env = _clean_env(kfp_port, airflow_port)
    home = checkout / "runs" / "airflow"
    shell_env: dict[str, str] | None = None
    try:
        shell_env = run_block(readme_block(START_MARKER), checkout, env, work / "start.log", timeout_s=900)
        assert shell_env["AIRFLOW_HOME"] == str(home)
        passwords = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
        start_log = (work / "start.log").read_text()
        assert f"password {passwords['admin']}" in start_log  # the start line prints the login
        url = f"http://127.0.0.1:{airflow_port}"
        cluster = AirflowCluster(home=home, url=url, env={}, credentials=("admin", passwords["admin"]))
        yield ReadmeAirflow(
            cluster=cluster,
            kfp_url=f"http://127.0.0.1:{kfp_port}",
            home=home,
            password=passwords["admin"],
            shots=artifacts_dir("airflow-ui"),
        )
    finally:
        pids = _started_pids(home)
        stop_env = shell_env or {**env, "AIRFLOW_HOME": str(home), "PATH": f"{REPO / '.venv' / 'bin'}:{env['PATH']}"}
        try:
            run_block(readme_block(STOP_MARKER), checkout, stop_env, work / "stop.log", timeout_s=300)
        finally:
            left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            for pid in left:  # a failed stop must not leave servers behind
                os.killpg(pid, 9)
        assert not left, f"the README's stop line left {left} running:\n{(work / 'stop.log').read_text()}"
        assert not list((home / "pids").glob("*.pid"))


def _started_pids(home: Path) -> list[int]:
    return [int(p.read_text()) for p in (home / "pids").glob("*.pid")] if (home / "pids").is_dir() else []


def _process_tree(pids: list[int]) -> set[int]:
    out: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        out.add(pid)
        out.update(c.pid for c in root.children(recursive=True))
    return out


# -- the form, as a user works it ----------------------------------------------------------------
def open_trigger_form(browser, env: ReadmeAirflow):
    browser.get(f"{env.cluster.url}/dags/{DAG_ID}")
    WebDriverWait(browser, 120, poll_frequency=0.5).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "button[aria-label='Trigger Dag']")
    )[0].click()
    return WebDriverWait(browser, 60, poll_frequency=0.5).until(
        lambda d: next((x for x in d.find_elements(By.CSS_SELECTOR, "[role=dialog]") if "Trigger Dag" in x.text), None)
    )


def section_button(dialog, title: str):
    return next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == title)


def open_section(browser, dialog, title: str) -> None:
    button = section_button(dialog, title)
    if button.get_attribute("aria-expanded") != "true":
        button.click()
    WebDriverWait(browser, 30).until(lambda d: section_button(dialog, title).get_attribute("aria-expanded") == "true")


def submit(browser, dialog) -> str:
    """Press the form's Trigger button; return the DAG run id the UI navigates to."""
    button = next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Trigger")
    assert button.is_enabled(), "the Trigger button is disabled: the form does not validate"
    button.click()
    WebDriverWait(browser, 120, poll_frequency=0.5).until(lambda d: f"/dags/{DAG_ID}/runs/" in d.current_url)
    return unquote(browser.current_url.split("/runs/", 1)[1].split("/", 1)[0])


def kfp_runs(env: ReadmeAirflow, run_id: str) -> list[dict]:
    marker = TaskIdentity(DAG_ID, run_id, "train").marker
    flt = json.dumps({"predicates": [{"key": "display_name", "operation": "IS_SUBSTRING", "string_value": marker}]})
    body = httpx.get(f"{env.kfp_url}/apis/v2beta1/runs", params={"filter": flt}, timeout=30).raise_for_status()
    return body.json().get("runs") or []


def wait_kfp_run(env: ReadmeAirflow, run_id: str, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while not (runs := kfp_runs(env, run_id)):
        assert time.monotonic() < deadline, f"no KFP run for {run_id}"
        time.sleep(1)
    return runs[0]


def test_the_readme_gives_a_signed_in_ui_with_only_the_trainflow_dag(readme_airflow, chromium) -> None:
    env = readme_airflow
    sign_in(chromium, env.cluster.url, "admin", env.password)
    chromium.get(f"{env.cluster.url}/dags")
    WebDriverWait(chromium, 120, poll_frequency=0.5).until(lambda d: d.find_elements(By.LINK_TEXT, DAG_ID))
    chromium.save_screenshot(str(env.shots / "01-dags.png"))
    dag = env.cluster.wait_for_dag(DAG_ID)
    assert dag["is_paused"] is False
    dags = env.cluster.api("GET", "/dags").raise_for_status().json()
    assert [d["dag_id"] for d in dags["dags"]] == [DAG_ID], "examples or other DAGs are loaded"
    sockets = listening_sockets(_process_tree(_started_pids(env.home)))
    assert sockets and all(addr.startswith("127.0.0.1:") for _, addr in sockets), sockets


def test_the_form_submitted_unchanged_trains_and_links_to_the_run(
    readme_airflow, chromium, training_pipeline_package
) -> None:
    env = readme_airflow
    chromium.set_window_size(1400, 2400)  # the whole form in each screenshot
    sign_in(chromium, env.cluster.url, "admin", env.password)
    dialog = open_trigger_form(chromium, env)
    for i, title in enumerate(SECTIONS, start=2):
        open_section(chromium, dialog, title)
        chromium.save_screenshot(str(env.shots / f"0{i}-form-{title.lower()}.png"))
    shown = {e.get_attribute("name").removeprefix("element_") for e in dialog.find_elements(By.CSS_SELECTOR, "[name^=element_]")}
    assert {"epochs", "learning_rate", "checkpoint_interval_steps", "fault_at_step"} <= shown
    assert not shown & {"image", "namespace", "s3_secret_name", "job_key", "checkpoint_uri", "registry_uri"}
    run_id = submit(chromium, dialog)

    dag_run = env.cluster.wait_dag_run(DAG_ID, run_id, {"success", "failed"}, timeout_s=1500)
    assert dag_run["state"] == "success", env.cluster.task_log(DAG_ID, run_id, "train", 1)[-6000:]
    # on the first try: a new user's first run must not need Airflow's retry
    assert env.cluster.task_instance(DAG_ID, run_id, "train")["try_number"] == 1
    (kfp_run,) = kfp_runs(env, run_id)
    assert kfp_run["state"] == "SUCCEEDED"
    declared = load_pipeline_package(training_pipeline_package).parameters
    expected = {k: p.default for k, p in declared.items()} | {"job_key": TaskIdentity(DAG_ID, run_id, "train").key}
    assert kfp_run["runtime_config"]["parameters"] == expected  # the pipeline's defaults, typed
    url = f"{env.kfp_url}/#/runs/details/{kfp_run['run_id']}"
    assert env.cluster.xcom(DAG_ID, run_id, "train", "return_value") == {
        "run_id": kfp_run["run_id"], "state": "SUCCEEDED", "url": url,
    }

    chromium.set_window_size(1400, 900)
    chromium.get(f"{env.cluster.url}/dags/{DAG_ID}/runs/{run_id}/tasks/train/details")
    link = WebDriverWait(chromium, 120, poll_frequency=1).until(
        lambda d: next(iter(d.find_elements(By.LINK_TEXT, KfpRunLink.name)), None)
    )
    assert link.get_attribute("href") == url
    chromium.save_screenshot(str(env.shots / "05-task-details.png"))
    chromium.get(f"{env.cluster.url}/dags/{DAG_ID}/runs/{run_id}/tasks/train")
    WebDriverWait(chromium, 120, poll_frequency=1).until(lambda d: "KFP task train" in d.page_source)
    chromium.save_screenshot(str(env.shots / "06-task-log.png"))
    chromium.get(f"{env.cluster.url}/dags/{DAG_ID}/runs/{run_id}/tasks/train/details")
    tabs = set(chromium.window_handles)
    WebDriverWait(chromium, 120, poll_frequency=1).until(
        lambda d: next(iter(d.find_elements(By.LINK_TEXT, KfpRunLink.name)), None)
    ).click()  # as a user would: Airflow opens extra links in a new tab
    WebDriverWait(chromium, 60, poll_frequency=0.5).until(
        lambda d: set(d.window_handles) - tabs or d.current_url.startswith(env.kfp_url)
    )
    for tab in set(chromium.window_handles) - tabs:
        chromium.switch_to.window(tab)
    assert chromium.current_url == url
    WebDriverWait(chromium, 60).until(lambda d: d.find_elements(By.ID, "run-log"))
    assert chromium.find_element(By.ID, "run-state").text == "SUCCEEDED"
    chromium.save_screenshot(str(env.shots / "07-kfp-run.png"))


def test_epochs_changed_in_the_form_reach_the_run_as_an_integer(readme_airflow, chromium) -> None:
    env = readme_airflow
    sign_in(chromium, env.cluster.url, "admin", env.password)
    dialog = open_trigger_form(chromium, env)
    open_section(chromium, dialog, "Training")
    epochs = dialog.find_element(By.NAME, "element_epochs")
    epochs.send_keys(Keys.CONTROL, "a")
    epochs.send_keys("2")
    chromium.save_screenshot(str(env.shots / "08-form-epochs-2.png"))
    run_id = submit(chromium, dialog)
    try:
        kfp_run = wait_kfp_run(env, run_id)
        epochs_sent = kfp_run["runtime_config"]["parameters"]["epochs"]
        assert epochs_sent == 2 and type(epochs_sent) is int  # a JSON integer, not "2" or 2.0
        assert env.cluster.dag_run(DAG_ID, run_id)["conf"]["epochs"] == 2
    finally:  # no need to train it: mark the task failed, which terminates the KFP run
        env.cluster.wait_task(DAG_ID, run_id, "train", {"deferred", "running", "failed", "success"}, timeout_s=300)
        env.cluster.set_task_state(DAG_ID, run_id, "train", "failed")
