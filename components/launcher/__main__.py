"""``python -m components.launcher`` — run one training task as a PyTorchJob and wait for it.

Usage::

    python -m components.launcher --spec spec.json [--output job.json] [--poll-interval-s 10]
        [--timeout-s SECONDS] [--cleanup always|on-success|never] [--keep-failed] [--stream-logs]
        [--no-fail-fast] [--capacity-grace-s SECONDS] [--max-oom-kills N] [--oom-window-s SECONDS]
        [--outage-tolerance-s SECONDS]

``spec.json`` holds the keyword arguments of :class:`~components.launcher.pytorchjob.PyTorchJobSpec`
(``-`` reads standard input). The Kubernetes client is configured from ``KUBECONFIG`` or, inside a
pod, from its service account; inside a pod the job is owned by that pod (garbage-collected with
it) unless the spec names other owners or another namespace. Exit codes: 0 succeeded, 1 the job
failed, its workers could not start or were OOM-killed ``--max-oom-kills`` times (the cause is
printed), 2 bad input, 3 another launcher error, 143 terminated by SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from components.launcher.incluster import own_pod
from components.launcher.pytorchjob import InvalidSpecError, PyTorchJobSpec
from components.launcher.runner import (
    LauncherError,
    LaunchStuck,
    LaunchTerminated,
    PyTorchJobFailed,
    PyTorchJobRunner,
    RunnerSettings,
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m components.launcher", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--spec", required=True, help="JSON file with the PyTorchJobSpec fields ('-': stdin)")
    parser.add_argument(
        "--output", type=Path, help="write the job's namespace/name/uid and outcome here (JSON)"
    )
    parser.add_argument("--poll-interval-s", type=float, default=10.0)
    parser.add_argument("--timeout-s", type=float, default=None)
    parser.add_argument("--cleanup", choices=["always", "on-success", "never"], default="on-success")
    parser.add_argument(
        "--keep-failed", action="store_true", help="reattach to a Failed job instead of replacing it"
    )
    parser.add_argument("--stream-logs", action="store_true", help="print the workers' logs, prefixed by pod")
    parser.add_argument("--no-fail-fast", action="store_true",
                        help="wait for workers that cannot start (missing image, no node) instead of failing")
    parser.add_argument("--capacity-grace-s", type=float, default=None,
                        help="fail if workers wait this long for capacity (Insufficient nvidia.com/gpu, cpu...); "
                             "default: wait as long as the job is queued")
    parser.add_argument("--max-oom-kills", type=int, default=RunnerSettings.max_oom_kills,
                        help="fail once a worker was OOM-killed this many times within --oom-window-s (the "
                             "operator recreates it forever under ExitCode); 0: never (default: %(default)s)")
    parser.add_argument("--oom-window-s", type=float, default=RunnerSettings.oom_window_s,
                        help="the window of --max-oom-kills, seconds (default: %(default)s)")
    parser.add_argument("--outage-tolerance-s", type=float, default=RunnerSettings.outage_tolerance_s,
                        help="keep waiting this many seconds through an API server that does not answer "
                             "(connection errors, timeouts, 5xx, 429) while the job trains (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
        data = json.loads(text)
        if not isinstance(data, dict):
            raise InvalidSpecError("the spec must be a JSON object")
        spec = PyTorchJobSpec(**data)
        settings = RunnerSettings(
            poll_interval_s=args.poll_interval_s,
            timeout_s=args.timeout_s,
            cleanup=args.cleanup,
            recreate_failed=not args.keep_failed,
            stream_logs=args.stream_logs,
            fail_fast=not args.no_fail_fast,
            capacity_grace_s=args.capacity_grace_s,
            max_oom_kills=args.max_oom_kills or None,
            oom_window_s=args.oom_window_s,
            outage_tolerance_s=args.outage_tolerance_s,
        )
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as err:
        print(f"launcher: bad input: {err}", file=sys.stderr)
        return 2

    from lightkube import Client

    try:
        client = Client(field_manager="trainflow-launcher")
    except Exception as err:  # lightkube's ConfigError and file errors: say it in one line
        print(
            f"launcher: no usable Kubernetes configuration (KUBECONFIG or in-cluster): {err}", file=sys.stderr
        )
        return 3
    me = own_pod(client)
    if me is not None and not spec.owner_references and me.namespace == spec.namespace:
        spec = replace(spec, owner_references=[me.owner_reference()])
    runner = PyTorchJobRunner(client, settings)
    try:
        with runner.terminate_on_sigterm():
            outcome = runner.run(spec, output_path=args.output)
    except (PyTorchJobFailed, LaunchStuck) as err:
        print(f"launcher: {err}", file=sys.stderr)
        return 1
    except LaunchTerminated as err:
        print(f"launcher: {err}", file=sys.stderr)
        return 143
    except LauncherError as err:
        print(f"launcher: {err}", file=sys.stderr)
        return 3
    print(outcome.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
