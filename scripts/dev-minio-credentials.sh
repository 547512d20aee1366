#!/usr/bin/env bash
# Write manifests/components/dev-minio/credentials.env with a random MinIO root user and password
# (the dev MinIO's Secret trainflow-s3-credentials is generated from it; the file is not in git).
# An existing file is kept, so re-running never changes credentials a running MinIO already uses.
# Usage: scripts/dev-minio-credentials.sh [FILE]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/../manifests/components/dev-minio/credentials.env}"
if [[ -e "$out" ]]; then
  echo "keeping $out (delete it to make new credentials)" >&2
  exit 0
fi
umask 077
python3 - "$out" <<'PY'
import secrets, sys
with open(sys.argv[1], "x") as f:
    f.write(f"AWS_ACCESS_KEY_ID=trainflow-{secrets.token_hex(4)}\nAWS_SECRET_ACCESS_KEY={secrets.token_urlsafe(30)}\n")
PY
echo "wrote $out" >&2
