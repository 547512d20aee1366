#!/usr/bin/env bash
# Build (or reuse) the test bed's servers from the Go module proxy, pinned in versions.env.
#
#   tests/testbed/build.sh [minio] [k8s] [kfp] [kfp-ui]
#                             (no argument: minio and k8s; kfp also gives Argo Workflows and the
#                              MLMD venv; kfp-ui is the KFP UI, which needs Node.js and npm)
#
# Prints NAME=PATH lines (shell- and Python-parsable) for what was asked:
#   MINIO_BIN             MinIO server                     ~/.cache/trainflow/minio/<version>/
#   TESTBED_BIN           multi-call kube-apiserver/kube-scheduler/kube-controller-manager/kubelet/
#                         kube-proxy/etcd/kubectl   ~/.cache/trainflow/testbed/controlplane/<k8s>-<hash>/
#   KUBE_APISERVER_BIN, KUBE_SCHEDULER_BIN, KUBE_CONTROLLER_MANAGER_BIN, KUBELET_BIN, KUBE_PROXY_BIN,
#   ETCD_BIN, KUBECTL_BIN                                 symlinks to TESTBED_BIN
#   KWOK_BIN, TRAINING_OPERATOR_BIN, COREDNS_BIN, PYTORCHJOB_CRD
#                                                         ~/.cache/trainflow/testbed/tools/<versions>-<hash>/
#                         (TRAINING_OPERATOR_BIN: tools/cmd/training-operator, the operator's packages
#                          behind a main whose servers all listen on 127.0.0.1; COREDNS_BIN:
#                          tools/cmd/coredns, CoreDNS with the plugins the real node's DNS uses)
#   KFP_BIN_DIR           Kubeflow Pipelines 2.14.3 backend: apiserver, persistence (agent),
#                         scheduledworkflow (controller), driver, launcher-v2; CRDs under crds/
#                                                          ~/.cache/trainflow/kfp/<version>-<hash>/
#   ARGO_BIN_DIR          Argo Workflows: workflow-controller (tests/testbed/argo/cmd, loopback-only
#                         main), argoexec; CRDs under crds/  ~/.cache/trainflow/argo/<version>-<hash>/
#   MLMD_PYTHON           python of a venv with ml-metadata (mlmd/requirements.txt), which runs
#                         mlmd/server.py, the gRPC front of the ML Metadata store KFP 2.14.3 needs
#                                                          ~/.cache/trainflow/mlmd/<version>-<hash>/
#   KFP_UI_DIR            the KFP 2.14.3 UI (frontend/ of the same module, built with npm from the
#                         npm registry): client/ (the static app), server/ (its Node server:
#                         dist/server.js, production node_modules), loopback.js (preload: listen on
#                         127.0.0.1 only)                 ~/.cache/trainflow/kfp-ui/<version>-<hash>/
#
# Each part is built at most once per version (and per hash of its wrapper module's files); a lock
# keeps concurrent callers (several pytest sessions, make testbed) from building it twice. Builds
# run under `nice -n 10` (shared machines). The wrapper modules' go.sum files are committed, so
# nothing needs a checksum-database lookup. Progress goes to stderr; stdout has only NAME=PATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache_root="${TRAINFLOW_CACHE:-$HOME/.cache/trainflow}"
export CGO_ENABLED=0 GOWORK=off GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -trimpath"

log() { echo "testbed/build: $*" >&2; }

need_go() {
  command -v go >/dev/null || { log "'go' not found: Go >= 1.26 is needed to build the test bed"; exit 2; }
}

