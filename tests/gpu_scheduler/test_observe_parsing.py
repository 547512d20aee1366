"""Pure parsing of the observe layer: API objects -> kube values, Prometheus JSON -> readings, and
the controller's annotations (no servers)."""

from __future__ import annotations

import json

import pytest
from lightkube.resources.core_v1 import Node, Pod

from gpu_scheduler.kube import ANNOTATION_PREFIX, FIELD_MANAGER, JobMemo, ScaleUpWatch
from gpu_scheduler.observe.kubernetes import node_state, pod_state, pytorchjob_state
from gpu_scheduler.observe.prometheus import (
    QUERIES,
    PrometheusUnavailable,
    metrics_from_results,
    parse_vector,
)
from tests.gpu_scheduler.kube_objects import T0, node, pod, pytorchjob, vector


def test_node_state_reads_allocatable_gpus_and_schedulability() -> None:
    assert node_state(Node.from_dict(node("n0", 8))).gpus == 8
    assert node_state(Node.from_dict(node("n0", 8))).schedulable
    assert not node_state(Node.from_dict(node("n1", 8, ready=False))).schedulable
    assert not node_state(Node.from_dict(node("n2", 4, unschedulable=True))).schedulable
    plain = node("cpu-only")
    del plain["status"]["allocatable"]["nvidia.com/gpu"]
    assert node_state(Node.from_dict(plain)).gpus == 0


def test_pod_state_joins_worker_pods_to_their_job() -> None:
    p = pod_state(Pod.from_dict(pod("ns", "job-a-worker-1", job="job-a", node="n0", gpus=2, started_at=T0 + 5)))
    assert (p.job, p.worker, p.node, p.phase, p.gpus) == ("ns/job-a", True, "n0", "Running", 2)
    assert p.started_at_s == pytest.approx(T0 + 5) and p.created_at_s == pytest.approx(T0)
    pending = pod_state(Pod.from_dict(pod("ns", "job-a-worker-2", job="job-a")))
    assert not pending.bound and pending.phase == "Pending"
    other = pod_state(Pod.from_dict(pod("ns", "inference-0", gpus=1, node="n0")))
    assert other.job is None and not other.worker and other.gpus == 1
    going = pod_state(Pod.from_dict(pod("ns", "job-a-worker-0", job="job-a", node="n0", terminating=True)))
    assert going.terminating


def test_pytorchjob_state_reads_bounds_gpus_and_suspension() -> None:
    job = pytorchjob_state(pytorchjob("ns", "a", replicas=3, min_replicas=2, max_replicas=6, gpus=4, suspend=True,
                                      annotations={"x": "y"}, rv="42", started_at=T0 + 9))
    assert job is not None
    assert (job.key, job.spec_workers, job.min_workers, job.max_workers) == ("ns/a", 3, 2, 6)
    assert (job.gpus_per_worker, job.nproc_per_node, job.suspended, job.finished) == (4, 4, True, False)
    assert job.resource_version == "42" and job.uid == "uid-a" and job.started_at_s == pytest.approx(T0 + 9)
    assert job.gpu_container == 1  # the container named "pytorch", not the sidecar
    assert job.gpu_container_resources["limits"]["memory"] == "4Gi"
    assert job.metrics_key == "ns/a"


def test_pytorchjob_state_remembers_ranks_per_worker_from_the_deprecated_field() -> None:
    """Review finding (nproc): ranks per worker set only in ``elasticPolicy.nProcPerNode`` are read,
    and marked as coming from there (the planner cannot patch ``/spec/nprocPerNode`` for them)."""
    old = pytorchjob_state(pytorchjob("ns", "a", gpus=4, elastic_nproc=4))
    assert old is not None and (old.nproc_per_node, old.nproc_in_elastic_policy) == (4, True)
    new = pytorchjob_state(pytorchjob("ns", "b", gpus=4))
    assert new is not None and (new.nproc_per_node, new.nproc_in_elastic_policy) == (4, False)


