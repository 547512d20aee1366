"""End to end on the real node (issue 9, items 4c, 4d, 4d2): the GPU scheduler resizes a training job.

The train step (``components.training.step.run_train_step``, what the KFP ``train`` component runs,
in a child process) creates an elastic PyTorchJob (elasticPolicy 1..2, 1 process and 1
``nvidia.com/gpu`` per worker pod, gloo on CPU: the node advertises the GPUs as an extended
resource) on the bed's real node and hosts its rendezvous store; the workers read the dataset and
write checkpoints, metrics and their sample logs on the MinIO at the node's host address.

The controller is the real command line, ``python -m gpu_scheduler run``, reading a real Prometheus
that scrapes the trainer pods' ``/metrics`` directly on the pod network (the pods the monitoring
component's PodMonitor selects: managed, container port ``metrics``; :class:`TrainerPodTargets`),
plus the simulated DCGM exporter for GPU activity.
The test chooses the policy through the controller's ConfigMap (``test-admit`` / ``test-shrink`` /
``test-grow`` / ``test-keep`` of tests/gpu_scheduler/policies_for_tests.py), each switch made only
once the job was seen training at the size before it, so no step depends on timing. The controller
starts under ``test-admit``: under ``test-keep`` a job the controller sees before its pods are
bound is queued (suspended) and waits, as that policy says.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cluster_path_realnode import placement_settings
from tests.integration.test_e2e_realnode import JobWatch, committed_steps
from tests.support.controller_log import log_records, ticks
from tests.support.k8s import (
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    BackgroundPoll,
    KubeTestBed,
    pytorchjob_resource,
    wait_until,
)
from tests.support.lifetime import die_with_parent
from tests.support.processes import free_port
from tests.support.realnode import RealNode
from tests.support.realnode_s3 import S3_SECRET_NAME
from tests.support.s3 import S3Server

pytestmark = [pytest.mark.realnode, pytest.mark.k8s, pytest.mark.s3, pytest.mark.prometheus, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
POLICY_CONFIGMAP = "trainflow-gpu-scheduler-policy"
INTERVAL_STEPS = 10
GLOBAL_BATCH = 64
WORKER_CPU_MILLI = 500
#: Each step sleeps this long after its work (``throttle_step_s``), so the job lasts long enough
#: for the resizes whatever the machine's load (digits: 1,437 training samples, 23 steps an epoch).
THROTTLE_STEP_S = 0.2
#: Steps the test waits to see at each world size before it acts again.
STEPS_AT_EACH_SIZE = 5


# --------------------------------------------------------------------------------- the train step


def train_step_main(args_path: str) -> int:
    """Child process: ``run_train_step`` with the JSON arguments in ``args_path``; writes the
    summary next to them. Exit 0 on success, 1 with the one-line reason on a failed step."""
    import faulthandler
    import logging

    from components.training.step import TrainStepError, run_train_step

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # TrainStep.result: where a hung step waits
    from trainflow.common.training_spec import TrainJobSpec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = json.loads(Path(args_path).read_text())
    spec = TrainJobSpec.build(**args["fields"])
    try:
        result = run_train_step(spec, model_dir=Path(args["model_dir"]), work_dir=Path(args["work_dir"]))
    except TrainStepError as e:
        print(f"train step failed: {e}", flush=True)
        return 1
    Path(args["result"]).write_text(json.dumps({"job_key": result.job_key, **result.summary.to_dict()}))
    return 0


@dataclass
class TrainStep:
    """The train step's child process and where it leaves its results."""

    proc: subprocess.Popen[str]
    job_key: str
    bucket: str
    out: Path

    @property
    def job_root(self) -> str:
        return f"s3://{self.bucket}/ckpt/{self.job_key}"

    def log_tail(self, chars: int = 8000) -> str:
        """The step's log (its own lines and the worker pods' streamed ones), the per-step sample
        id lists left out."""
        lines = (self.out / "step.log").read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if '"ids"' not in line)[-chars:]

    def result(self, timeout_s: float, describe: Callable[[], str] = lambda: "") -> dict[str, Any]:
        """The step's summary once it exits 0.

        Raises:
            AssertionError: it failed, or still ran after ``timeout_s`` (then killed); the message
                carries its log and ``describe()`` (the cluster's side).
        """
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            state = describe()  # before the kill: the step's SIGTERM deletes the job
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)  # every thread's stack into the log
                time.sleep(2)
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            written = (self.out / "result.json").exists()
            raise AssertionError(f"the train step still ran after {timeout_s:.0f} s (result.json written: "
                                 f"{written})\n{state}\nthe step's log:\n{self.log_tail(12000)}") from None
        assert self.proc.returncode == 0, f"train step exit {self.proc.returncode}:\n{self.log_tail()}"
        return json.loads((self.out / "result.json").read_text())

    def metrics(self) -> list[dict[str, Any]]:
        from components.training.metrics import read_jsonl

        return read_jsonl(f"{self.job_root}/metrics")


