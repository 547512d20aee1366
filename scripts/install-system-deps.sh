#!/usr/bin/env bash
# Debian packages the test tiers need. Idempotent; runs `apt-get update` at most once.
#   prometheus, chromium + chromium-driver      Prometheus tier, Airflow UI tests
#   containerd, runc, containernetworking-plugins, iptables, iproute2, catatonit
#                                               the test bed's real node (tests/support/realnode.py)
#   debootstrap, zstd                           the trainflow image without Docker (scripts/image/build.py)
#   mariadb-server, mariadb-client              the real KFP backend's database (tests/support/kfp_backend.py)
#   nodejs, npm                                 the real KFP UI's build and server (tests/testbed/build.sh
#                                               kfp-ui; the real-KFP tier; tested with Node.js 20.20.2, npm 11.19.1)
set -euo pipefail
need=()
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)  # promtool: the alert rule tests
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v containerd >/dev/null 2>&1 || need+=(containerd)
command -v runc >/dev/null 2>&1 || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
[ -x /usr/bin/catatonit ] || need+=(catatonit)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v zstd >/dev/null 2>&1 || need+=(zstd)
command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server mariadb-client)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing Debian packages: ${need[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
