"""Permanent failures end the job with exit 2 and one line, and stay permanent through torchrun
(review findings 6 and 12); a run whose job key another run took over stops (finding 2).
Real processes: lone ``python -m components.training`` and ``python -m components.training.torchrun``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.training.__main__ import transient_storage_failure
from components.training.checkpoint import layout
from components.training.checkpoint.manager import CheckpointManager
from components.training.data import DatasetError
from components.training.launch import AgentSpec, run_agent
from components.training.metrics import read_jsonl
from components.training.sources import prepare
from tests.support.processes import free_port
from trainflow.storage import CheckpointStorageError, ObjectNotFoundError, write_bytes
from trainflow.storage.local import LocalStorage
from trainflow.storage.s3 import S3Settings, S3Storage

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def _train(dataset, tmp_path, *extra: str, key: str = "ident") -> list[str]:
    return [sys.executable, "-m", "components.training", "--dataset", str(dataset), "--checkpoint-uri",
            str(tmp_path / "ckpt"), "--job-key", key, "--epochs", "1", "--global-batch-size", "32",
            "--threads-per-rank", "1", "--checkpoint-interval-steps", "5", *extra]


def test_resume_refuses_a_checkpoint_of_another_dataset_or_model(digits_dataset, tmp_path) -> None:
    """Finding 6: same job key, the data fixed (another fingerprint, same shapes), or another model."""
    first = subprocess.run(_train(digits_dataset, tmp_path, "--max-steps", "5"), capture_output=True, text=True,
                           timeout=240)
    assert first.returncode == 0, first.stderr[-2000:]
    other = tmp_path / "digits-fixed"
    prepare("digits", other, test_fraction=0.25, seed=1)  # same images' shape and classes, other split
    rerun = subprocess.run(_train(other, tmp_path, "--max-steps", "10"), capture_output=True, text=True, timeout=240)
    assert rerun.returncode == 2 and "Traceback" not in rerun.stderr
    last = rerun.stderr.strip().splitlines()[-1]
    assert last.startswith(f"trainflow: the checkpoint at step 5 under {tmp_path / 'ckpt' / 'ident'} was written "
                           "for another dataset ") and last.endswith("start afresh under another --job-key")
    model = subprocess.run(_train(digits_dataset, tmp_path, "--max-steps", "10", "--model-name", "resnet18"),
                           capture_output=True, text=True, timeout=240)
    assert model.returncode == 2
    assert "was written for another model small_cnn (this run: resnet18)" in model.stderr.strip().splitlines()[-1]


def test_resume_refuses_another_optimizer_and_follows_a_change_of_mixed_precision(digits_dataset, tmp_path) -> None:
    """Review (2026-11-29): a resume with another --optimizer loaded SGD's state into AdamW (or failed
    with a traceback, retried until torchrun gave up); one with --amp fp16 over a checkpoint saved
    without it died on the grad scaler's empty state (RuntimeError, exit 1)."""
    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(_train(digits_dataset, tmp_path, *extra, key="optim"), capture_output=True, text=True,
                              timeout=240)

    first = run("--max-steps", "5")
    assert first.returncode == 0, first.stderr[-2000:]
    adamw = run("--max-steps", "10", "--optimizer", "adamw")
    assert adamw.returncode == 2 and "Traceback" not in adamw.stderr, adamw.stderr[-2000:]
    last = adamw.stderr.strip().splitlines()[-1]
    assert "was written for another optimizer SGD (this run: AdamW)" in last, last
    fp16 = run("--max-steps", "10", "--amp", "fp16")
    assert fp16.returncode == 0, fp16.stderr[-2000:]
    assert "was saved without --amp fp16: the loss scale starts afresh" in fp16.stderr
    back = run("--max-steps", "15")  # and back: the fp16 checkpoint's loss scale is left behind
    assert back.returncode == 0, back.stderr[-2000:]


