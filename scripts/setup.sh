#!/usr/bin/env bash
# Install what medley needs to build and test on Debian 12 (run as root): the C libraries
# it links (jansson, hiredis, PCRE2, utf8proc, GLPK, zlib, libmicrohttpd for /metrics and
# `medley dashboard`), cmocka for unit tests, redis-server for the integration tests
# (redis-sentinel for failover, stunnel4 + openssl for TLS), prometheus (prometheus +
# promtool) to test the metrics and the alert rules, systemd for systemd-analyze (the
# deploy/ checks: tests/deploy.cmake), chromium + chromium-driver for the dashboard's page,
# and the Python packages the tests use as independent checkers. Not podman: building the
# container images downloads base images (deploy_container skips where it cannot build).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential cmake pkg-config libjansson-dev libhiredis-dev libssl-dev libpcre2-dev libutf8proc-dev
      libglpk-dev zlib1g-dev libcmocka-dev redis-server redis-sentinel stunnel4 openssl python3
      python3-pip unzip libmicrohttpd-dev prometheus systemd chromium chromium-driver"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  apt-get update -qq
  # Packages with services (prometheus, redis-server) must not start them here: the tests
  # start their own on free ports. A policy-rc.d that refuses is put in place for the install
  # when the machine has none (Debian's invoke-rc.d reads it).
  policy=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends $missing
  if [ "$own_policy" = 1 ]; then rm -f "$policy"; fi
fi
# Test-only Python checkers (JSON Schema validator, a redis-py client written from
# docs/protocol.md, the gguf reference reader, selenium driving chromium for the dashboard).
# Never used by medley itself.
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements-test.txt"
