# CUDA backend tests (kernels/cuda). Built only when nvcc is found. The gpu-labelled tests
# exit 77 (ctest SKIP, with the reason printed) where no CUDA device is usable, and run on
# a GPU host (tests/gpu/run-device-check.sh runs them with the GPU benchmark).
# test_cuda_device_select runs everywhere: "cuda:0" without a GPU must be a clear refusal.
if(MEDLEY_HAVE_CUDA)
  medley_test(test_cuda_device_select
              SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_device_select.c
              LIBS medley_kernels LABELS unit)
  medley_test(test_cuda_step_plan SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_step_plan.c
              LIBS medley_cuda LABELS unit)
  medley_test(test_cuda_graph_cache SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_graph_cache.c
              LIBS medley_cuda LABELS unit)
  # nccl.c's run-time loading of libnccl (no GPU needed); skips on a build without NCCL
  medley_test(test_cuda_nccl_load SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_nccl_load.c
              LIBS medley_cuda LABELS unit)
  set_tests_properties(test_cuda_nccl_load PROPERTIES SKIP_RETURN_CODE 77)
  medley_test(test_cuda_kernels SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_kernels.c
              LIBS medley_cuda medley_engine LABELS gpu)
  medley_test(test_cuda_backend SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_backend.c
              LIBS medley_kernels medley_engine LABELS gpu)
  medley_test(test_cuda_e2e SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_e2e.c
              LIBS medley_engine medley_kernels PkgConfig::JANSSON LABELS gpu e2e)
  medley_test(test_cuda_graphs SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_graphs.c
              LIBS medley_engine medley_kernels LABELS gpu e2e)
  medley_test(test_cuda_engine SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_engine.c
              LIBS medley_engine medley_kernels LABELS gpu)
  # encoders (BERT) on the device: each op against the CPU backend, and the embedding path
  # on cuda:0 against cpu (synthetic:minilm-l6, cosine >= 0.9999)
  medley_test(test_cuda_encoder SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_encoder.c
              LIBS medley_engine medley_kernels LABELS gpu)
  # NCCL with one rank on one GPU, tensor-parallel stages on one GPU (host all-reduce) and on
  # two (NCCL) against one GPU's logits
  medley_test(test_cuda_tp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_cuda_tp.c
              LIBS medley_engine medley_kernels LABELS gpu)
  set_tests_properties(test_cuda_kernels test_cuda_backend test_cuda_e2e test_cuda_graphs
                       test_cuda_engine test_cuda_tp test_cuda_encoder PROPERTIES
                       SKIP_RETURN_CODE 77)
endif()

# `medley profile` on the CPU backend writes a document that validates against
# schemas/profile.schema.json (needs the e2e model; skips without it).
if(MEDLEY_PYTHON)
  add_test(NAME test_profile_cpu COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/gpu/check_profile.py)
  set_tests_properties(test_profile_cpu PROPERTIES LABELS e2e SKIP_RETURN_CODE 77
                       ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
endif()

# The GPU benchmark (bench/gpu): built with the rest so CI compiles it; run by
# tests/gpu/run-device-check.sh on a GPU host.
if(MEDLEY_HAVE_CUDA)
  add_executable(medley_gpu_bench ${CMAKE_SOURCE_DIR}/bench/gpu/bench_llama8b.c)
  target_link_libraries(medley_gpu_bench PRIVATE medley_cuda medley_common m)
  add_executable(medley_gemv_bench ${CMAKE_SOURCE_DIR}/bench/gpu/bench_gemv.c)
  target_link_libraries(medley_gemv_bench PRIVATE medley_cuda medley_common m)
  add_executable(medley_attn_bench ${CMAKE_SOURCE_DIR}/bench/gpu/bench_attn.c)
  target_link_libraries(medley_attn_bench PRIVATE medley_cuda medley_common m)
  add_executable(medley_sample_bench ${CMAKE_SOURCE_DIR}/bench/gpu/bench_sample.c)
  target_link_libraries(medley_sample_bench PRIVATE medley_cuda medley_common m)
endif()
