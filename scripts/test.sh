#!/usr/bin/env bash
# Run every test: install dependencies, build (warnings are errors), fetch the test model,
# run ctest (unit, integration against a real redis-server, e2e on SmolLM2, fuzz), then the
# same unit and fuzz tests again under ASan+UBSan.
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
