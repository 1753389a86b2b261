# kernels/cpu: SIMD matmul and vector ops against the scalar reference, block layouts
# against the gguf package's dequantization, the thread pool.
medley_test(test_cpu_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cpu_kernels.c
            LIBS medley_kernels LABELS unit)
# the same with the scalar kernels chosen at load (MEDLEY_SIMD), as scripts/test.sh runs the
# end-to-end tests once per level
add_test(NAME test_cpu_kernels_scalar COMMAND test_cpu_kernels)
set_tests_properties(test_cpu_kernels_scalar PROPERTIES LABELS unit ENVIRONMENT MEDLEY_SIMD=scalar)

# kernels/cpu/repack.c: the packed layout and its products at every level against the references
medley_test(test_cpu_repack SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cpu_repack.c
            LIBS medley_kernels LABELS unit)

# bench/kernels: matmul GFLOP/s per type and n, every SIMD level against scalar (not a test;
# built here because the top-level build has no bench/ directory of its own).
add_executable(bench_kernels ${CMAKE_SOURCE_DIR}/bench/kernels/bench_matmul.c)
target_link_libraries(bench_kernels PRIVATE medley_kernels)
set_target_properties(bench_kernels PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

# bench/kernels: memory read bandwidth, the ceiling of single-sequence decode (not a test)
add_executable(bench_membw ${CMAKE_SOURCE_DIR}/bench/kernels/bench_membw.c)
target_link_libraries(bench_membw PRIVATE Threads::Threads)
set_target_properties(bench_membw PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

# kernels/backend.h's device names and facts (md_device_*), with and without CUDA and a GPU.
medley_test(test_backend_devices SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_backend_devices.c
            LIBS medley_kernels LABELS unit)
# encoder steps' packed products against cpu_matmul (bench/kernels/bench_enc_gemm.c)
add_executable(bench_enc_gemm ${CMAKE_SOURCE_DIR}/bench/kernels/bench_enc_gemm.c)
target_link_libraries(bench_enc_gemm PRIVATE medley_kernels)
set_target_properties(bench_enc_gemm PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})

# vexp.h and its users on NaN, +-inf and extremes: softmax, the GLUs, exact GELU and the tiled
# attention at every SIMD level against the scalar level (a NaN stays NaN).
medley_test(test_cpu_nonfinite SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cpu_nonfinite.c
            LIBS medley_kernels LABELS unit)