# locked DIR CHECK_FILE FUNCTION: run FUNCTION TMPDIR under DIR/.lock unless DIR/CHECK_FILE exists,
# then move everything from TMPDIR into DIR (so a killed build never leaves a half-written binary).
# FUNCTION runs in a subshell with errexit on (bash would ignore it inside an `if` condition).
locked() {
  local dir="$1" check="$2" fn="$3"
  [ -e "$dir/$check" ] && return 0
  need_go
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [ ! -e "$dir/$check" ]; then
    local tmp start
    tmp="$(mktemp -d "$dir/.build.XXXXXX")"
    start=$(date +%s)
    local rc=0
    set +e
    (set -e; "$fn" "$tmp")
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then rm -rf "$tmp"; exec 9>&-; log "$fn failed ($rc)"; return "$rc"; fi
    mv "$tmp"/* "$dir/"
    rm -rf "$tmp"
    log "$fn done in $(( $(date +%s) - start )) s -> $dir"
  fi
  exec 9>&-
}

build_minio() {
  log "building github.com/minio/minio@$MINIO_VERSION (first use; 5-10 min on 2 cores, cached afterwards)"
  GOFLAGS=-trimpath GOBIN="$1" nice -n 10 go install -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION" >&2
}

# Hash of a wrapper module's go.mod, go.sum and Go sources, cmd/ subfolders included (editing any
# of them rebuilds that part). Same file order and bytes as before cmd/ existed, so the control
# plane's cache key did not move.
module_hash() { (cd "$1" && find . \( -name go.mod -o -name go.sum -o -name '*.go' \) -type f | sort | xargs cat | sha256sum | cut -c1-12); }

build_controlplane() {
  local out="$1" minor p c ld
  log "building kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kube-proxy, kubectl $KUBERNETES_VERSION and etcd $ETCD_VERSION (first use; ~20-30 min on 2 cores)"
  minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  # The release's version, as its own build (hack/lib/version.sh) stamps it into both packages.
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  (cd "$here/controlplane" && nice -n 10 go build -ldflags "$ld" -o "$out/testbed" .) >&2
  for c in $CONTROLPLANE_PROGRAMS; do ln -s testbed "$out/$c"; done
}

build_tools() {
  local out="$1" dir
  log "building kwok $KWOK_VERSION, training-operator $TRAINING_OPERATOR_VERSION and coredns $COREDNS_VERSION (first use; ~6-9 min on 2 cores)"
  # ./cmd/training-operator: our loopback-only main around the operator's packages (see its doc);
  # ./cmd/coredns: CoreDNS with the few plugins the cluster DNS uses (see its doc).
  (cd "$here/tools" && nice -n 10 go build -ldflags "-s -w" -o "$out/" \
    sigs.k8s.io/kwok/cmd/kwok ./cmd/training-operator ./cmd/coredns) >&2
  dir="$(cd "$here/tools" && go mod download -json github.com/kubeflow/training-operator |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  cp "$dir/manifests/base/crds/kubeflow.org_pytorchjobs.yaml" "$out/"
  chmod u+w "$out/kubeflow.org_pytorchjobs.yaml"
}

build_kfp() {
  local out="$1" src="$1/.src" kfp_dir
  log "building the KFP $KFP_VERSION backend (first use; ~15-25 min on 2 cores)"
  mkdir -p "$src"
  cp "$here/kfp/go.mod" "$here/kfp/go.sum" "$src/"
  "$here/kfp/gen-api.sh" "$src/gen"
  # The API server's storage package uses go-sqlite3's cgo-only error types even when it talks to
  # MySQL, so it is the one cgo binary (gcc); the rest are static (driver and launcher go into
  # FROM-scratch images).
  (cd "$src" && CGO_ENABLED=1 nice -n 10 go build -ldflags "-s -w" -o "$out/" \
    github.com/kubeflow/pipelines/backend/src/apiserver) >&2
  (cd "$src" && nice -n 10 go build -ldflags "-s -w" -o "$out/" \
    github.com/kubeflow/pipelines/backend/src/agent/persistence \
    github.com/kubeflow/pipelines/backend/src/crd/controller/scheduledworkflow \
    github.com/kubeflow/pipelines/backend/src/v2/cmd/driver \
    github.com/kubeflow/pipelines/backend/src/v2/cmd/launcher-v2) >&2
  kfp_dir="$(cd "$src" && go mod download -json "github.com/kubeflow/pipelines@$KFP_MODULE_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  mkdir -p "$out/crds"
  cp "$kfp_dir/manifests/kustomize/base/pipeline/cluster-scoped/scheduled-workflow-crd.yaml" "$out/crds/"
  chmod -R u+w "$out/crds"
  rm -rf "$src"
}

build_argo() {
  local out="$1" src="$1/.src" argo_dir os_dir
  log "building Argo Workflows $ARGO_WORKFLOWS_VERSION workflow-controller and argoexec (first use; ~15-30 min on 2 cores)"
  argo_dir="$(cd "$here/argo" && go mod download -json "github.com/argoproj/argo-workflows/v3@$ARGO_WORKFLOWS_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  mkdir -p "$src"
  cp -r "$here/argo/go.mod" "$here/argo/go.sum" "$here/argo/cmd" "$src/"
  # The module zip has no workflow/executor/os-specific/signal_linux.go (Go module zips leave out
  # symbolic links; in the repository it stands for signal_darwin.go, which defines the same
  # process-group functions for Unix), so argoexec does not compile for Linux from the proxy, and
  # go build -overlay may not add files under GOMODCACHE. The build therefore uses a copy of the
  # module (a replace directive in a copy of the wrapper module) with that file added as the
  # module's own signal_darwin.go under the Linux name.
  cp -r "$argo_dir" "$src/argo-workflows"
  chmod -R u+w "$src/argo-workflows"
  os_dir="$src/argo-workflows/workflow/executor/os-specific"
  [ -e "$os_dir/signal_linux.go" ] || cp "$os_dir/signal_darwin.go" "$os_dir/signal_linux.go"
  (cd "$src" && go mod edit -replace "github.com/argoproj/argo-workflows/v3=./argo-workflows" &&
    nice -n 10 go build -ldflags "-s -w" -o "$out/" \
      ./cmd/workflow-controller github.com/argoproj/argo-workflows/v3/cmd/argoexec) >&2
  mkdir -p "$out/crds"
  cp "$argo_dir"/manifests/base/crds/minimal/argoproj.io_*.yaml "$out/crds/"
  chmod -R u+w "$out/crds"
  rm -rf "$src"
}

build_mlmd() {
  local out="$1" python="${PYTHON:-python3}"
  log "installing ml-metadata $MLMD_VERSION into a venv of its own (first use; ~1 min)"
  "$python" -m venv "$out/venv" >&2
  "$out/venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=:all: \
    -r "$here/mlmd/requirements.txt" >&2
  "$out/venv/bin/python" -c "import ml_metadata.metadata_store.pywrap.metadata_store_extension" >&2
}

need_npm() {
  command -v node >/dev/null && command -v npm >/dev/null ||
    { log "'node' and 'npm' not found: Node.js >= 20 and npm are needed to build the KFP UI (scripts/install-system-deps.sh installs them)"; exit 2; }
}

build_kfp_ui() {
  local out="$1" kfp_dir fe
  need_npm
  log "building the KFP $KFP_VERSION UI with npm $(npm --version) on node $(node --version) (first use; ~10-20 min on 2 cores)"
  kfp_dir="$(cd "$here/kfp" && go mod download -json "github.com/kubeflow/pipelines@$KFP_MODULE_VERSION" |
    sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  fe="$out/.src/frontend"
  mkdir -p "$out/.src"
  cp -r "$kfp_dir/frontend" "$fe"
  chmod -R u+w "$fe"
  # No install scripts: the frontend's own postinstall only runs npm ci in server/ and
  # mock-backend/ (server/ is done below, the mock backend is not needed); dependencies' scripts
  # would download binaries (Cypress, Puppeteer), and none is needed to build.
  export CYPRESS_INSTALL_BINARY=0 PUPPETEER_SKIP_DOWNLOAD=1 npm_config_audit=false npm_config_fund=false
  node "$here/kfp-ui/drop-packages.js" "$fe" fs  # see drop-packages.js: the registry has no fs@0.0.1-security
  (cd "$fe" && nice -n 10 npm ci --ignore-scripts --no-progress) >&2
  # `npm run build` is `npm run lint && react-scripts build` after `build:tailwind` (prebuild):
  # the same without the lint step and without source maps (neither changes the app). CI=false:
  # react-scripts would otherwise fail the build on any warning where CI=true is set (as in CI).
  (cd "$fe" && nice -n 10 npm run build:tailwind &&
    CI=false EXTEND_ESLINT=true DISABLE_ESLINT_PLUGIN=true GENERATE_SOURCEMAP=false \
      nice -n 10 npx --no-install react-scripts build) >&2
  # The server, as the Dockerfile's second stage: npm ci, npm run build (tsc), then only the
  # production dependencies.
  (cd "$fe/server" && nice -n 10 npm ci --ignore-scripts --no-progress && nice -n 10 npm run build &&
    npm prune --omit=dev --ignore-scripts) >&2
  # What the Dockerfile writes there too (the UI's healthz and side bar show them).
  echo "${KFP_MODULE_VERSION##*-}" >"$fe/server/dist/COMMIT_HASH"
  echo "$KFP_VERSION" >"$fe/server/dist/TAG_NAME"
  date -u >"$fe/server/dist/BUILD_DATE"
  mv "$fe/build" "$out/client"
  mkdir -p "$out/server"
  mv "$fe/server/dist" "$fe/server/node_modules" "$fe/server/package.json" "$out/server/"
  cp "$here/kfp-ui/loopback.js" "$out/"
  rm -rf "$out/.src"
}

CONTROLPLANE_PROGRAMS="kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy etcd kubectl"
want_minio=0 want_k8s=0 want_kfp=0 want_kfp_ui=0
[ $# -eq 0 ] && set -- minio k8s
for part in "$@"; do
  case "$part" in
    minio) want_minio=1 ;;
    k8s) want_k8s=1 ;;
    kfp) want_kfp=1 ;;
    kfp-ui) want_kfp_ui=1 ;;
    *) log "unknown part '$part' (want: minio, k8s, kfp, kfp-ui)"; exit 2 ;;
  esac
done

if [ $want_minio = 1 ]; then
  d="$cache_root/minio/$MINIO_VERSION"
  locked "$d" minio build_minio
  echo "MINIO_BIN=$d/minio"
fi
if [ $want_k8s = 1 ]; then
  d="$cache_root/testbed/controlplane/$KUBERNETES_VERSION-$(module_hash "$here/controlplane")"
  locked "$d" testbed build_controlplane
  echo "TESTBED_BIN=$d/testbed"
  for c in $CONTROLPLANE_PROGRAMS; do
    v="$(echo "$c" | tr 'a-z-' 'A-Z_')_BIN"
    echo "$v=$d/$c"
  done
  d="$cache_root/testbed/tools/kwok-$KWOK_VERSION-to-$TRAINING_OPERATOR_VERSION-dns-$COREDNS_VERSION-$(module_hash "$here/tools")"
  locked "$d" kubeflow.org_pytorchjobs.yaml build_tools
  echo "KWOK_BIN=$d/kwok"
  echo "TRAINING_OPERATOR_BIN=$d/training-operator"
  echo "COREDNS_BIN=$d/coredns"
  echo "PYTORCHJOB_CRD=$d/kubeflow.org_pytorchjobs.yaml"
fi
if [ $want_kfp = 1 ]; then
  # gen-api.sh and protogen/ are inputs too: they write the api modules the build replaces.
  h="$( (module_hash "$here/kfp"; sha256sum <"$here/kfp/gen-api.sh") | sha256sum | cut -c1-12)"
  d="$cache_root/kfp/$KFP_VERSION-$h"
  locked "$d" launcher-v2 build_kfp
  echo "KFP_BIN_DIR=$d"
  d="$cache_root/argo/$ARGO_WORKFLOWS_VERSION-$(module_hash "$here/argo")"
  locked "$d" argoexec build_argo
  echo "ARGO_BIN_DIR=$d"
  MLMD_VERSION="$(sed -n 's/^ml-metadata==//p' "$here/mlmd/requirements.txt")"
  d="$cache_root/mlmd/$MLMD_VERSION-$(sha256sum <"$here/mlmd/requirements.txt" | cut -c1-12)"
  locked "$d" venv/bin/python build_mlmd
  echo "MLMD_PYTHON=$d/venv/bin/python"
fi
if [ $want_kfp_ui = 1 ]; then
  # Our inputs: the files under kfp-ui/ and this script's build_kfp_ui.
  h="$( (cd "$here/kfp-ui" && find . -type f | sort | xargs cat; declare -f build_kfp_ui) | sha256sum | cut -c1-12)"
  d="$cache_root/kfp-ui/$KFP_VERSION-$h"
  locked "$d" loopback.js build_kfp_ui
  echo "KFP_UI_DIR=$d"
fi
