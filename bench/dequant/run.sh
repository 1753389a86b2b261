#!/usr/bin/env bash
# Dequantization throughput: medley's scalar reference (engine/weights/quant.c) vs llama.cpp's
# dequantize_row_* (libggml-base from llama-cpp-python), same blocks, same run, one thread.
#   python3 -m venv /opt/medley-venv && /opt/medley-venv/bin/pip install llama-cpp-python gguf
#   bash bench/dequant/run.sh [MODEL.gguf]
# LIBGGML_BASE overrides where libggml-base.so is looked for.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${MEDLEY_BENCH_PYTHON:-/opt/medley-venv/bin/python}
lib=${LIBGGML_BASE:-$("$py" -c 'import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))')}
model=${1:-${MEDLEY_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/medley/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -std=gnu11 -I. bench/dequant/bench_dequant.c engine/weights/gguf.c engine/weights/quant.c common/dtype.c \
   common/err.c common/util.c -ljansson -ldl -lm -o "$out/bench_dequant"
echo "# $(date -u +%FT%TZ) $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), cc -O2"
echo "# ratio = ggml time / medley time (> 1: medley faster)"
if [ -f "$model" ]; then "$out/bench_dequant" "$lib" "$model"; else "$out/bench_dequant" "$lib"; fi
