#!/usr/bin/env bash
# pack-device-check.sh — prepare, on a build machine, what run-device-check.sh needs on a GPU
# host that lacks medley's build dependencies (jansson, hiredis, cmocka, glpk, pcre2): the
# GPU test binaries, the benchmarks and `medley` in .devcheck/bin, the shared libraries they
# need that a CUDA image may lack in .devcheck/lib (with libcudart; libcublas, 100+ MB, comes
# from the host's CUDA 13), built for sm_90 only (H100/H200), and all of it as one xz archive,
# .devpack/devcheck.tar.xz (the 15 binaries each hold the same sm_90 kernels: 40 MB as
# files, 3.2 MB compressed; run-device-check.sh unpacks it with python3's tarfile). With
# --model, the SmolLM2 test model split into .devmodel1/ .. .devmodel4/ (23.4 MiB each).
# The device tool sends at most 64 MiB per call, the ~4 MiB working tree included, and keeps
# ignored files between calls while the machine is warm: send .devmodel1 and .devmodel2 with
# `true`, then .devmodel3, .devmodel4 and .devpack with the check (docs/cuda.md "The device
# check").
#
#   bash tests/gpu/pack-device-check.sh [BUILD_DIR (default build-dpack)] [--model]
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-dpack}
[ "${1:-}" = "--model" ] && B=build-dpack
cmake -S . -B "$B" -DMEDLEY_WERROR=ON -DMEDLEY_CUDA=ON -DMEDLEY_CUDA_ARCHS=90 >/dev/null
cmake --build "$B" -j2 --target test_cuda_device_select test_cuda_step_plan test_cuda_graph_cache test_cuda_nccl_load \
    test_cuda_kernels test_cuda_backend test_cuda_e2e test_cuda_graphs test_cuda_engine test_cuda_tp test_cuda_encoder medley_gpu_bench medley_gemv_bench \
    medley_attn_bench medley_sample_bench medley
rm -rf .devcheck
mkdir -p .devcheck/bin .devcheck/lib
cp "$B"/tests/test_cuda_* "$B"/tests/medley_gpu_bench "$B"/tests/medley_gemv_bench \
    "$B"/tests/medley_attn_bench "$B"/tests/medley_sample_bench "$B"/cli/medley .devcheck/bin/
strip --strip-debug .devcheck/bin/*
for f in .devcheck/bin/*; do ldd "$f"; done | awk '/=>/ {print $3}' | sort -u |
    grep -v -E 'libc\.so|libm\.so|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcublas' |
    xargs -r -I{} cp -L {} .devcheck/lib/
echo "$(git rev-parse --short HEAD) $(date -u +%Y-%m-%dT%H:%M:%SZ)" >.devcheck/BUILT
rm -rf .devpack
mkdir -p .devpack
tar -cJf .devpack/devcheck.tar.xz .devcheck
grep -qx '/.devcheck/' .git/info/exclude 2>/dev/null || echo '/.devcheck/' >>.git/info/exclude
grep -qx '/.devpack/' .git/info/exclude 2>/dev/null || echo '/.devpack/' >>.git/info/exclude
grep -qx '/.devmodel*/' .git/info/exclude 2>/dev/null || echo '/.devmodel*/' >>.git/info/exclude
if [[ " $* " == *" --model "* ]]; then
    m=${MEDLEY_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/medley/models}/SmolLM2-135M-Instruct.Q4_1.gguf
    rm -rf .devmodel*
    split -n 4 -a 2 "$m" /tmp/devmodel-part-
    i=1
    for p in /tmp/devmodel-part-*; do
        mkdir -p .devmodel$i
        mv "$p" .devmodel$i/part-$(basename "$p" | sed 's/devmodel-part-//')
        i=$((i + 1))
    done
fi
du -sh .devcheck .devpack .devmodel* 2>/dev/null