# ------------------------------------------------------------------------------------ the world


@dataclass
class World:
    bed: KubeTestBed
    node: RealNode
    s3: S3Server
    namespace: str
    prometheus: Any
    controller_log: Path
    controller: subprocess.Popen[bytes]
    tmp_path: Path
    digits: Path
    steps: list[TrainStep] = field(default_factory=list)

    @property
    def client(self) -> Any:
        return self.bed.client()

    def set_policy(self, policy: str) -> float:
        """Switch the controller's policy through its ConfigMap; returns the time of the switch."""
        from lightkube.resources.core_v1 import ConfigMap
        from lightkube.types import PatchType

        data = {"policy.yaml": f"policy: {policy}\nparams: {{}}\ninterval_s: 1\n"}
        self.client.patch(ConfigMap, POLICY_CONFIGMAP, {"data": data}, namespace=self.namespace,
                          patch_type=PatchType.MERGE)
        return time.time()

    def start_train_step(self, name: str, *, epochs: int, sample_log: bool = False) -> TrainStep:
        """The train step in a child process; with ``sample_log``, every rank logs the sample ids of
        each step under ``<job root>/samples`` on MinIO."""
        from components.training.step import RDZV_HOST_ENV

        bucket = self.s3.make_bucket("sched")
        out = self.tmp_path / name
        out.mkdir()
        job_key = f"sched-{name}-{time.time_ns()}"
        fields = {
            "dataset_path": str(self.digits), "dataset_uri": str(self.digits), "backend": "pytorchjob",
            "epochs": epochs, "global_batch_size": GLOBAL_BATCH, "job_key": job_key, "kfp_run_id": job_key,
            "kfp_task_name": "train", "checkpoint_uri": f"s3://{bucket}/ckpt",
            "checkpoint_interval_steps": INTERVAL_STEPS, "checkpoint_interval_s": 0, "image": self.node.image,
            "namespace": self.namespace, "min_workers": 1, "max_workers": 2, "nproc_per_node": 1,
            "gpus_per_worker": 1, "worker_cpu": f"{WORKER_CPU_MILLI}m", "worker_memory": "2Gi",
            "s3_secret_name": S3_SECRET_NAME, "s3_endpoint_url": self.s3.endpoint_url, "poll_interval_s": 2.0,
            "worker_pod_settings": placement_settings(self.node),
            "runtime": {"throttle_step_s": THROTTLE_STEP_S,
                        **({"sample_log_dir": f"s3://{bucket}/ckpt/{job_key}/samples"} if sample_log else {})},
        }
        args = out / "args.json"
        args.write_text(json.dumps({"fields": fields, "model_dir": str(out / "model"), "work_dir": str(out / "work"),
                                    "result": str(out / "result.json")}))
        env = {**os.environ, **self.s3.env(), "KUBECONFIG": str(self.bed.kubeconfig), RDZV_HOST_ENV: self.node.host_ip,
               "PYTHONPATH": str(REPO)}
        code = ("import sys; from tests.integration.test_e2e_scheduler_realnode import train_step_main; "
                "sys.exit(train_step_main(sys.argv[1]))")
        with (out / "step.log").open("w") as log:
            proc = subprocess.Popen([*die_with_parent(), sys.executable, "-c", code, str(args)], stdout=log, stderr=subprocess.STDOUT,
                                    text=True, cwd=REPO, env=env, start_new_session=True)
        self.steps.append(TrainStep(proc=proc, job_key=job_key, bucket=bucket, out=out))
        return self.steps[-1]

    def stop_train_steps(self) -> None:
        """A test that failed midway leaves its train step running: SIGTERM (the step deletes its
        job, as on a KFP terminate), SIGKILL after a minute."""
        for step in self.steps:
            if step.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(step.proc.pid, signal.SIGTERM)
                try:
                    step.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(step.proc.pid, signal.SIGKILL)
                    step.proc.wait()

    # -- what the test watches -----------------------------------------------------------------

    def job(self, name: str) -> Any:
        return self.client.get(pytorchjob_resource(), name, namespace=self.namespace)

    def replicas(self, name: str) -> int:
        return self.job(name)["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]

    def trainer(self, job_key: str) -> tuple[int, int] | None:
        """``(world size, step)`` of the job's rank 0 as Prometheus scraped it from the pod last."""
        found = {}
        for gauge in ("world_size", "step"):
            result = self.prometheus.query(f'max(last_over_time(trainflow_{gauge}{{job_key="{job_key}"}}[3s]))')
            if not result:
                return None
            found[gauge] = int(float(result[0]["value"][1]))
        return found["world_size"], found["step"]

    def wait_training_at(self, step: TrainStep, world_size: int, *, after_step: int = -1,
                         steps: int = STEPS_AT_EACH_SIZE, timeout_s: float = 240) -> int:
        """Until Prometheus shows the job's rank 0 ``steps`` steps past ``after_step`` (or past the
        first step seen) at ``world_size``; returns that step."""
        first: list[int] = []

        def check() -> int | None:
            seen = self.trainer(step.job_key)
            if seen is None or seen[0] != world_size or seen[1] <= after_step:
                return None
            if not first:
                first.append(seen[1])
            return seen[1] if seen[1] >= first[0] + steps else None

        return self.wait_for(step, check, timeout_s, f"{steps} steps at world size {world_size} (after {after_step}); "
                                                  f"last seen {self.trainer(step.job_key)}")

    def wait_for(self, step: TrainStep, predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if step.proc.poll() is not None:
                log = (step.out / "step.log").read_text(errors="replace")
                raise AssertionError(f"the train step ended (rc {step.proc.returncode}) before {what}:\n{log[-4000:]}")
            value = predicate()
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.describe(step)}\n"
                             f"the step's log:\n{step.log_tail(4000)}")

    def job_name(self, step: TrainStep) -> str:
        def created() -> str | None:
            jobs = list(self.client.list(pytorchjob_resource(), namespace=self.namespace))
            return jobs[0].metadata.name if jobs else None

        return self.wait_for(step, created, 300, "the PyTorchJob")

    def controller_actions(self, name: str, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
        """The controller's ``action applied`` log records of ``kinds`` for job ``name``, in order."""
        return [rec for rec in log_records(self.controller_log)
                if rec.get("msg") == "action applied" and rec.get("action") in kinds
                and str(rec.get("job", "")).endswith(f"/{name}")]

    def describe(self, step: TrainStep) -> str:
        """What a failure message needs from the cluster: the namespace's PyTorchJobs (replicas,
        conditions), their pods (phase, restarts, how the last container ended), the latest events,
        the trainer as Prometheus saw it last, and the controller's last log lines."""
        from lightkube.resources.core_v1 import Event, Pod

        out = []
        with contextlib.suppress(Exception):
            for job in self.client.list(pytorchjob_resource(), namespace=self.namespace):
                conditions = [(c.get("type"), c.get("status"), c.get("reason"))
                              for c in (job.get("status") or {}).get("conditions") or []]
                out.append(f"PyTorchJob {job.metadata.name}: Worker replicas "
                           f"{job['spec']['pytorchReplicaSpecs']['Worker'].get('replicas')}, "
                           f"runPolicy {job['spec'].get('runPolicy')}, conditions {conditions}")
        with contextlib.suppress(Exception):
            for pod in self.client.list(Pod, namespace=self.namespace):
                statuses = [(c.name, c.restartCount, c.state.to_dict() if c.state else None,
                             c.lastState.to_dict() if c.lastState else None)
                            for c in (pod.status.containerStatuses or [])]
                out.append(f"pod {pod.metadata.name}: {pod.status.phase} "
                           f"deleting={pod.metadata.deletionTimestamp is not None} {statuses}")
        with contextlib.suppress(Exception):
            events = sorted(self.client.list(Event, namespace=self.namespace),
                            key=lambda e: str(e.lastTimestamp or e.eventTime or ""))
            out += [f"event {e.lastTimestamp} {e.involvedObject.name} {e.reason}: {e.message}" for e in events[-20:]]
        with contextlib.suppress(Exception):
            out.append(f"Prometheus last saw (world size, step) = {self.trainer(step.job_key)}")
        out.append(self.controller_tail())
        return "\n".join(out)

    def controller_tail(self) -> str:
        """The controller's last log lines; a controller still running is first asked for every
        thread's stack (SIGUSR1, ``faulthandler``), so a loop that stopped coming round shows where."""
        if self.controller.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.controller.send_signal(signal.SIGUSR1)
            with contextlib.suppress(TimeoutError):
                wait_until(lambda: "Current thread 0x" in self.controller_log.read_text(errors="replace"),
                           timeout_s=5, what="the controller's stack dump")
            state = "running (its threads' stacks follow the log lines)"
        else:
            state = f"exited with rc {self.controller.returncode}"
        lines = self.controller_log.read_text(errors="replace").splitlines()
        stacks = next((i for i, line in enumerate(lines) if line.startswith(("Thread 0x", "Current thread 0x"))),
                      len(lines))
        return (f"the controller, {state}; its last log lines:\n" + "\n".join(lines[:stacks][-15:])
                + ("\n" + "\n".join(lines[stacks:]) if stacks < len(lines) else ""))

    def wait_controller_ticking(self, timeout_s: float = 90) -> None:
        """Until the controller has logged a tick (its caches synced and its loop came round)."""
        def ticked() -> bool:
            if self.controller.poll() is not None:
                raise AssertionError(f"the controller exited before its first tick\n{self.controller_tail()}")
            return ticks(self.controller_log) > 0

        try:
            wait_until(ticked, timeout_s=timeout_s, what="the controller's first tick")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.controller_tail()}") from None

    def events(self, name: str) -> list[Any]:
        from lightkube.resources.core_v1 import Event

        return [e for e in self.client.list(Event, namespace=self.namespace, fields={"involvedObject.name": name})
                if e.source and e.source.component == "trainflow-gpu-scheduler"]


