# kernels/cpu: SIMD matmul and vector ops against the scalar reference, block layouts
# against the gguf package's dequantization, the thread pool.
medley_test(test_cpu_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cpu_kernels.c
            LIBS medley_kernels LABELS unit)
