"""The Prometheus side of observation against a real Prometheus scraping the simulated DCGM exporter."""

from __future__ import annotations

import time

import pytest

from gpu_scheduler.observe.prometheus import PrometheusObserver, PrometheusUnavailable

pytestmark = pytest.mark.prometheus


def test_observe_returns_per_pod_gpu_use_and_per_job_throughput(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter()
    exporter.set_pod("team-a", "bert-worker-0", gpus=2, busy=0.8, node="gpu-0")
    exporter.set_pod("team-a", "bert-worker-1", gpus=2, busy=0.6, node="gpu-1")
    exporter.set_pod("team-b", "cnn-worker-0", gpus=1, busy=0.25, node="gpu-0")
    exporter.set_job("team-a/bert", 512.0, 4)
    exporter.set_work("team-a/bert", step=100, total_steps=900, global_batch_size=256)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for('count(DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod!=""})', lambda r: r and float(r[0]["value"][1]) == 5)
    prom.wait_for("trainflow_total_steps", lambda r: len(r) == 1)
    observer = PrometheusObserver(prom.url, window_s=10)
    sample = observer.observe(time.time())
    assert sample.pods[("team-a", "bert-worker-0")].busy == pytest.approx(0.8)
    assert sample.pods[("team-a", "bert-worker-1")].busy == pytest.approx(0.6)
    assert sample.pods[("team-b", "cnn-worker-0")].busy == pytest.approx(0.25)
    assert sample.pods[("team-a", "bert-worker-0")].source == "gr_engine_active"
    assert sample.jobs["team-a/bert"].samples_per_s == pytest.approx(512.0)
    assert sample.jobs["team-a/bert"].world_size == 4
    assert sample.work["team-a/bert"].remaining_samples == pytest.approx((900 - 100) * 256)
    assert set(sample.work) == {"team-a/bert"}  # the other job's trainer exports no progress
    assert observer.requests == 5  # one instant query per named PromQL constant


def test_work_left_follows_the_latest_step(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter()
    exporter.set_work("ns/j", step=10, total_steps=100, global_batch_size=64)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for("trainflow_step", lambda r: len(r) == 1)
    exporter.set_work("ns/j", step=60, total_steps=100, global_batch_size=64)
    prom.wait_for("trainflow_step", lambda r: r and r[0]["value"][1] == "60")
    sample = PrometheusObserver(prom.url, window_s=30).observe(time.time())
    assert sample.work["ns/j"].remaining_samples == pytest.approx(40 * 64)  # the latest, not the mean


def test_adaptive_batch_trainer_gauges_reach_the_sample(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter()
    exporter.set_adaptive("ns/ad", remaining_samples=2.5e6, goodput_by_world_size={1: 95.0, 4: 330.0})
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for("trainflow_goodput_samples_per_second", lambda r: len(r) == 2)
    exporter.set_adaptive("ns/ad", remaining_samples=2.0e6, goodput_by_world_size={1: 90.0, 4: 300.0})
    prom.wait_for("trainflow_remaining_samples", lambda r: r and float(r[0]["value"][1]) == 2.0e6)
    prom.wait_for('trainflow_goodput_samples_per_second{world_size="4"}', lambda r: r and r[0]["value"][1] == "300")
    sample = PrometheusObserver(prom.url, window_s=30).observe(time.time())
    assert dict(sample.goodput["ns/ad"]) == {1: 90.0, 4: 300.0}  # the latest curve, not a mean
    assert sample.work["ns/ad"].adaptive and sample.work["ns/ad"].remaining_samples == pytest.approx(2.0e6)


def test_resize_within_the_window_yields_no_world_size(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter()
    exporter.set_job("ns/j", 100.0, 2)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for("trainflow_world_size", lambda r: len(r) == 1)
    exporter.set_job("ns/j", 190.0, 4)
    prom.wait_for("trainflow_world_size", lambda r: r and r[0]["value"][1] == "4")
    sample = PrometheusObserver(prom.url, window_s=30).observe(time.time())
    assert sample.jobs["ns/j"].world_size is None  # 2 and 4 both inside the window


def test_gpu_util_is_used_without_profiling_metrics(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter(profiling=False)
    exporter.set_pod("ns", "p-worker-0", gpus=1, busy=0.4)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for('DCGM_FI_DEV_GPU_UTIL{pod="p-worker-0"}')
    sample = PrometheusObserver(prom.url, window_s=10).observe(time.time())
    reading = sample.pods[("ns", "p-worker-0")]
    assert reading.source == "gpu_util" and reading.busy == pytest.approx(0.4)


def test_mixed_fleet_uses_engine_active_where_exported_and_utilisation_elsewhere(
    prometheus_server, dcgm_exporter
) -> None:
    h100 = dcgm_exporter()  # profiling metrics exported
    t4 = dcgm_exporter(profiling=False)
    h100.set_pod("ns", "a-worker-0", gpus=1, busy=0.7, node="gpu-h100")
    t4.set_pod("ns", "b-worker-0", gpus=1, busy=0.3, node="gpu-t4")
    prom = prometheus_server([h100.target, t4.target], scrape_interval_s=0.5)
    prom.wait_for('DCGM_FI_DEV_GPU_UTIL{pod!=""}', lambda r: len(r) == 2)
    sample = PrometheusObserver(prom.url, window_s=10).observe(time.time())
    assert (sample.pods[("ns", "a-worker-0")].source, sample.pods[("ns", "b-worker-0")].source) == (
        "gr_engine_active", "gpu_util")
    assert sample.pods[("ns", "a-worker-0")].busy == pytest.approx(0.7)
    assert sample.pods[("ns", "b-worker-0")].busy == pytest.approx(0.3)


def test_exporter_without_pod_labels_gives_no_pod_readings(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter(pod_labels=False)
    exporter.set_pod("ns", "p-worker-0", gpus=2, busy=0.9)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for("DCGM_FI_DEV_GPU_UTIL", lambda r: len(r) == 2)
    sample = PrometheusObserver(prom.url, window_s=10).observe(time.time())
    assert sample.pods == {}


def test_stopped_prometheus_raises_a_one_line_reason(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter()
    prom = prometheus_server([exporter.target])
    observer = PrometheusObserver(prom.url, window_s=10, timeout_s=2)
    observer.observe(time.time())
    prom.stop()
    with pytest.raises(PrometheusUnavailable, match=r"^Prometheus at http://127\.0\.0\.1:\d+ unreachable: ConnectError"):
        observer.observe(time.time())
    prom.start()
    assert observer.observe(time.time()).taken_at_s > 0


@pytest.mark.parametrize("profiling", [True, False])
def test_exporter_scraped_without_honor_labels_is_attributed_by_exported_pod(
    prometheus_server, dcgm_exporter, profiling: bool
) -> None:
    """Review item 4 (NVIDIA/dcgm-exporter#85): scraped like a ServiceMonitor does by default
    (``honorLabels: false``, the target labelled with the exporter's own namespace and pod), the
    workload's labels arrive as ``exported_namespace`` / ``exported_pod``."""
    exporter = dcgm_exporter(profiling=profiling)
    exporter.set_pod("team-a", "bert-worker-0", gpus=2, busy=0.8, node="gpu-0")
    exporter.set_pod("team-b", "cnn-worker-0", gpus=1, busy=0.25, node="gpu-0")
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5,
                             target_labels={"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x7k2p"})
    prom.wait_for('count(DCGM_FI_DEV_GPU_UTIL{exported_pod!=""})', lambda r: r and float(r[0]["value"][1]) == 3)
    sample = PrometheusObserver(prom.url, window_s=10).observe(time.time())
    assert sample.pods[("team-a", "bert-worker-0")].busy == pytest.approx(0.8)
    assert sample.pods[("team-b", "cnn-worker-0")].busy == pytest.approx(0.25)
    assert sample.pods[("team-a", "bert-worker-0")].source == ("gr_engine_active" if profiling else "gpu_util")


def test_https_prometheus_is_verified_with_the_given_ca(prometheus_server, dcgm_exporter, tmp_path) -> None:
    """Review item 4: a CA option for Prometheus (served over TLS by Prometheus' web config)."""
    from tests.support.k8s import _CertificateAuthority, _pem_write

    ca = _CertificateAuthority.create("prometheus-test-ca")
    cert, key = ca.issue("prometheus", server_names=["127.0.0.1"])
    paths = (_pem_write(tmp_path / "tls.crt", cert), _pem_write(tmp_path / "tls.key", key),
             _pem_write(tmp_path / "ca.crt", ca.cert_pem()))
    exporter = dcgm_exporter()
    exporter.set_job("ns/j", 100.0, 2)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5, tls=paths)
    assert prom.url.startswith("https://")
    prom.wait_for("trainflow_world_size", lambda r: len(r) == 1)
    sample = PrometheusObserver(prom.url, window_s=10, ca_file=paths[2]).observe(time.time())
    assert sample.jobs["ns/j"].world_size == 2
    with pytest.raises(PrometheusUnavailable, match=r"unreachable: ConnectError.*CERTIFICATE_VERIFY_FAILED"):
        PrometheusObserver(prom.url, window_s=10).observe(time.time())  # the system CAs do not know it


def test_query_stats_report_prometheus_own_time_and_the_bytes(prometheus_server, dcgm_exporter) -> None:
    exporter = dcgm_exporter()
    exporter.set_pod("ns", "a-worker-0", gpus=1, busy=0.5)
    exporter.set_job("ns/a", 10.0, 1)
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5)
    prom.wait_for("trainflow_world_size", lambda r: len(r) == 1)
    observer = PrometheusObserver(prom.url, window_s=10, query_stats=True)
    sample = observer.observe(time.time())
    assert sample.jobs["ns/a"].samples_per_s == pytest.approx(10.0)
    assert set(observer.last_query_s) == {"gpu_busy", "samples", "world_size", "work", "goodput"}
    assert all(0 < t < 5 for t in observer.last_query_s.values())
    assert observer.last_bytes > 200


def test_recorded_series_read_what_the_queries_read(prometheus_server, dcgm_exporter, tmp_path) -> None:
    """Issue 16: the monitoring component's recording rules, loaded by a real Prometheus, give the
    observer the same readings as evaluating the queries (with ``recorded=True`` it only looks
    them up)."""
    from pathlib import Path

    from tests.support.prometheus import rules_file

    manifest = Path(__file__).resolve().parents[2] / "manifests/components/monitoring/prometheusrule.yaml"
    exporter = dcgm_exporter()
    exporter.set_pod("team-a", "bert-worker-0", gpus=2, busy=0.8, node="gpu-0")
    exporter.set_pod("team-b", "cnn-worker-0", gpus=1, busy=0.25, node="gpu-0")
    exporter.set_job("team-a/bert", 512.0, 4)
    exporter.set_work("team-a/bert", step=100, total_steps=900, global_batch_size=256)
    exporter.set_adaptive("team-b/cnn", remaining_samples=2.0e6, goodput_by_world_size={1: 90.0, 2: 170.0})
    prom = prometheus_server([exporter.target], scrape_interval_s=0.5,
                             rule_files=[rules_file(manifest, tmp_path / "rules.yml")])
    prom.wait_for("trainflow_scheduler:goodput:5m", lambda r: len(r) == 2, timeout_s=60)
    prom.wait_for("trainflow_scheduler:work:5m", lambda r: len(r) == 4, timeout_s=60)
    recorded = PrometheusObserver(prom.url, recorded=True).observe(time.time())
    direct = PrometheusObserver(prom.url, window_s=300).observe(time.time())
    assert recorded.window_s == 300.0
    assert recorded.pods == direct.pods and recorded.jobs == direct.jobs
    assert recorded.work == direct.work and recorded.goodput == direct.goodput
    assert recorded.pods[("team-a", "bert-worker-0")].busy == pytest.approx(0.8)
    assert recorded.work["team-a/bert"].remaining_samples == (900 - 100) * 256



def test_close_waits_for_a_query_in_flight_before_closing_the_client() -> None:
    """Closing the client under a query thread still reading would free its socket's descriptor
    for another connection (docs/scheduler.md, "Stopping the informers")."""
    import threading

    import httpx

    from gpu_scheduler.observe.prometheus import QUERIES, PrometheusObserver

    answering = threading.Event()
    release = threading.Event()
    asked: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if len(asked) == len(QUERIES):
            answering.set()  # every query of the observation is in flight
        release.wait(10)  # Prometheus still evaluating
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    observer = PrometheusObserver("http://prometheus.invalid", client=client)
    in_flight = threading.Thread(target=lambda: observer.observe(0.0))  # its queries run in the pool
    in_flight.start()
    assert answering.wait(5)
    closing = threading.Thread(target=observer.close)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive() and not client.is_closed  # waits for the query
    release.set()
    closing.join(5)
    in_flight.join(5)
    assert not closing.is_alive() and client.is_closed


def test_the_query_threads_cpu_is_counted_in_the_readings_cpu() -> None:
    """The five queries are sent and decoded in the observer's pool threads; their CPU belongs to
    the tick's ``prometheus_query`` figure (it used to hold only the thread waiting for them)."""
    import time

    import httpx

    from gpu_scheduler.controller import _timed
    from gpu_scheduler.observe.prometheus import PrometheusObserver

    def answer(request: httpx.Request) -> httpx.Response:
        burn_until = time.thread_time() + 0.02  # 20 ms of this query thread's CPU
        while time.thread_time() < burn_until:
            pass
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    observer = PrometheusObserver("http://prometheus.invalid", client=httpx.Client(transport=httpx.MockTransport(answer)))
    try:
        sample, cpu_s = _timed(observer, 0.0)
        assert observer.last_query_cpu_s >= 5 * 0.02
        assert cpu_s >= observer.last_query_cpu_s
        assert sample.pods == {} and sample.jobs == {}
    finally:
        observer.close()
