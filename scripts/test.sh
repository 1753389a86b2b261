#!/usr/bin/env bash
# Run every test: install dependencies, build (warnings are errors), fetch the test model,
# run ctest (unit, integration against a real redis-server, e2e on SmolLM2, fuzz), then the
# same unit and fuzz tests again under ASan+UBSan, and, where the CUDA toolkit is, the CUDA
# backend on the CPU emulator under ASan+UBSan with every device buffer its own allocation
# (MEDLEY_CUDA_POOL_EXACT=1), so a kernel reading or writing past a buffer fails there, as it
# would fault on a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEDLEY_WERROR=ON >/dev/null
cmake --build build -j "$jobs"
bash scripts/fetch-model.sh build/cli/medley
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 1500
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMEDLEY_WERROR=ON -DMEDLEY_SANITIZE=ON \
      -DMEDLEY_CUDA=OFF >/dev/null
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs" -L 'unit|fuzz' --timeout 1500
# (where the main build made the emulator: the CUDA toolkit, C++20 and python3 are there)
if [ -x build/tests/test_cuda_backend_emu ]; then
    emu_tests="test_cuda_emu test_cuda_backend_emu test_cuda_engine_emu test_cuda_kernels_emu
        test_cuda_graphs_emu medley_emu medley_gpu_bench_emu medley_gemv_bench_emu
        medley_attn_bench_emu medley_sample_bench_emu test_cuda_device_select test_cuda_step_plan
        test_cuda_graph_cache"
    cmake -S . -B build-emu-asan -DCMAKE_BUILD_TYPE=Debug -DMEDLEY_WERROR=ON -DMEDLEY_SANITIZE=ON \
          -DMEDLEY_CUDA=ON -DMEDLEY_CUDA_ARCHS=90 >/dev/null
    # shellcheck disable=SC2086
    cmake --build build-emu-asan -j "$jobs" --target $emu_tests
    MEDLEY_CUDA_POOL_EXACT=1 ctest --test-dir build-emu-asan --output-on-failure -j "$jobs" \
        --timeout 1500 -R '^(test_cuda_(emu|backend_emu|engine_emu|engine_fault_emu|kernels_emu|graphs_emu)|test_device_check_emu)$'
else
    echo "test.sh: no CUDA emulator in build/ (no CUDA toolkit): its ASan run is skipped"
fi