def test_a_task_state_that_could_never_be_loaded_back_fails_at_its_first_save(digits_dataset, tmp_path) -> None:
    """Review (2026-11-29): a task whose state holds a ``collections.deque`` trained and committed
    checkpoints that every resume then skipped as corrupt (rolling training back to step 0)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-m", "components.training", "--task",
                          "tests.trainflow.example_tasks:WithDequeState", "--checkpoint-uri", str(tmp_path / "ckpt"),
                          "--job-key", "deque", "--epochs", "1", "--global-batch-size", "16", "--threads-per-rank", "1",
                          "--checkpoint-interval-steps", "2", "--max-steps", "4"],
                         capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("trainflow: this checkpoint could never be loaded back (Unsupported global: GLOBAL "
                           "collections.deque)"), last
    assert CheckpointManager(LocalStorage(str(tmp_path / "ckpt" / "deque"))).committed_steps() == []


def _failed_ranks(stderr: str) -> int:
    """Workers that printed their permanent failure (one line each, ``trainflow: ...``). The ranks
    share stderr: each line must be written whole (print() wrote text and newline apart, and two
    ranks' lines once ran together into one, counted 1 here)."""
    return sum(line.startswith("trainflow: dataset") for line in stderr.splitlines())


def test_a_permanent_worker_failure_stays_permanent_through_torchrun(tmp_path) -> None:
    """Finding 12: torchrun restarts the group, then exits 1; the wrapper and run_agent give back 2,
    and the wrapper does not restart the group first (a pod's restarts cost 10-20 s each)."""
    args = ["--dataset", str(tmp_path / "no-such-dataset"), "--checkpoint-uri", str(tmp_path / "ckpt"),
            "--job-key", "perm", "--threads-per-rank", "1"]
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "--max-restarts", "1", "--monitor-interval", "0.2", "-m", "components.training", *args],
                           capture_output=True, text=True, timeout=240)
    assert plain.returncode == 1  # what torchrun itself makes of it
    # torchrun restarted the group: more failures than ranks (the restarted group's second rank may
    # be stopped before it prints, once the first has failed).
    assert _failed_ranks(plain.stderr) > 2, plain.stderr[-3000:]
    wrapped = subprocess.run([sys.executable, "-m", "components.training.torchrun", "--standalone",
                              "--nproc-per-node", "2", "--max-restarts", "3", "--monitor-interval", "0.2",
                              "-m", "components.training", *args], capture_output=True, text=True, timeout=240)
    assert wrapped.returncode == 2
    assert wrapped.stderr.strip().splitlines()[-1].startswith("permanent failure, not retried: trainflow: ")
    assert "no-such-dataset" in wrapped.stderr.strip().splitlines()[-1]
    # Not restarted: each rank failed once, although 3 restarts were allowed.
    assert _failed_ranks(wrapped.stderr) == 2, wrapped.stderr[-3000:]
    spec = AgentSpec(rdzv_id="perm", rdzv_endpoint=f"127.0.0.1:{free_port()}", nproc_per_node=2, max_restarts=1)
    assert run_agent(spec, args, log_path=tmp_path / "agent.log") == 2


