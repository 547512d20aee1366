"""Review findings on a real S3 server (MinIO on 127.0.0.1, marker s3): the write probe against a
policy that denies PutObject under the prefix (5), credentials re-read from a rotated Secret folder
(5), per-key errors of quiet deletes (12), unfinished multipart uploads aborted when a writer claims
the key (7), create-only writer claims with ``If-None-Match: *`` (2), the SIGTERM save's deadline
while the store is down (8), a policy that denies reading checkpoints back (a permanent resume
failure: exit 2, one line), and an abandoned verification whose download stops mid-way instead of
fetching the rest of a big object while the SIGTERM save uploads.

Restricted credentials come from MinIO's STS ``AssumeRole`` with an inline session policy (the root
user's own rights, minus what the policy denies) — MinIO's real policy engine, no admin tool needed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from components.training.__main__ import transient_storage_failure
from components.training.checkpoint.manager import CheckpointManager
from components.training.metrics import read_jsonl
from trainflow.storage import CheckpointStorageError, ReadAbandoned, read_bytes, write_bytes
from trainflow.storage.s3 import S3Settings, S3Storage

pytestmark = pytest.mark.s3


def _restricted_credentials(s3_server, bucket: str, deny: list[str], prefix: str) -> dict[str, str]:
    import boto3

    sts = boto3.client("sts", endpoint_url=s3_server.endpoint_url, aws_access_key_id=s3_server.access_key,
                       aws_secret_access_key=s3_server.secret_key, region_name=s3_server.region)
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]},
        {"Effect": "Deny", "Action": deny, "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*"]},
    ]}
    creds = sts.assume_role(RoleArn="arn:aws:iam::000000000000:role/trainflow-test", RoleSessionName="trainflow",
                            Policy=json.dumps(policy), DurationSeconds=900)["Credentials"]
    return {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
            "AWS_SESSION_TOKEN": creds["SessionToken"]}


def _storage(s3_server, uri: str, creds: dict[str, str] | None = None) -> S3Storage:
    creds = creds or {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    return S3Storage(uri, S3Settings(endpoint_url=s3_server.endpoint_url, access_key=creds["AWS_ACCESS_KEY_ID"],
                                     secret_key=creds["AWS_SECRET_ACCESS_KEY"],
                                     session_token=creds.get("AWS_SESSION_TOKEN")))


def test_check_fails_when_the_prefix_is_read_only(s3_server, s3_bucket, digits_dataset, tmp_path) -> None:
    creds = _restricted_credentials(s3_server, s3_bucket, ["s3:PutObject"], "ckpt/")
    storage = _storage(s3_server, f"s3://{s3_bucket}/ckpt/job", creds)
    storage._client.head_bucket(Bucket=s3_bucket)  # what the old check did: it passes
    with pytest.raises(CheckpointStorageError, match=r"S3 credentials rejected writing a probe object to .*AccessDenied"):
        storage.check()
    # the trainer refuses to start (exit 2, one line) instead of training for hours without checkpoints
    env = {**s3_server.env(), **creds}
    proc = subprocess.run([sys.executable, "-m", "components.training", "--dataset", str(digits_dataset),
                           "--checkpoint-uri", f"s3://{s3_bucket}/ckpt", "--job-key", "ro", "--threads-per-rank", "1"],
                          env={**__import__("os").environ, **env}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "S3 credentials rejected writing a probe object to" in proc.stderr.strip().splitlines()[-1]


def test_quiet_deletes_report_per_key_errors(s3_server, s3_bucket) -> None:
    root = _storage(s3_server, f"s3://{s3_bucket}/jobs/a")
    write_bytes(root, "step-0000000001/state.pt", b"x")
    limited = _storage(s3_server, f"s3://{s3_bucket}/jobs/a",
                       _restricted_credentials(s3_server, s3_bucket, ["s3:DeleteObject"], "jobs/"))
    with pytest.raises(CheckpointStorageError, match=r"failed for 1 key\(s\), e.g. jobs/a/step-0000000001/state.pt: AccessDenied"):
        limited.delete(["step-0000000001/state.pt"])
    assert root.list() == ["step-0000000001/state.pt"]
    root.delete(["never/existed"])  # a missing key is not an error


def test_credentials_are_reread_from_a_rotated_secret_folder(s3_server, s3_bucket, tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()

    def mount(values: dict[str, str]) -> None:  # what the kubelet does when the Secret is rotated
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            (secret / name).unlink(missing_ok=True)
        for name, value in values.items():
            (secret / name).write_text(value)

    mount(_restricted_credentials(s3_server, s3_bucket, ["s3:PutObject"], "jobs/"))
    storage = S3Storage(f"s3://{s3_bucket}/jobs/b", S3Settings(endpoint_url=s3_server.endpoint_url,
                                                                secret_dir=str(secret), credentials_refresh_s=1.0))
    with pytest.raises(CheckpointStorageError, match="AccessDenied"):
        write_bytes(storage, "obj", b"1")
    mount({"accesskey": s3_server.access_key, "secretkey": s3_server.secret_key})  # KFP's key names
    time.sleep(1.5)
    write_bytes(storage, "obj", b"2")  # the same client, new credentials
    assert read_bytes(storage, "obj") == b"2"
    assert s3_server.secret_key not in repr(storage.settings)


def test_unfinished_multipart_uploads_are_aborted_when_a_writer_claims_the_key(s3_server, s3_bucket) -> None:
    client = s3_server.client()
    left = client.create_multipart_upload(Bucket=s3_bucket, Key="ckpt/job/step-0000000005/state-g0000000001.pt")
    other = client.create_multipart_upload(Bucket=s3_bucket, Key="ckpt/other-job/step-0000000005/x")
    mgr = CheckpointManager(_storage(s3_server, f"s3://{s3_bucket}/ckpt/job"))
    mgr.claim()
    uploads = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])}
    assert left["UploadId"] not in uploads and other["UploadId"] in uploads  # only this job's leftovers


def test_writer_claims_on_s3_are_create_only(s3_server, s3_bucket) -> None:
    uri = f"s3://{s3_bucket}/ckpt/job"
    with ThreadPoolExecutor(4) as pool:
        gens = sorted(pool.map(lambda _: CheckpointManager(_storage(s3_server, uri)).claim(), range(4)))
    assert gens == [1, 2, 3, 4]
    old, new = CheckpointManager(_storage(s3_server, uri)), CheckpointManager(_storage(s3_server, uri))
    old.claim()
    new.claim()
    state = {"w": torch.ones(8)}
    assert new.save(10, state, blocking=True) == "committed"
    assert old.save(20, state, blocking=True) == "fenced"
    assert new.committed_steps() == [10]


@pytest.mark.slow
def test_sigterm_while_the_store_is_down_says_not_saved_within_the_deadline(s3_server, s3_bucket, digits_dataset,
                                                                            tmp_path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "components.training", "--dataset", str(digits_dataset), "--checkpoint-uri",
         f"s3://{s3_bucket}/ckpt", "--job-key", "deadline", "--epochs", "3", "--global-batch-size", "32",
         "--threads-per-rank", "1", "--checkpoint-interval-steps", "5", "--throttle-step-s", "0.1",
         "--metrics-path", str(metrics), "--preemption-save-deadline-s", "3"],
        env={**__import__("os").environ, **s3_server.env()}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not any(r.get("event") == "checkpoint_committed" for r in read_jsonl(metrics)):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        s3_server.stop(kill=True)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        assert proc.wait(60) == 143
        took = time.monotonic() - t0
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        s3_server.start()
    assert took < 3 + 10  # the deadline, plus leaving
    assert "checkpoint NOT saved at step" in stderr and "checkpoint saved at step" not in stderr
    assert [r["outcome"] for r in read_jsonl(metrics) if r.get("event") == "preempted"] == ["failed"]
    assert Path(metrics).exists()


@pytest.mark.slow
def test_a_policy_that_denies_reading_checkpoints_fails_the_resume_for_good(s3_server, s3_bucket, digits_dataset,
                                                                           tmp_path) -> None:
    """Credentials that may list and write under the prefix but not read (GetObject denied) pass the
    start-up check; the resume then failed with a traceback and exit 1, retried for ever. Now: exit 2
    with one line naming the object and S3's answer, recorded for torchrun's caller, and the
    checkpoint is neither skipped as corrupt (training rolled back to step 0) nor deleted."""
    def worker(creds: dict[str, str], *extra: str, error_file: Path | None = None) -> subprocess.CompletedProcess:
        env = {**__import__("os").environ, **s3_server.env(), **creds}
        env.pop("TORCHELASTIC_ERROR_FILE", None)
        if error_file is not None:
            env["TORCHELASTIC_ERROR_FILE"] = str(error_file)
        return subprocess.run([sys.executable, "-m", "components.training", "--dataset", str(digits_dataset),
                               "--checkpoint-uri", f"s3://{s3_bucket}/ckpt", "--job-key", "noread", "--epochs", "1",
                               "--global-batch-size", "32", "--threads-per-rank", "1",
                               "--checkpoint-interval-steps", "5", *extra],
                              env=env, capture_output=True, text=True, timeout=240)

    first = worker({}, "--max-steps", "5")
    assert first.returncode == 0, first.stderr[-2000:]
    error_file = tmp_path / "error.json"
    creds = _restricted_credentials(s3_server, s3_bucket, ["s3:GetObject"], "ckpt/")
    refused = worker(creds, "--max-steps", "10", error_file=error_file)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert last == (f"trainflow: reading step-0000000005/MANIFEST.json from s3://{s3_bucket}/ckpt/noread at "
                    f"{s3_server.endpoint_url} failed: An error occurred (AccessDenied) when calling the GetObject "
                    "operation: Access Denied."), last
    recorded = json.loads(error_file.read_text())["message"]
    assert recorded["extraInfo"]["trainflow_exit_code"] == "2" and recorded["message"] == last
    assert "skipping checkpoint" not in refused.stderr
    assert CheckpointManager(_storage(s3_server, f"s3://{s3_bucket}/ckpt/noread")).committed_steps() == [5]
    from botocore.exceptions import ClientError

    with pytest.raises(CheckpointStorageError) as raised:  # what the worker sorted: S3's answer is the cause
        CheckpointManager(_storage(s3_server, f"s3://{s3_bucket}/ckpt/noread", creds)).load_latest()
    cause = raised.value.__cause__
    assert isinstance(cause, ClientError) and cause.response["Error"]["Code"] == "AccessDenied"
    assert not transient_storage_failure(raised.value)


def test_a_dataset_prefix_is_read_with_read_only_credentials_and_nothing_is_written_into_it(
    s3_server, s3_bucket, monkeypatch
) -> None:
    from components.training.sources import open_source

    admin = s3_server.client()
    for name in ("a/0.png", "b/1.png"):
        admin.put_object(Bucket=s3_bucket, Key=f"data/{name}", Body=b"img")
    creds = _restricted_credentials(s3_server, s3_bucket, ["s3:PutObject", "s3:DeleteObject"], "data/")
    for key, value in {**s3_server.env(), **creds}.items():
        monkeypatch.setenv(key, value)
    source = open_source(f"s3://{s3_bucket}/data")
    assert [(rel, size) for rel, size, _ in source.list()] == [("a/0.png", 3), ("b/1.png", 3)]
    assert source.read("a/0.png") == b"img"
    keys = [o["Key"] for o in admin.list_objects_v2(Bucket=s3_bucket, Prefix="data/").get("Contents", [])]
    assert keys == ["data/a/0.png", "data/b/1.png"]


def _bucket_keys(s3_server, bucket: str) -> list[str]:
    return [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_check_probes_create_only_writes_and_leaves_no_key_behind(s3_server, s3_bucket) -> None:
    storage = _storage(s3_server, f"s3://{s3_bucket}/ckpt/job")
    storage.check()  # MinIO honours If-None-Match: *
    assert _bucket_keys(s3_server, s3_bucket) == []


def test_check_refuses_an_endpoint_that_ignores_if_none_match(s3_server, s3_bucket, monkeypatch) -> None:
    """An older Ceph RGW or a gateway that drops the header: both create-only PUTs succeed, so two
    writers could claim one generation. Simulated by stripping the header on the way to MinIO."""
    storage = _storage(s3_server, f"s3://{s3_bucket}/ckpt/job")
    put_object = storage._client.put_object
    monkeypatch.setattr(storage._client, "put_object",
                        lambda **kw: put_object(**{k: v for k, v in kw.items() if k != "IfNoneMatch"}))
    with pytest.raises(CheckpointStorageError, match=rf"^S3 endpoint {s3_server.endpoint_url} does not support "
                                                     r"create-only writes .*fencing cannot work"):
        storage.check()
    assert _bucket_keys(s3_server, s3_bucket) == []


# --------------------------------------------------------------- an abandoned read stops its download
#: A big object: 4 ranged GETs of S3Storage's 16 MiB parts, ~256 progress reports (256 KiB reads).
BIG_OBJECT_BYTES = 64 * 1024 * 1024
#: Less than one part: the download stopped inside its first ranged GET.
ONE_PART_BYTES = 16 * 1024 * 1024


def _count_downloads(storage: S3Storage, monkeypatch, on_first_bytes=None) -> dict:
    """Count what ``storage``'s downloads transfer, through a progress callback wrapped around the
    one ``open_read`` passes (if any): ``calls`` (downloads started) and ``bytes`` (what their GETs
    read). ``on_first_bytes(key)`` runs in the transfer's request thread on each download's first
    report, before the storage's own callback sees it."""
    seen = {"calls": 0, "bytes": 0}
    lock = threading.Lock()
    real = storage._client.download_fileobj

    def download_fileobj(bucket, key, fileobj, Callback=None, **kwargs):  # boto3 names it Callback
        seen["calls"] += 1
        first = threading.Event()

        def counting(n: int) -> None:
            with lock:
                seen["bytes"] += n
            if not first.is_set():
                first.set()
                if on_first_bytes is not None:
                    on_first_bytes(key)
            if Callback is not None:
                Callback(n)

        return real(bucket, key, fileobj, Callback=counting, **kwargs)

    monkeypatch.setattr(storage._client, "download_fileobj", download_fileobj)
    return seen