def test_pytorchjob_state_defaults_and_finished_jobs() -> None:
    rigid = pytorchjob_state(pytorchjob("ns", "r", replicas=3, min_replicas=None, max_replicas=None))
    assert rigid is not None and (rigid.min_workers, rigid.max_workers) == (3, 3)
    done = pytorchjob_state(pytorchjob("ns", "d", conditions=[{"type": "Succeeded", "status": "True"}]))
    assert done is not None and done.finished
    auto = pytorchjob_state(pytorchjob("ns", "g", nproc="auto",
                                       annotations={"trainflow.dev/job-key": "runs/abc/train"}))
    assert auto is not None and auto.nproc_per_node is None and auto.metrics_key == "runs/abc/train"
    no_worker = pytorchjob("ns", "m")
    no_worker["spec"]["pytorchReplicaSpecs"] = {"Master": {"replicas": 1}}
    assert pytorchjob_state(no_worker) is None


def test_parse_vector_accepts_vectors_and_drops_nan() -> None:
    payload = vector(({"namespace": "ns", "pod": "p"}, 0.5), ({"namespace": "ns", "pod": "q"}, float("nan")))
    assert parse_vector(payload) == [({"namespace": "ns", "pod": "p"}, 0.5)]


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}, "bad_data: parse error"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "not an instant vector"),
        ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}, "malformed sample"),
        ([], "not a JSON object"),
    ],
)
def test_parse_vector_rejects_errors_with_one_line(payload: object, match: str) -> None:
    with pytest.raises(PrometheusUnavailable, match=match):
        parse_vector(payload)


def test_metrics_carry_the_busy_source_and_keep_only_stable_world_sizes() -> None:
    results = {
        "gpu_busy": [({"namespace": "ns", "pod": "a-0", "source": "gr_engine_active"}, 0.8),
                     ({"namespace": "ns", "pod": "b-0", "source": "gpu_util"}, 0.4),
                     ({"namespace": "", "pod": ""}, 0.1)],
        "samples": [({"job_key": "ns/a"}, 120.0), ({"job_key": "ns/b"}, 50.0)],
        "world_size": [({"job_key": "ns/a"}, 4.0)],  # ns/b was resized within the window
    }
    m = metrics_from_results(results, taken_at_s=T0, window_s=60)
    assert m.pods[("ns", "a-0")].busy == pytest.approx(0.8) and m.pods[("ns", "a-0")].source == "gr_engine_active"
    assert m.pods[("ns", "b-0")].busy == pytest.approx(0.4) and m.pods[("ns", "b-0")].source == "gpu_util"
    assert ("", "") not in m.pods
    assert m.jobs["ns/a"].world_size == 4 and m.jobs["ns/a"].samples_per_s == 120.0
    assert m.jobs["ns/b"].world_size is None


def test_work_left_comes_from_the_three_trainer_gauges_of_one_canned_answer() -> None:
    answer = vector(
        ({"job_key": "ns/a", "gauge": "step"}, 250.0),
        ({"job_key": "ns/a", "gauge": "total_steps"}, 1000.0),
        ({"job_key": "ns/a", "gauge": "global_batch_size"}, 512.0),
        ({"job_key": "ns/done", "gauge": "step"}, 1010.0),            # past its total: nothing left
        ({"job_key": "ns/done", "gauge": "total_steps"}, 1000.0),
        ({"job_key": "ns/done", "gauge": "global_batch_size"}, 64.0),
        ({"job_key": "ns/old", "gauge": "step"}, 10.0),              # an older trainer: no total
        ({"job_key": "ns/bad", "gauge": "step"}, 1.0),
        ({"job_key": "ns/bad", "gauge": "total_steps"}, 10.0),
        ({"job_key": "ns/bad", "gauge": "global_batch_size"}, 0.0),   # nonsense batch: ignored
        ({"job_key": "ns/x", "gauge": "other"}, 1.0),
    )
    m = metrics_from_results({"work": parse_vector(answer)}, taken_at_s=T0, window_s=60)
    assert set(m.work) == {"ns/a", "ns/done"}
    assert m.work["ns/a"].remaining_samples == (1000 - 250) * 512
    assert m.work["ns/done"].remaining_samples == 0.0
    q = QUERIES["work"].format(window="120s")
    for gauge in ("step", "total_steps", "global_batch_size"):
        assert (f'label_replace(max by (job_key) (last_over_time(trainflow_{gauge}[120s])), "gauge", "{gauge}", "", "")'
                in q)
    assert q.count(" or ") == 3  # and remaining_samples, for adaptive-batch trainers


