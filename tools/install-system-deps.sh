#!/usr/bin/env bash
# Installs the Debian packages the tests use as real peers (kcat), when missing.
set -euo pipefail
need=()
command -v kcat >/dev/null 2>&1 || need+=(kcat)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: need root to install: ${need[*]} (sudo apt-get install ${need[*]})" >&2
    exit 1
fi
echo "install-system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