def test_an_abandoned_read_stops_its_download_mid_way(s3_server, s3_bucket, monkeypatch) -> None:
    """``open_read(key, abandon=event)``: set once the first bytes arrived, the download stops within
    its first part and raises ReadAbandoned (before: it fetched all 64 MiB, then yielded the file);
    an event never set changes nothing; one set before it starts makes no request at all."""
    storage = _storage(s3_server, f"s3://{s3_bucket}/ckpt/job")
    data = os.urandom(BIG_OBJECT_BYTES)
    write_bytes(storage, "big.bin", data)

    seen = _count_downloads(storage, monkeypatch)
    with storage.open_read("big.bin", abandon=threading.Event()) as f:
        assert f.read() == data
    assert seen == {"calls": 1, "bytes": BIG_OBJECT_BYTES}

    # the transfer's request thread holds its first report until the test, on another thread, abandons
    abandon, arrived = threading.Event(), threading.Event()

    def hold(key: str) -> None:
        arrived.set()
        abandon.wait(30)

    seen = _count_downloads(storage, monkeypatch, on_first_bytes=hold)
    outcome: dict = {}

    def read() -> None:
        try:
            with storage.open_read("big.bin", abandon=abandon) as f:
                outcome["read"] = len(f.read())
        except BaseException as e:
            outcome["error"] = e

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert arrived.wait(30)
    abandon.set()
    reader.join(30)
    assert not reader.is_alive()
    assert isinstance(outcome.get("error"), ReadAbandoned), (
        f"the abandoned download went on: {outcome}, {seen['bytes']} bytes transferred")
    assert not isinstance(outcome["error"], CheckpointStorageError)  # no failure: nothing to retry or report
    assert str(outcome["error"]).startswith("reading big.bin from ") and " abandoned after " in str(outcome["error"])
    transferred = seen["bytes"]
    assert 0 < transferred < ONE_PART_BYTES, f"{transferred} of {BIG_OBJECT_BYTES} bytes transferred"
    time.sleep(0.2)
    assert seen["bytes"] == transferred  # nothing goes on in the background: the transfer's threads ended

    seen = _count_downloads(storage, monkeypatch)
    with pytest.raises(ReadAbandoned, match=r"^reading big.bin from .* abandoned before it started$"), \
            storage.open_read("big.bin", abandon=abandon):
        pass
    assert seen == {"calls": 0, "bytes": 0}