class TrainerPodTargets(BackgroundPoll):
    """Prometheus targets for the trainer pods, found as the monitoring component's PodMonitor
    finds them: pods labelled ``MANAGED_LABEL=true`` (``trainflow.dev/managed``) that run, on their container port
    ``metrics``, labelled ``namespace`` / ``pod``. Debian's Prometheus is built without
    ``kubernetes_sd_configs``, so this thread polls the API server and writes the targets to a
    ``file_sd_configs`` file (replaced atomically); Prometheus then scrapes the pods directly (pod
    IPs are routed from this host to the node's bridge)."""

    interval_s = 0.5
    thread_name = "trainer-targets"

    def __init__(self, client: Any, namespace: str, path: Path) -> None:
        self.client, self.namespace, self.path = client, namespace, path
        self.path.write_text("[]")
        self._written = "[]"

    def scrape_config(self) -> dict[str, Any]:
        return {"job_name": "trainers", "file_sd_configs": [{"files": [str(self.path)], "refresh_interval": "1s"}]}

    def targets(self) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        from components.launcher.pytorchjob import MANAGED_LABEL, METRICS_PORT_NAME

        out = []
        for pod in self.client.list(Pod, namespace=self.namespace, labels={MANAGED_LABEL: "true"}):
            if not (pod.status and pod.status.phase == "Running" and pod.status.podIP):
                continue
            for container in pod.spec.containers:
                for port in container.ports or []:
                    if port.name == METRICS_PORT_NAME:
                        out.append({"targets": [f"{pod.status.podIP}:{port.containerPort}"],
                                    "labels": {"namespace": self.namespace, "pod": pod.metadata.name}})
        return sorted(out, key=lambda t: t["labels"]["pod"])

    def poll(self) -> None:
        text = json.dumps(self.targets())
        if text != self._written:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.path)
            self._written = text