def test_adaptive_batch_trainers_report_work_left_in_samples_and_a_goodput_curve() -> None:
    work = vector(
        ({"job_key": "ns/ad", "gauge": "remaining_samples"}, 4.0e6),
        ({"job_key": "ns/ad", "gauge": "global_batch_size"}, 768.0),   # current batch: not a step unit
        ({"job_key": "ns/ad", "gauge": "step"}, 120.0),                 # steps of varying size: ignored
        ({"job_key": "ns/neg", "gauge": "remaining_samples"}, -5.0),    # nonsense: ignored
    )
    goodput = vector(
        ({"job_key": "ns/ad", "world_size": "2"}, 180.0),
        ({"job_key": "ns/ad", "world_size": "8"}, 610.0),
        ({"job_key": "ns/ad", "world_size": "x"}, 1.0),                 # malformed label: dropped
        ({"job_key": "ns/z", "world_size": "4"}, 0.0),                  # no goodput: dropped
    )
    m = metrics_from_results({"work": parse_vector(work), "goodput": parse_vector(goodput)}, taken_at_s=T0,
                             window_s=60)
    assert set(m.work) == {"ns/ad"}
    assert m.work["ns/ad"].adaptive and m.work["ns/ad"].remaining_samples == 4.0e6
    assert dict(m.goodput) == {"ns/ad": {2: 180.0, 8: 610.0}}
    assert QUERIES["goodput"].format(window="60s") == (
        "max by (job_key, world_size) (last_over_time(trainflow_goodput_samples_per_second[60s]))")


def test_queries_are_formatted_with_the_window() -> None:
    q = QUERIES["samples"].format(window="60s")
    assert q == "avg by (job_key) (avg_over_time(trainflow_samples_per_second[60s]))"
    assert all("{window}" in q for q in QUERIES.values())
    assert 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!=""}[60s]' in QUERIES["gpu_busy"].format(window="60s")


def test_job_memo_round_trips_through_annotations() -> None:
    memo = JobMemo(requested_workers=3, restarts=2, throughput={1: 10.0, 2: 19.5}, attained_service_gpu_s=3600.0,
                   attained_at_s=T0, scale_up=ScaleUpWatch(from_workers=1, to_workers=3, at_s=T0),
                   hold_until_s=T0 + 600, hold_max_workers=1, suspended_by_scheduler=True, reshape=(2, 4))
    annotations = {k: v for k, v in memo.annotations().items() if v is not None}
    assert JobMemo.parse(annotations) == memo
    assert json.loads(annotations[ANNOTATION_PREFIX + "throughput"]) == {
        "unit": "samples/s", "by_workers": {"1": 10.0, "2": 19.5}}
    assert memo.held(T0 + 1) and not memo.held(T0 + 600)


def test_job_memo_ignores_malformed_values_and_diffs_minimally() -> None:
    bad = {ANNOTATION_PREFIX + "restarts": "many", ANNOTATION_PREFIX + "scale-up": "{not json",
           ANNOTATION_PREFIX + "throughput": '{"by_workers": {"0": 5, "2": "x"}}',
           ANNOTATION_PREFIX + "requested-workers": "2"}
    memo = JobMemo.parse(bad)
    assert memo.restarts == 0 and memo.scale_up is None and memo.throughput == {}
    assert memo.requested_workers == 2
    same = {ANNOTATION_PREFIX + "requested-workers": "2"}
    assert JobMemo(requested_workers=2).changed_annotations(same) == {}
    assert JobMemo(requested_workers=2, restarts=1).changed_annotations(same) == {ANNOTATION_PREFIX + "restarts": "1"}
    assert JobMemo().changed_annotations(same) == {ANNOTATION_PREFIX + "requested-workers": None}