def test_an_abandoned_s3_download_abandons_the_verification(s3_server, s3_bucket, monkeypatch) -> None:
    """Retention's verification (``_load_step`` with an ``abandon`` event) passes its event to S3:
    set while the state file downloads, the read stops and the verification is abandoned (the step is
    not marked good), and a later verification of the same step passes."""
    from components.training.checkpoint.manager import _VerificationAbandoned

    storage = _storage(s3_server, f"s3://{s3_bucket}/ckpt/job")
    writer = CheckpointManager(storage)
    state = {"model": {"w": torch.arange(8 << 20, dtype=torch.float32)}, "train_state": {"step": 30}}
    assert writer.save(30, state, blocking=True) == "committed"
    writer.close()
    size = next(m["size_bytes"] for n, m in writer.read_manifest(30)["files"].items() if n.startswith("state"))
    assert size > 2 * ONE_PART_BYTES

    manager = CheckpointManager(storage)
    abandon = threading.Event()

    def abandon_state_reads(key: str) -> None:
        if "/state" in key:
            abandon.set()

    seen = _count_downloads(storage, monkeypatch, on_first_bytes=abandon_state_reads)
    with pytest.raises(_VerificationAbandoned, match=r"^step-0000000030: verification abandoned while reading state"
                       ) as raised:
        manager._load_step(30, map_location="cpu", load_state=False, abandon=abandon)
    assert isinstance(raised.value.__cause__, ReadAbandoned)
    assert seen["bytes"] < ONE_PART_BYTES + 1024 * 1024  # the manifest and < one part of the state file
    assert 30 not in manager._good  # (has_good would verify it now)
    assert manager._load_step(30, map_location="cpu", load_state=False, abandon=threading.Event()).step == 30
    assert 30 in manager._good
    manager.close()
