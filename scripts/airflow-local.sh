#!/usr/bin/env bash
# Start or stop a local Airflow 3 (api-server, scheduler, dag-processor, triggerer) and the local
# KFP API server (trainflow kfp-server), all on 127.0.0.1. The README's Airflow section uses it.
#
#   scripts/airflow-local.sh start    # start what is not running, wait until healthy, print the login
#   scripts/airflow-local.sh stop     # stop them by PID (SIGTERM to each one's process group, SIGKILL after 30 s)
#   scripts/airflow-local.sh status
#
# Needs AIRFLOW_HOME (set up as in the README: db migrated, DAG copied, connection added) and the
# `airflow` and `trainflow` commands on PATH (the venv of `make venv`, or pip install
# "trainflow[airflow,kfp]"). Ports: AIRFLOW_PORT (8080) and KFP_PORT (8888). PIDs go to
# $AIRFLOW_HOME/pids/, logs to $AIRFLOW_HOME/logs/daemons/, KFP runs to $AIRFLOW_HOME/kfp-server/.
# Not `airflow standalone`: its log servers listen on all interfaces.
set -euo pipefail

: "${AIRFLOW_HOME:?set AIRFLOW_HOME first (see the README, section Airflow)}"
AIRFLOW_PORT="${AIRFLOW_PORT:-8080}"
KFP_PORT="${KFP_PORT:-8888}"
PIDS="$AIRFLOW_HOME/pids"
LOGS="$AIRFLOW_HOME/logs/daemons"
DAEMONS=(kfp-server api-server scheduler dag-processor triggerer)
STOP_TIMEOUT_S=30
READY_TIMEOUT_S="${READY_TIMEOUT_S:-300}"

# The daemons' settings (a value already in the environment wins).
export AIRFLOW__CORE__LOAD_EXAMPLES="${AIRFLOW__CORE__LOAD_EXAMPLES:-False}"
export AIRFLOW__CORE__EXECUTOR="${AIRFLOW__CORE__EXECUTOR:-LocalExecutor}"
export AIRFLOW__CORE__PARALLELISM="${AIRFLOW__CORE__PARALLELISM:-2}"
export AIRFLOW__API__BASE_URL="${AIRFLOW__API__BASE_URL:-http://127.0.0.1:$AIRFLOW_PORT}"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:-http://127.0.0.1:$AIRFLOW_PORT/execution/}"
# A busy laptop (or a shared CI machine) can take longer than Airflow's 5 s to answer a worker's
# call; the worker then re-sends "start task", gets 400 "already running" and the try dies.
export AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="${AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT:-60}"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

command_for() {  # sets CMD to the daemon's command line
  case "$1" in
    kfp-server) CMD=(trainflow kfp-server --host 127.0.0.1 --port "$KFP_PORT" --data-dir "$AIRFLOW_HOME/kfp-server") ;;
    api-server) CMD=(airflow api-server --host 127.0.0.1 --port "$AIRFLOW_PORT" --workers 1) ;;
    scheduler) CMD=(airflow scheduler --skip-serve-logs) ;;
    dag-processor) CMD=(airflow dag-processor) ;;
    triggerer) CMD=(airflow triggerer --skip-serve-logs) ;;
  esac
}

pid_of() {  # the PID in the daemon's pid file, if that process still runs and is that daemon
  local file="$PIDS/$1.pid" pid word=airflow
  [[ -f "$file" ]] || return 1
  pid="$(<"$file")"
  [[ "$1" == kfp-server ]] && word=kfp-server
  # After a reboot the PID may belong to another program: never signal that one. -ww: the whole
  # command line; with COLUMNS set, ps cuts it to that width, and a venv under a long path puts
  # the daemon's name past it (the interpreter's and the script's paths come first).
  [[ "$(ps -ww -o command= -p "$pid" 2>/dev/null)" == *"$word"* ]] && echo "$pid"
}

http_ok() { python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)" "$1" 2>/dev/null; }

healthy() {
  http_ok "http://127.0.0.1:$KFP_PORT/apis/v2beta1/healthz" || return 1
  python3 - "$AIRFLOW__API__BASE_URL/api/v2/monitor/health" <<'EOF' 2>/dev/null
import json, sys, urllib.request
health = json.load(urllib.request.urlopen(sys.argv[1], timeout=3))
sys.exit(0 if all((health.get(c) or {}).get("status") == "healthy"
                  for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")) else 1)
EOF
}

start() {
  command -v airflow >/dev/null && command -v trainflow >/dev/null \
    || { echo "airflow-local: airflow and trainflow must be on PATH (. .venv/bin/activate)" >&2; exit 2; }
  [[ -f "$AIRFLOW_HOME/airflow.cfg" ]] \
    || { echo "airflow-local: $AIRFLOW_HOME has no airflow.cfg; run the README's setup lines first (airflow db migrate, ...)" >&2; exit 2; }
  mkdir -p "$PIDS" "$LOGS"
  local name pid
  for name in "${DAEMONS[@]}"; do
    if pid="$(pid_of "$name")"; then
      echo "$name already running (pid $pid)"
      continue
    fi
    command_for "$name"
    # setsid: each daemon leads its own process group, so stop reaches the workers it forks.
    setsid "${CMD[@]}" >>"$LOGS/$name.log" 2>&1 </dev/null &
    echo $! >"$PIDS/$name.pid"
    echo "started $name (pid $!), log $LOGS/$name.log"
  done
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until healthy; do
    for name in "${DAEMONS[@]}"; do
      if ! pid_of "$name" >/dev/null; then
        echo "airflow-local: $name exited; the end of $LOGS/$name.log:" >&2
        tail -n 30 "$LOGS/$name.log" >&2
        stop
        exit 1
      fi
    done
    if ((SECONDS > deadline)); then
      echo "airflow-local: not healthy after $READY_TIMEOUT_S s; logs in $LOGS" >&2
      stop
      exit 1
    fi
    sleep 2
  done
  # The api-server builds its execution API (Cadwyn's versioned routes) on the first request to it,
  # blocking every request for 15-40 s on a busy machine. Make that happen now, not on the first
  # task's "start" call, which would time out and fail the try.
  python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=600)" \
    "$AIRFLOW__API__BASE_URL/execution/health" >/dev/null
  local passwords="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" password=""
  [[ -f "$passwords" ]] && password="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["admin"])' "$passwords" 2>/dev/null || true)"
  echo "Airflow UI:      $AIRFLOW__API__BASE_URL  (user admin, password ${password:-see $passwords})"
  echo "local KFP API:   http://127.0.0.1:$KFP_PORT"
  echo "stop with:       scripts/airflow-local.sh stop"
}

stop() {
  local name pid
  local -A group=()
  for name in "${DAEMONS[@]}"; do
    if pid="$(pid_of "$name")"; then
      group[$name]="$pid"
      kill -TERM -- "-$pid" 2>/dev/null || true  # the daemon and the workers it forked
    fi
    rm -f "$PIDS/$name.pid"
  done
  for name in "${!group[@]}"; do
    pid="${group[$name]}"
    local deadline=$((SECONDS + STOP_TIMEOUT_S))
    while kill -0 -- "-$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true  # what is left of its process group
    echo "stopped $name (pid $pid)"
  done
}

status() {
  local name pid
  for name in "${DAEMONS[@]}"; do
    if pid="$(pid_of "$name")"; then echo "$name running (pid $pid)"; else echo "$name stopped"; fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
