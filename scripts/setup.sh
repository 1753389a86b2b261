#!/usr/bin/env bash
# Install what medley needs to build and test on Debian 12 (run as root): the C libraries
# it links (jansson, hiredis, PCRE2, GLPK, zlib, libmicrohttpd for `medley dashboard`),
# cmocka for unit tests, redis-server for the integration tests (redis-sentinel for
# failover, stunnel4 + openssl for TLS, chromium + chromium-driver for the dashboard's
# page), and the Python packages the tests use as independent checkers.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential cmake pkg-config libjansson-dev libhiredis-dev libpcre2-dev libglpk-dev
      zlib1g-dev libcmocka-dev redis-server redis-sentinel stunnel4 openssl python3
      python3-pip unzip libmicrohttpd-dev chromium chromium-driver"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing
fi
# Test-only Python checkers (JSON Schema validator, a redis-py client written from
# docs/protocol.md, the gguf reference reader, selenium driving chromium for the dashboard).
# Never used by medley itself.
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements-test.txt"
