#!/usr/bin/env bash
# Install what medley needs to build and test on Debian 12 (run as root): the C libraries
# it links (jansson, hiredis, PCRE2, utf8proc, GLPK, zlib), cmocka for unit tests, redis-server for the
# integration tests (redis-sentinel for failover, stunnel4 + openssl for TLS), and the
# Python packages the tests use as independent checkers.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential cmake pkg-config libjansson-dev libhiredis-dev libpcre2-dev
      libutf8proc-dev libglpk-dev zlib1g-dev libcmocka-dev redis-server redis-sentinel stunnel4 openssl python3
      python3-pip unzip"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing
fi
# Test-only Python checkers (JSON Schema validator, a redis-py client written from
# docs/protocol.md, the gguf reference reader). Never used by medley itself.
python3 -m pip install -q --disable-pip-version-check -r "$(dirname "$0")/requirements-test.txt"
