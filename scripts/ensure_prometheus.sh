#!/usr/bin/env bash
# Make sure the `prometheus` and `promtool` binaries exist (the dashboard and alert-rule tests
# start their own Prometheus on a free port; the system service is never used). If either is
# missing, Debian's `prometheus` package is installed with apt-get. Idempotent.
set -euo pipefail

sudo_cmd() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "ensure_prometheus: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

installed=""
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "ensure_prometheus: prometheus/promtool are missing and apt-get is not available; install Prometheus >= 2.42" >&2
        exit 1
    fi
    echo "ensure_prometheus: installing Debian's prometheus package ..."
    sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # the package's service is not started here (no init in containers); the tests never use it
    sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus >/dev/null
    installed=" (installed now)"
fi
echo "ensure_prometheus: $(prometheus --version 2>&1 | head -n 1)$installed"
