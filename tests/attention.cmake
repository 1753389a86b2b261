# kernels/cpu/attn_tiled.c: the blocked attention against the double reference at every SIMD
# level, and a row's bits independent of its query tile (what chunked prefill rests on).
medley_test(test_cpu_attention SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cpu_attention.c
            LIBS medley_kernels LABELS unit)

# bench/kernels: the blocked attention against the per-token kernel it replaces, prefill and
# decode shapes (not a test).
add_executable(bench_attention ${CMAKE_SOURCE_DIR}/bench/kernels/bench_attention.c)
target_link_libraries(bench_attention PRIVATE medley_kernels m)
set_target_properties(bench_attention PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
