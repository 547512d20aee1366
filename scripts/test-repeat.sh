#!/usr/bin/env bash
# Run the server-backed test tiers N times in a row and summarize each round, to catch races that
# show up once in a few runs (a flaky test blocks every landing). Usage:
#
#   scripts/test-repeat.sh [N] [pytest args...]     (default N=3; default selection: every server tier)
#   make test-repeat N=5 MARK="k8s"                  (the same through make)
#
# Each round's full output is kept in $TEST_REPEAT_DIR (default runs/test-repeat/<timestamp>/round-<i>.log);
# the exit status is 0 only if every round passed with no error.
set -uo pipefail
cd "$(dirname "$0")/.."
n="${1:-3}"; shift || true
mark="${MARK:-s3 or prometheus or airflow or browser or k8s or realnode or slow}"
out="${TEST_REPEAT_DIR:-runs/test-repeat/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
failed=0
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  .venv/bin/python -m pytest -p no:cacheprovider -q -m "$mark" "$@" tests >"$out/round-$i.log" 2>&1
  rc=$?
  summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|^=+ .*(passed|failed|error).* =+$' "$out/round-$i.log" | tail -1)"
  echo "round $i/$n: rc=$rc in $(( $(date +%s) - start )) s: ${summary:-no summary (see $out/round-$i.log)}"
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    grep -E '^(FAILED|ERROR) ' "$out/round-$i.log" | sed 's/^/    /'
  fi
done
echo "test-repeat: $((n - failed))/$n rounds clean; logs in $out"
[ "$failed" -eq 0 ]