def test_a_run_whose_key_was_taken_over_stops(digits_dataset, tmp_path) -> None:
    """Finding 2: an old run still training (an orphaned PyTorchJob, a resubmission during CANCELING)
    stops writing, and stops, once a newer run claimed the job key."""
    metrics = tmp_path / "metrics.jsonl"
    proc = subprocess.Popen(_train(digits_dataset, tmp_path, "--throttle-step-s", "0.1", "--metrics-path",
                                   str(metrics), key="zombie"), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not any(r.get("event") == "checkpoint_committed" for r in read_jsonl(metrics)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        storage = LocalStorage(str(tmp_path / "ckpt" / "zombie"))
        write_bytes(storage, layout.writer_key(2), b"{}", create_only=True)  # what a newer run's claim writes
        assert proc.wait(120) == 2
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stderr.strip().splitlines()[-1].startswith("trainflow: writer generation 2 took over this job key "
                                                      "from generation 1")
    records = read_jsonl(metrics)
    failed = [r for r in records if r.get("event") == "checkpoint_failed"]
    assert len(failed) == 1 and failed[0]["fenced"] is True
    assert max(r["step"] for r in records if "loss" in r) < 45  # it stopped long before the end


def test_the_pod_command_keeps_exit_codes_the_operator_can_act_on(tmp_path) -> None:
    """PyTorchJob workers run ``python -m components.training.torchrun`` under ``restartPolicy:
    ExitCode`` (retryable: 128 and above). Plain torchrun exits 1 when SIGTERMed (a deleted or
    scaled-down pod), which the operator would take as a permanent failure of the whole job; the
    wrapper exits 143. A permanent failure's reason goes to the termination message."""
    import os
    import signal

    worker = tmp_path / "worker.py"
    worker.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
                      "print('worker up', flush=True)\n"
                      "time.sleep(120)\n")
    torchrun = ["--standalone", "--nproc-per-node", "1", "--monitor-interval", "0.2", str(worker)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    codes = {}
    for name, module in (("plain", "torch.distributed.run"), ("wrapped", "components.training.torchrun")):
        proc = subprocess.Popen([sys.executable, "-m", module, *torchrun], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # the worker runs: torchrun is past its rendezvous
                if "worker up" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            codes[name] = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert codes == {"plain": 1, "wrapped": 143}

    said = tmp_path / "termination-log"
    said.write_text("")  # the kubelet creates the file; the wrapper only writes to one that exists
    code = ("import sys; from pathlib import Path; from components.training.torchrun import main; "
            "log = Path(sys.argv.pop(1)); sys.exit(main(sys.argv[1:], termination_log=log))")
    args = ["--dataset", str(tmp_path / "no-such-dataset"), "--checkpoint-uri", str(tmp_path / "ckpt"),
            "--job-key", "perm", "--threads-per-rank", "1"]
    proc = subprocess.run([sys.executable, "-c", code, str(said), "--standalone", "--nproc-per-node", "1",
                           "--max-restarts", "0", "--monitor-interval", "0.2", "-m", "components.training", *args],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-2000:]
    text = said.read_text()
    assert text.startswith("permanent failure, not retried: trainflow: ") and "no-such-dataset" in text
    assert "\n" not in text.strip()


@pytest.mark.parametrize(("first_exit", "expected"), [(143, {"plain": 1, "wrapped": 0}),
                                                      (1, {"plain": 1, "wrapped": 1})])
def test_a_restart_after_another_pods_graceful_departure_is_free(tmp_path, first_exit, expected) -> None:
    """Review 2026-11-30: when another pod of the job leaves gracefully (scale-down, pod deletion), every
    rank here saves and exits 143 (EXIT_PREEMPTED) without this agent being signalled. torchrun counts
    the restart that follows against --max-restarts, so with the default 3 the fourth scale-down failed
    the job; the wrapper does not count it, as torchrun does not count a node joining. Any other failure
    still counts: with --max-restarts 0 it ends the agent."""
    worker = tmp_path / "worker.py"
    worker.write_text("import sys\nfrom pathlib import Path\n"
                      "runs = Path(sys.argv[1]); n = len(runs.read_text()) if runs.exists() else 0\n"
                      "runs.write_text('x' * (n + 1))\n"
                      f"sys.exit({first_exit} if n == 0 else 0)\n")
    codes = {}
    for name, module in (("plain", "torch.distributed.run"), ("wrapped", "components.training.torchrun")):
        runs = tmp_path / f"runs-{name}"
        proc = subprocess.run([sys.executable, "-m", module, "--standalone", "--nproc-per-node", "1",
                               "--max-restarts", "0", "--monitor-interval", "0.2", str(worker), str(runs)],
                              capture_output=True, text=True, timeout=240, cwd=REPO)
        codes[name] = proc.returncode
        assert len(runs.read_text()) == (2 if codes[name] == 0 else 1), proc.stderr[-2000:]
    assert codes == expected


def test_ranks_sharing_stderr_write_their_permanent_failure_lines_whole(tmp_path) -> None:
    """Two ranks failing at once share the pod's stderr: each ``trainflow: ...`` line arrives whole."""
    start_at = time.time() + 3  # both ranks write at once, as after one rendezvous
    code = ("import sys, time; from components.training.__main__ import _permanent\n"
            f"time.sleep(max(0, {start_at} - time.time()))\n"
            "for i in range(2000): _permanent(sys.argv[1] * 60)\n")
    # Unbuffered, as in a container with PYTHONUNBUFFERED=1 (our image, KFP's task pods, the tests).
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", code, letter], stderr=write, env=env, cwd=REPO)
             for letter in "ab"]
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = pipe.read().splitlines()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert sorted(set(lines)) == ["trainflow: " + "a" * 60, "trainflow: " + "b" * 60], (
        [x for x in lines if x not in ("trainflow: " + "a" * 60, "trainflow: " + "b" * 60)][:3])
    assert len(lines) == 4000


def _storage_failure(cause: BaseException | None) -> CheckpointStorageError:
    """A storage failure the way the backends raise one: a one-line error, the cause chained."""
    try:
        if cause is None:
            raise CheckpointStorageError("TRAINFLOW_S3_SECRET_DIR=/nope is not a folder")
        raise CheckpointStorageError(f"checking s3://b/ckpt failed: {cause}") from cause
    except CheckpointStorageError as e:
        return e


def _client_error(status: int, code: str) -> BaseException:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


def _dataset_error_from(failure: BaseException) -> DatasetError:
    try:
        raise DatasetError(f"cannot read dataset s3://b/data: {failure}") from failure
    except DatasetError as e:
        return e


def _transient_cases() -> list:
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ParamValidationError,
        ReadTimeoutError,
    )

    return [
        ("503 SlowDown", _storage_failure(_client_error(503, "SlowDown")), True),
        ("503 ServiceUnavailable", _storage_failure(_client_error(503, "ServiceUnavailable")), True),
        ("500 InternalError", _storage_failure(_client_error(500, "InternalError")), True),
        ("429", _storage_failure(_client_error(429, "TooManyRequests")), True),
        ("409 ConditionalRequestConflict", _storage_failure(_client_error(409, "ConditionalRequestConflict")), True),
        ("endpoint unreachable", _storage_failure(EndpointConnectionError(endpoint_url="http://minio:9000")), True),
        ("connect timeout", _storage_failure(ConnectTimeoutError(endpoint_url="http://minio:9000")), True),
        ("read timeout", _storage_failure(ReadTimeoutError(endpoint_url="http://minio:9000")), True),
        ("local EIO", _storage_failure(OSError(5, "Input/output error")), True),
        ("local ESTALE", _storage_failure(OSError(116, "Stale file handle")), True),
        ("dataset read during an outage", _dataset_error_from(_storage_failure(_client_error(503, "SlowDown"))), True),
        ("403 AccessDenied", _storage_failure(_client_error(403, "AccessDenied")), False),
        ("403 InvalidAccessKeyId", _storage_failure(_client_error(403, "InvalidAccessKeyId")), False),
        ("400 ExpiredToken", _storage_failure(_client_error(400, "ExpiredToken")), False),
        ("404 NoSuchBucket", _storage_failure(_client_error(404, "NoSuchBucket")), False),
        ("no credentials", _storage_failure(NoCredentialsError()), False),
        ("bad parameters", _storage_failure(ParamValidationError(report="Invalid bucket name")), False),
        ("local folder read-only", _storage_failure(OSError(30, "Read-only file system")), False),
        ("local folder not permitted", _storage_failure(OSError(13, "Permission denied")), False),
        ("refusal without a cause", _storage_failure(None), False),
        ("missing object", ObjectNotFoundError("s3://b/data/dataset.json does not exist"), False),
        ("dataset missing", DatasetError("dataset folder /nope does not exist"), False),
        ("not a storage failure", ValueError("bad URI"), False),
        # the trainer's "final checkpoint not saved" wraps the storage's error: sorted by the inner one
        ("wrapped outage", _wrapped(_storage_failure(OSError(5, "Input/output error"))), True),
        ("wrapped refusal without a cause", _wrapped(_storage_failure(None)), False),
        ("wrapped denial", _wrapped(_storage_failure(_client_error(403, "AccessDenied"))), False),
    ]


def _wrapped(inner: BaseException) -> CheckpointStorageError:
    outer = CheckpointStorageError("the final checkpoint at step 10 was not saved under s3://b/k: ...")
    outer.__cause__ = inner
    return outer


def test_storage_failures_sort_into_transient_and_permanent() -> None:
    """Only rejected credentials, a missing bucket and misconfiguration are permanent (exit 2); an
    outage (unreachable, timeouts, 5xx/429, local EIO) is retried (before: every storage failure at
    start was permanent, so a MinIO pod restart during a worker restart failed the job for good)."""
    got = {name: transient_storage_failure(error) for name, error, _ in _transient_cases()}
    assert got == {name: expected for name, _, expected in _transient_cases()}


@pytest.mark.s3
def test_a_storage_outage_at_worker_start_is_retried_and_a_refusal_is_permanent(s3_server, s3_bucket, digits_dataset,
                                                                              tmp_path) -> None:
    """MinIO restarting while a worker (re)starts: exit 1 (torchrun restarts the group), no permanent
    record in torchelastic's error file; once MinIO is back the same command trains. Rejected
    credentials and a missing bucket stay exit 2 with one line."""
    def worker(*, key: str, extra_env: dict[str, str] | None = None, bucket: str = s3_bucket,
               more: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, Path]:
        error_file = tmp_path / f"error-{key}.json"
        env = {**os.environ, **s3_server.env(), **(extra_env or {}), "TORCHELASTIC_ERROR_FILE": str(error_file)}
        cmd = [sys.executable, "-m", "components.training", "--dataset", str(digits_dataset), "--checkpoint-uri",
               f"s3://{bucket}/ckpt", "--job-key", key, "--threads-per-rank", "1", "--global-batch-size", "32", *more]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240), error_file

    s3_server.stop()
    try:
        down, error_file = worker(key="outage")
    finally:
        s3_server.start()
    assert down.returncode == 1 and "Traceback" not in down.stderr, down.stderr[-2000:]
    last = down.stderr.strip().splitlines()[-1]
    assert last.startswith("trainflow: storage unavailable for now, the worker group is restarted: "
                           f"S3 endpoint unreachable for s3://{s3_bucket}/ckpt/outage at {s3_server.endpoint_url}")
    assert not error_file.exists()  # nothing tells torchrun's caller that this failure is permanent
    back, _ = worker(key="outage", more=("--max-steps", "3", "--checkpoint-interval-steps", "3"))
    assert back.returncode == 0, back.stderr[-2000:]
    assert CheckpointManager(S3Storage(f"s3://{s3_bucket}/ckpt/outage", S3Settings(
        endpoint_url=s3_server.endpoint_url, access_key=s3_server.access_key,
        secret_key=s3_server.secret_key))).committed_steps() == [3]

    for key, kwargs, reason in (
        ("creds", {"extra_env": {"AWS_SECRET_ACCESS_KEY": "wrong-secret"}}, "S3 credentials rejected checking"),
        ("bucket", {"bucket": "no-such-bucket-here"}, "S3 bucket 'no-such-bucket-here' does not exist"),
    ):
        refused, error_file = worker(key=key, **kwargs)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert refused.stderr.strip().splitlines()[-1].startswith(f"trainflow: {reason}")
        recorded = json.loads(error_file.read_text())["message"]
        assert recorded["extraInfo"]["trainflow_exit_code"] == "2" and reason in recorded["message"]
