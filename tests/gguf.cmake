# GGUF reader, dequantization, model registry and the unpacking of zipped models. The tests compile engine/weights/gguf.c and
# engine/weights/quant.c directly so they build even while other engine/kernels files are in flux.
set(MEDLEY_GGUF_SRCS ${CMAKE_SOURCE_DIR}/engine/weights/gguf.c ${CMAKE_SOURCE_DIR}/engine/weights/quant.c)
medley_test(test_gguf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_gguf.c ${MEDLEY_GGUF_SRCS}
            LABELS unit)
medley_test(test_gguf_dequant SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_gguf_dequant.c
            ${MEDLEY_GGUF_SRCS} LABELS unit)
medley_test(test_gguf_fuzz SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/test_gguf_fuzz.c
            ${MEDLEY_GGUF_SRCS} LABELS fuzz)
medley_test(test_registry SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_registry.c
            LIBS medley_engine LABELS unit)
# the safe unzip of a model shipped as a zip (all-minilm-l6-v2): hostile archives; ~1 s
medley_test(test_model_unpack SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_model_unpack.c
            ${CMAKE_SOURCE_DIR}/cli/model_unpack.c ${CMAKE_SOURCE_DIR}/cli/child.c LABELS unit)
# libFuzzer target: clang only, not a ctest (run it by hand, see tests/fuzz/fuzz_gguf.c).
if(CMAKE_C_COMPILER_ID MATCHES "Clang")
  add_executable(fuzz_gguf ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/fuzz_gguf.c ${MEDLEY_GGUF_SRCS})
  target_compile_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(fuzz_gguf PRIVATE medley_common m)
endif()