def test_job_memo_ignores_values_out_of_range() -> None:
    """Review (2026-11-30): JSON's ``Infinity`` in a watch or a hold (``int(inf)``) and a number too
    large for a float raised OverflowError, which parse did not catch: the informer dropped the
    job, so a job the controller had suspended stayed suspended and a watched scale-up was never
    rolled back. Such a value is ignored as any malformed one."""
    bad = {ANNOTATION_PREFIX + "scale-up": '{"from": Infinity, "to": 3, "at": 1}',
           ANNOTATION_PREFIX + "hold": '{"until": 1, "max_workers": Infinity}',
           ANNOTATION_PREFIX + "attained-service": json.dumps({"gpu_s": 10**400, "at": 1}),
           ANNOTATION_PREFIX + "suspended-by": FIELD_MANAGER}
    memo = JobMemo.parse(bad)
    assert (memo.scale_up, memo.hold_until_s, memo.attained_service_gpu_s) == (None, None, None)
    assert memo.suspended_by_scheduler


def test_prometheus_bearer_token_file_is_sent_and_reread_when_rotated(tmp_path, caplog) -> None:
    """Review item 4: a bearer token for a Prometheus behind an authenticating proxy."""
    import logging

    import httpx

    from gpu_scheduler.observe.prometheus import PrometheusObserver, PrometheusUnavailable

    token = tmp_path / "token"
    token.write_text("first\n")
    seen: list[str | None] = []
    status = [200]

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(status[0], json={"status": "success", "data": {"resultType": "vector", "result": []}})

    client = httpx.Client(transport=httpx.MockTransport(handler))
    with caplog.at_level(logging.WARNING, logger="gpu_scheduler"):
        observer = PrometheusObserver("http://prometheus:9090", bearer_token_file=token, client=client)
    assert "bearer token to Prometheus over plain http" in caplog.text
    assert observer.query("up", T0) == []
    token.write_text("second-token")  # the kubelet rotated a projected token
    observer.query("up", T0)
    assert seen == ["Bearer first", "Bearer second-token"]
    status[0] = 401
    with pytest.raises(PrometheusUnavailable, match="refused the query: HTTP 401"):
        observer.query("up", T0)
    with pytest.raises(ValueError, match=r"bearer token file .*missing"):
        PrometheusObserver("https://prometheus:9090", bearer_token_file=tmp_path / "missing", client=client)


@pytest.mark.parametrize("payload", [
    vector(({"namespace": "ns", "pod": "a-0", "source": "gpu_util", "gpu": "3"}, 0.5),
           ({"job_key": "ns/a", "gauge": "step"}, 10.0), ({"job_key": "ns/b", "world_size": "4"}, 330.0),
           ({"job_key": "ns/c"}, float("nan"))),
    {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"job_key": "ns/a"}, "value": [T0, "+Inf"]}, {"metric": {"job_key": "ns/b"}, "value": [T0, "2"]}]}},
    {"status": "success", "data": {"resultType": "vector", "result": []}},
])
def test_the_typed_decoder_reads_what_parse_vector_reads(payload: dict) -> None:
    from gpu_scheduler.observe.prometheus import parse_vector_json

    fast, stats = parse_vector_json(json.dumps(payload).encode())
    slow = parse_vector(payload)
    keys = ("namespace", "pod", "source", "job_key", "gauge", "world_size")
    assert [({k: labels.get(k) for k in keys}, v) for labels, v in fast] == [
        ({k: labels.get(k) for k in keys}, v) for labels, v in slow]
    assert stats == {}


@pytest.mark.parametrize(("raw", "match"), [
    (b'{"status": "error", "errorType": "timeout", "error": "query timed out"}', "timeout: query timed out"),
    (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', "not an instant vector"),
    (b"<html>502 Bad Gateway</html>", "malformed JSON"),
])
def test_the_typed_decoder_gives_the_same_one_line_errors(raw: bytes, match: str) -> None:
    from gpu_scheduler.observe.prometheus import parse_vector_json

    with pytest.raises(PrometheusUnavailable, match=match):
        parse_vector_json(raw)