@pytest.fixture
def world(k8s_testbed: KubeTestBed, real_node: RealNode, real_node_env: S3Server, s3_namespace: str,
          prometheus_server: Any, dcgm_exporter: Any, digits_dataset: Path, tmp_path: Path) -> Iterator[World]:
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ConfigMap

    from tests.gpu_scheduler.test_controller_k8s import own_client

    exporter = dcgm_exporter()
    # GPU activity only: the trainers' own metrics come from their pods.
    exporter.follow(k8s_testbed.kubeconfig, s3_namespace, trainer_metrics=False)
    trainers = TrainerPodTargets(own_client(k8s_testbed), s3_namespace, tmp_path / "trainer-targets.json")
    prometheus = prometheus_server([exporter.target], scrape_interval_s=1.0, scrape_configs=[trainers.scrape_config()])
    k8s_testbed.client().create(ConfigMap(metadata=ObjectMeta(name=POLICY_CONFIGMAP, namespace=s3_namespace),
                                          data={"policy.yaml": "policy: test-admit\nparams: {}\ninterval_s: 1\n"}))
    log_path = tmp_path / "controller.log"
    argv = [sys.executable, "-m", "gpu_scheduler", "run", f"--prometheus-url={prometheus.url}",
            f"--kubeconfig={k8s_testbed.kubeconfig}", f"--watch-namespace={s3_namespace}",
            "--plugin=tests.gpu_scheduler.policies_for_tests", "--policy=test-admit",
            f"--policy-configmap={POLICY_CONFIGMAP}", "--interval-s=1", "--metrics-window-s=5",
            "--pending-timeout-s=20", "--rollback-hold-s=600", "--no-leader-election",
            "--metrics-addr=127.0.0.1", f"--metrics-port={free_port()}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "POD_NAMESPACE": s3_namespace}
    with log_path.open("wb") as log:
        controller = subprocess.Popen([*die_with_parent(), *argv], stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                      start_new_session=True)
    world = World(bed=k8s_testbed, node=real_node, s3=real_node_env, namespace=s3_namespace, prometheus=prometheus,
                  controller_log=log_path, controller=controller, tmp_path=tmp_path, digits=digits_dataset)
    try:
        with trainers:
            world.wait_controller_ticking()
            yield world
    finally:
        world.stop_train_steps()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(controller.pid, signal.SIGTERM)
        try:
            controller.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()
        exporter.stop_following()


def first_step_at(records: list[dict[str, Any]], world_size: int, after_s: float) -> dict[str, Any]:
    return next(r for r in records if "loss" in r and r["world_size"] == world_size and r["time"] > after_s)


# ------------------------------------------------------------------------------ 4c: 2 -> 1 -> 2 -> 1


def test_controller_resizes_a_training_job_from_prometheus_and_every_sample_is_trained_once_per_epoch(
    world: World,
) -> None:
    """Issue 9, 4c. The job starts at its maximum (2 workers); the controller, told by the policy
    in its ConfigMap, scales it 2 -> 1 -> 2 -> 1 within elasticPolicy. The trainer re-rendezvouses
    at each size (Prometheus, scraping the trainer pods, sees world sizes 2, 1, 2, 1), the job
    finishes, and the sample log — every rank's records on MinIO — shows every training sample of
    every epoch exactly once in the final lineage. Figure: scale decision -> first step at the new
    world size."""
    from components.training.data import PreparedDataset
    from components.training.metrics import read_jsonl

    epochs = 12
    step = world.start_train_step("resize", epochs=epochs, sample_log=True)
    name = world.job_name(step)
    # Each switch waits until the job was seen training at the size before it.
    at = world.wait_training_at(step, 2)
    # What the controller reads was scraped from the trainer's pod, not from the exporter.
    (series,) = world.prometheus.query(f'trainflow_step{{job_key="{step.job_key}"}}')
    assert series["metric"]["pod"].startswith(f"{name}-worker-"), series
    for policy, size in (("test-shrink", 1), ("test-grow", 2), ("test-shrink", 1)):
        world.set_policy(policy)
        world.wait_for(step, lambda size=size: world.replicas(name) == size, 60,
                    f"the controller to scale {name} to {size} ({policy})")
        at = world.wait_training_at(step, size, after_step=at)
    world.set_policy("test-keep")
    result = step.result(timeout_s=900, describe=lambda: world.describe(step))

    steps_per_epoch = -(-len(PreparedDataset(world.digits).split("train")) // GLOBAL_BATCH)
    assert result["steps"] == epochs * steps_per_epoch, result
    # The controller made exactly these three changes, within elasticPolicy 1..2.
    actions = world.controller_actions(name, ("ScaledUp", "ScaledDown"))
    assert [(a["action"], a["from_workers"], a["to_workers"]) for a in actions] == [
        ("ScaledDown", 2, 1), ("ScaledUp", 1, 2), ("ScaledDown", 2, 1)], actions
    assert [e.reason for e in world.events(name)].count("ScaledUp") == 1
    # The trainer re-rendezvoused at each size: its world sizes over time, from its own records.
    records = step.metrics()
    sizes = [r["world_size"] for r in records if "loss" in r]
    phases = [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s]
    assert phases == [2, 1, 2, 1], phases
    # Every sample of every epoch once, in the final lineage (a step's last execution wins: an
    # incarnation's steps after the checkpoint the next one resumed from were rolled back).
    samples = read_jsonl(f"{step.job_root}/samples")
    latest: dict[int, float] = {}
    for r in samples:
        latest[r["step"]] = max(latest.get(r["step"], 0.0), r["incarnation_started"])
    lineage = [r for r in samples if r["incarnation_started"] == latest[r["step"]]]
    assert sorted(latest) == list(range(1, epochs * steps_per_epoch + 1)), "steps missing from the sample log"
    n_train = len(PreparedDataset(world.digits).split("train"))
    for epoch in range(epochs):
        seen_ids = collections.Counter(i for r in lineage if r["epoch"] == epoch for i in r["ids"])
        assert sorted(seen_ids) == list(range(n_train)), f"epoch {epoch}: samples skipped"
        assert set(seen_ids.values()) == {1}, f"epoch {epoch}: samples trained twice"
    # One resume per resize, each from a checkpoint losing at most one interval.
    assert [(r["world_size_before"], r["world_size_after"]) for r in result["resumes"]] == [(2, 1), (1, 2), (2, 1)]
    assert all(0 <= r["lost_steps"] <= INTERVAL_STEPS for r in result["resumes"]), result["resumes"]
    lineage_sizes = {r["world_size"] for r in lineage}
    assert lineage_sizes == {1, 2}, lineage_sizes
    # Figure (not asserted): each decision -> the first step at the new world size.
    figures = [first_step_at(records, a["to_workers"], a["ts"])["time"] - a["ts"] for a in actions]
    print("FIGURE scale decision -> first step at the new world size: "
          + ", ".join(f"{a['from_workers']}->{a['to_workers']} {f:.1f} s" for a, f in zip(actions, figures, strict=True))
          + f"; resumes {result['resumes']}")


# ------------------------------------------------------------------ 4d: a scale-up that cannot bind


def test_a_scale_up_whose_pod_cannot_schedule_is_rolled_back_and_the_job_trains_on(world: World) -> None:
    """Issue 9, 4d. At one worker, the node's CPU is taken by another pod (GPUs stay free, so the
    policy sees room); ``test-grow`` scales the job to 2, the new worker stays Pending
    (``Insufficient cpu``), and after ``--pending-timeout-s`` the controller rolls the scale-up back
    (Warning ``ScaleUpRolledBack``, a hold on growing). The job kept training at world size 1
    throughout, went on after the rollback, and succeeded."""
    from lightkube.resources.core_v1 import Node, Pod

    from gpu_scheduler.kube import ANNOTATION_PREFIX

    epochs = 10
    step = world.start_train_step("rollback", epochs=epochs)
    name = world.job_name(step)
    with JobWatch(world.client, world.namespace) as watch:
        at = world.wait_training_at(step, 2)
        world.set_policy("test-shrink")
        world.wait_for(step, lambda: world.replicas(name) == 1, 60, "the controller to scale the job to 1")
        at = world.wait_training_at(step, 1, after_step=at)
        # Take the node's free CPU, less than one worker's request, with a pod that wants no GPU.
        node = world.client.get(Node, "trainflow-real-node")
        allocatable = _milli(node.status.allocatable["cpu"])
        used = sum(_milli(((c.resources.requests if c.resources else None) or {}).get("cpu", "0"))
                   for p in world.client.list(Pod, namespace="*", fields={"spec.nodeName": node.metadata.name})
                   if p.status and p.status.phase in ("Pending", "Running") for c in p.spec.containers)
        blocker = allocatable - used - WORKER_CPU_MILLI // 2
        assert blocker > 0, (allocatable, used)
        world.client.create(Pod.from_dict({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-blocker", "namespace": world.namespace},
            "spec": {**world.node.pod_placement(), "terminationGracePeriodSeconds": 0,
                     "securityContext": RESTRICTED_POD_SECURITY,  # s3_namespace enforces "restricted"
                     "containers": [{"name": "sleep", "image": world.node.image, "imagePullPolicy": "IfNotPresent",
                                     "command": ["sleep", "3600"], "securityContext": RESTRICTED_CONTAINER_SECURITY,
                                     "resources": {"requests": {"cpu": f"{blocker}m"}}}]}}))
        wait_until(lambda: world.client.get(Pod, "cpu-blocker", namespace=world.namespace).spec.nodeName,
                   timeout_s=60, what="the CPU blocker to be bound")
        world.set_policy("test-grow")
        world.wait_for(step, lambda: world.replicas(name) == 2, 60, "the controller to scale the job up to 2")
        world.wait_for(step, lambda: _unschedulable(world, f"{name}-worker-1"), 60, "worker 1 to be Unschedulable")
        world.wait_for(step, lambda: world.replicas(name) == 1, 120, "the controller to roll the scale-up back")
        hold = json.loads(world.job(name).metadata.annotations[ANNOTATION_PREFIX + "hold"])
        assert hold["max_workers"] == 1, hold
        rolled_back_at = world.trainer(step.job_key)
        assert rolled_back_at is not None and rolled_back_at[0] == 1, rolled_back_at
        # It trains on after the rollback, still at world size 1 (the hold keeps test-grow off it).
        world.wait_training_at(step, 1, after_step=rolled_back_at[1])
        assert world.replicas(name) == 1
        world.client.delete(Pod, "cpu-blocker", namespace=world.namespace)
        result = step.result(timeout_s=900, describe=lambda: world.describe(step))
    steps_per_epoch = -(-len(_train_split(world)) // GLOBAL_BATCH)
    assert result["steps"] == epochs * steps_per_epoch, result
    actions = world.controller_actions(name, ("ScaledUp", "ScaledDown", "ScaleUpRolledBack"))
    assert [(a["action"], a["from_workers"], a["to_workers"]) for a in actions] == [
        ("ScaledDown", 2, 1), ("ScaledUp", 1, 2), ("ScaleUpRolledBack", 1, 1)], actions  # from = bound workers
    (warning,) = [e for e in world.events(name) if e.reason == "ScaleUpRolledBack"]
    assert warning.type == "Warning", warning
    assert "1 worker pod(s) still not bound" in warning.message and "after scaling 1->2" in warning.message, (
        warning.message)
    # One job throughout; worker 1 never ran again after the scale-down (it stayed Pending).
    assert len(watch.job_uids) == 1, watch.job_names
    records = step.metrics()
    assert [r["world_size"] for r in records if "loss" in r and r["time"] > actions[1]["ts"]] and {
        r["world_size"] for r in records if "loss" in r and r["time"] > actions[1]["ts"]} == {1}
    print(f"FIGURE rollback: scale-up -> rollback {actions[2]['ts'] - actions[1]['ts']:.1f} s "
          f"(--pending-timeout-s 20); steps at the rollback {rolled_back_at[1]}, total {result['steps']}")


def _milli(quantity: str) -> int:
    return int(float(quantity[:-1])) if quantity.endswith("m") else int(float(quantity) * 1000)


def _unschedulable(world: World, pod_name: str) -> bool:
    from lightkube.resources.core_v1 import Pod

    try:
        pod = world.client.get(Pod, pod_name, namespace=world.namespace)
    except Exception:
        return False
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable" for c in conditions)


def _train_split(world: World) -> Any:
    from components.training.data import PreparedDataset

    return PreparedDataset(world.digits).split("train")


# --------------------------------------------------------------- 4d2: GPUs per worker, 1 -> 2


def test_the_controller_changes_gpus_per_worker_and_the_job_resumes_from_its_newest_checkpoint(
    world: World,
) -> None:
    """Issue 9, 4d2. The job runs as 2 workers x 1 GPU; annotated
    ``gpu-scheduler.trainflow.dev/gpus-per-worker: "2"``, the controller suspends it, waits until its
    pods are gone, patches the Worker template (``nvidia.com/gpu`` 2, ``nprocPerNode`` 2) and
    resumes it as 1 worker x 2 GPUs (same total). The pod is recreated with the new request on the
    real node, and training resumes from the newest checkpoint, losing at most one interval."""
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import PatchType

    from gpu_scheduler.actuate.plan import GPUS_PER_WORKER_REQUEST

    epochs = 10
    step = world.start_train_step("reshape", epochs=epochs)
    name = world.job_name(step)
    with JobWatch(world.client, world.namespace) as watch:
        world.wait_training_at(step, 2)
        world.set_policy("test-keep")  # from here on the controller alone sizes the job (the reshape)
        before = world.wait_for(step, lambda: (c := committed_steps(world.s3, step.bucket, step.job_key)) and
                             len(c) >= 2 and c, 240, "two committed checkpoints")
        old_pods = {p.metadata.uid for p in world.client.list(Pod, namespace=world.namespace,
                                                               labels={"training.kubeflow.org/job-name": name})}
        t_request = time.time()
        world.client.patch(pytorchjob_resource(), name, {"metadata": {"annotations": {GPUS_PER_WORKER_REQUEST: "2"}}},
                           namespace=world.namespace, patch_type=PatchType.MERGE)
        newest_at_request = committed_steps(world.s3, step.bucket, step.job_key)[-1]

        def reshaped() -> Any:
            pods = [p for p in world.client.list(Pod, namespace=world.namespace,
                                                 labels={"training.kubeflow.org/job-name": name})
                    if p.metadata.deletionTimestamp is None and p.metadata.uid not in old_pods]
            running = [p for p in pods if p.status and p.status.phase == "Running"]
            return running if len(running) == 1 and len(pods) == 1 else None

        (pod,) = world.wait_for(step, reshaped, 240, "one recreated worker pod running")
        resources = pod.spec.containers[0].resources
        assert resources.limits["nvidia.com/gpu"] == "2", resources
        job = world.job(name)
        assert job["spec"]["nprocPerNode"] == "2" and world.replicas(name) == 1, job["spec"]  # a string in v1
        assert not job["spec"]["runPolicy"].get("suspend")
        world.wait_training_at(step, 2, after_step=newest_at_request - 1)  # 1 pod x 2 ranks
        result = step.result(timeout_s=900, describe=lambda: world.describe(step))
    steps_per_epoch = -(-len(_train_split(world)) // GLOBAL_BATCH)
    assert result["steps"] == epochs * steps_per_epoch, result
    assert len(watch.job_uids) == 1, watch.job_names
    actions = world.controller_actions(name, ("ReshapeSuspended", "Reshaped"))
    assert [a["action"] for a in actions] == ["ReshapeSuspended", "Reshaped"], actions
    # Resumed from the newest checkpoint at the request or a newer one (the SIGTERM save), losing
    # at most one checkpoint interval.
    assert result["resumes"], result
    for resume in result["resumes"]:
        assert resume["resumed_from_step"] >= before[-1], (before, result["resumes"])
        assert resume["lost_steps"] is not None and 0 <= resume["lost_steps"] <= INTERVAL_STEPS, result["resumes"]
    records = step.metrics()
    first = first_step_at(records, 2, actions[1]["ts"])
    print(f"FIGURE reshape: request -> first step on the reshaped pod {first['time'] - t_request:.1f} s "
          f"(suspend {actions[0]['ts'] - t_request:.1f} s, resume {actions[1]['ts'] - t_request:.1f} s); "
          f"resumes {result['resumes']}")
