#!/usr/bin/env bash
# Write the Go modules github.com/kubeflow/pipelines/api and .../kubernetes_platform, as KFP
# $KFP_VERSION has them, under OUT/api and OUT/kubernetes_platform (go.mod's replace directives point
# there).
#
#   tests/testbed/kfp/gen-api.sh OUT
#
# Why: the Go module proxy serves github.com/kubeflow/pipelines at the KFP 2.14.3 commit, but these
# two sub-modules only at older commits (2025-01 and 2024-07) that lack messages the 2.14.3 backend
# uses. Their Go code is protoc-gen-go's output for two .proto files that the same release publishes
# compiled on PyPI (kfp-pipeline-spec, kfp-kubernetes: each *_pb2.py embeds the file's serialized
# FileDescriptorProto). This script downloads those two wheels with pip, reads the descriptors out of
# them without importing anything (python's ast), and has ./protogen (protoc-gen-go's generator)
# write the Go files. cache_key.proto (package cachekey) is not on PyPI; protogen links its
# descriptor from the older api module the proxy does serve and generates it against the new
# pipeline_spec.proto (it only refers to messages that exist in both).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../versions.env
source "$here/../versions.env"
out="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python="${PYTHON:-python3}"

"$python" -m pip download -q --no-deps --only-binary=:all: --dest "$work/wheels" \
  "kfp-pipeline-spec==$KFP_PIPELINE_SPEC_VERSION" "kfp-kubernetes==$KFP_KUBERNETES_VERSION" >&2
"$python" - "$work" <<'PY'
import ast, glob, sys, zipfile
work = sys.argv[1]
wanted = {"kfp/pipeline_spec/pipeline_spec_pb2.py": "pipeline_spec.pb",
          "kfp/kubernetes/kubernetes_executor_config_pb2.py": "kubernetes_executor_config.pb"}
for whl in glob.glob(f"{work}/wheels/*.whl"):
    with zipfile.ZipFile(whl) as z:
        for member in set(z.namelist()) & set(wanted):
            tree = ast.parse(z.read(member).decode())
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                     and getattr(n.func, "attr", "") == "AddSerializedFile"]
            if len(calls) != 1 or not isinstance(calls[0].args[0], ast.Constant):
                sys.exit(f"gen-api: {whl}:{member}: expected one AddSerializedFile(b'...') call")
            with open(f"{work}/{wanted.pop(member)}", "wb") as f:
                f.write(calls[0].args[0].value)
if wanted:
    sys.exit(f"gen-api: not found in the wheels: {sorted(wanted)}")
PY

(cd "$here/protogen" && go build -o "$work/protogen" .) >&2
"$work/protogen" -out "$work/gen" -linked cache_key.proto \
  "$work/pipeline_spec.pb" "$work/kubernetes_executor_config.pb" >/dev/null
gen="$work/gen/github.com/kubeflow/pipelines"

rm -rf "$out/api" "$out/kubernetes_platform"
mkdir -p "$out"
cp -r "$gen/api" "$gen/kubernetes_platform" "$out/"
cat >"$out/api/go.mod" <<MOD
module github.com/kubeflow/pipelines/api

go 1.24

require (
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250715232539-7130f93afb79
	google.golang.org/protobuf v1.36.6
)
MOD
cat >"$out/kubernetes_platform/go.mod" <<MOD
module github.com/kubeflow/pipelines/kubernetes_platform

go 1.24

require (
	github.com/kubeflow/pipelines/api v0.0.0-20250102152816-873e9dedd766
	google.golang.org/protobuf v1.36.6
)
MOD
echo "gen-api: wrote $out/api and $out/kubernetes_platform" >&2
