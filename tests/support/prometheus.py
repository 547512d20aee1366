"""A real Prometheus (Debian's ``prometheus`` package) for tests, on 127.0.0.1.

Register with ``pytest_plugins = ["tests.support.prometheus"]``. The server runs with a config
and a TSDB folder under the test's tmp folder, scrapes the given targets every
``scrape_interval_s``, and is stopped by PID. Readiness is polled (``/-/ready``, then
``/api/v1/targets`` until every target was scraped and is up) — never slept for.

Fixture ``prometheus_server``: ``make(targets, scrape_interval_s=1.0, **options) -> PrometheusServer``;
every server made is stopped after the test. :meth:`PrometheusServer.stop` /
:meth:`PrometheusServer.start` stop and restart the same server (same port and data) to test
outages.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import ManagedProcess, free_port, http_ok

PROMETHEUS_BIN = "prometheus"


def prometheus_binary() -> str:
    """Path of Debian's prometheus binary; fails (CI) or skips (local) when it is missing."""
    found = shutil.which(PROMETHEUS_BIN)
    if found:
        return found
    message = "prometheus is not installed; run scripts/install-system-deps.sh (Debian package 'prometheus')"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
    raise AssertionError("unreachable")


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port`` strings, path ``/metrics``).

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        root: config and data folder.
    """

    def __init__(self, root: Path, targets: Sequence[str], *, scrape_interval_s: float = 1.0,
                 target_labels: Mapping[str, str] | None = None, tls: tuple[Path, Path, Path] | None = None,
                 rule_files: Sequence[Path] = (), scrape_configs: Sequence[Mapping[str, Any]] = ()) -> None:
        """``target_labels``: labels of the scrape targets (as the Kubernetes service discovery
        attaches ``namespace`` / ``pod``; the exporter's own then arrive as ``exported_*``);
        ``tls``: ``(cert, key, ca)`` PEM files to serve HTTPS with; ``rule_files``: recording
        and alerting rule files to load; ``scrape_configs``: more scrape jobs, as in the
        configuration file (e.g. ``kubernetes_sd_configs`` discovering pods on a test bed)."""
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        import ssl

        # One context for every request: httpx given ``verify=True`` loads the whole CA bundle for
        # each call, and the polls below make hundreds (one such load failed with "[X509] PEM lib"
        # in a cold run).
        self._verify: Any = ssl.create_default_context(cafile=str(tls[2]) if tls else None)
        self.scrape_interval_s = scrape_interval_s
        self.target_labels = dict(target_labels or {})
        self.rule_files = [str(p) for p in rule_files]
        self.targets = list(targets)
        self.scrape_configs = [dict(c) for c in scrape_configs]
        self.config_path = root / "prometheus.yml"
        self._process: ManagedProcess | None = None
        self._write_config()

    def _write_config(self) -> None:
        interval = f"{max(1, round(self.scrape_interval_s * 1000))}ms"
        static = {"targets": self.targets, **({"labels": self.target_labels} if self.target_labels else {})}
        config: dict[str, Any] = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "scrape_configs": [
                {"job_name": "targets", "static_configs": [static]} if self.targets else
                {"job_name": "targets", "static_configs": []},
                *self.scrape_configs,
            ],
        }
        if self.rule_files:
            config["rule_files"] = self.rule_files
        self.config_path.write_text(yaml.safe_dump(config))
        if self.tls:
            web = {"tls_server_config": {"cert_file": str(self.tls[0]), "key_file": str(self.tls[1])}}
            (self.root / "web.yml").write_text(yaml.safe_dump(web))

    def start(self, ready_timeout_s: float = 30.0) -> PrometheusServer:
        """Start (or restart) the server and wait until it is ready and every target is up."""
        self._process = ManagedProcess(
            "prometheus",
            [
                prometheus_binary(),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=2h",
                "--log.level=warn",
                *([f"--web.config.file={self.root / 'web.yml'}"] if self.tls else []),
            ],
            log_dir=self.root,
            ready=lambda: http_ok(f"{self.url}/-/ready", verify=self._verify),
            ready_timeout_s=ready_timeout_s,
        ).start()
        self.wait_targets_up(ready_timeout_s)
        return self

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.alive()

    @property
    def pid(self) -> int:
        """The server's PID (RuntimeError when it is not started)."""
        if self._process is None:
            raise RuntimeError("Prometheus is not started")
        return self._process.pid

    def set_targets(self, targets: Sequence[str], timeout_s: float = 30.0) -> None:
        """Replace the scrape targets (config rewritten, ``POST /-/reload``) and wait until they are up."""
        self.targets = list(targets)
        self._write_config()
        httpx.post(f"{self.url}/-/reload", timeout=10, verify=self._verify).raise_for_status()
        self.wait_targets_up(timeout_s)

    def wait_targets_up(self, timeout_s: float = 30.0) -> None:
        """Poll ``/api/v1/targets`` until every configured target has been scraped and is up.

        Raises:
            TimeoutError: naming the targets that are not up, with their last error.
        """
        wanted = set(self.targets)
        deadline = time.monotonic() + timeout_s
        last: dict[str, str] = {}
        while True:
            try:
                active = httpx.get(f"{self.url}/api/v1/targets", timeout=5,
                                   verify=self._verify).json()["data"]["activeTargets"]
                last = {t["labels"]["instance"]: t["health"] + (f" ({t['lastError']})" if t.get("lastError") else "")
                        for t in active}
                if wanted <= {i for i, h in last.items() if h == "up"}:
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus targets not up after {timeout_s:.0f} s: {last or 'none listed'}")
            time.sleep(0.1)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query now; returns the raw result list."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10,
                           verify=self._verify).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_for(self, promql: str, predicate: Callable[[list[dict[str, Any]]], bool] = bool,
                 timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll an instant query until ``predicate(result)`` holds; return the result.

        Raises:
            TimeoutError: with the last result.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"{promql!r} never satisfied the condition; last result {result}")
            time.sleep(0.2)


def rules_file(prometheus_rule: Path, out: Path) -> Path:
    """A Prometheus rules file with the groups of a Prometheus Operator ``PrometheusRule``
    manifest (its ``spec`` is a rules file's content), so a test's Prometheus loads the rules the
    manifests ship."""
    manifest = yaml.safe_load(prometheus_rule.read_text())
    out.write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}, sort_keys=False))
    return out


@pytest.fixture
def prometheus_server(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory ``make(targets, scrape_interval_s=1.0) -> started PrometheusServer``; stopped after the test."""
    servers: list[PrometheusServer] = []

    def make(targets: Sequence[str], *, scrape_interval_s: float = 1.0, **options: Any) -> PrometheusServer:
        server = PrometheusServer(tmp_path / f"prometheus-{len(servers)}", targets, scrape_interval_s=scrape_interval_s,
                                  **options)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()
