# The CUDA backend's host logic without a GPU: kernels/cuda/backend_cuda.c (decode steps as
# CUDA graphs), step_plan.c and graph_cache.c compiled into the test and run under the real
# engine over tests/unit/fake_cuda.c, which defines every cuda_ops.h launcher and CUDA runtime
# call they use and records the launches. No libcudart or medley_cuda is needed: only the
# toolkit's headers (cuda_runtime_api.h), so the test is registered wherever those are found,
# with or without nvcc. In a CUDA build medley_kernels links medley_cuda and libcudart too;
# this binary's own definitions come first on the link line, so no medley_cuda object is
# pulled in and the shared libcudart's symbols are not used.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  medley_test(test_cuda_host
              SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_cuda_host.c
                      ${CMAKE_CURRENT_SOURCE_DIR}/unit/fake_cuda.c
                      ${CMAKE_SOURCE_DIR}/kernels/cuda/backend_cuda.c
                      ${CMAKE_SOURCE_DIR}/kernels/cuda/step_plan.c
                      ${CMAKE_SOURCE_DIR}/kernels/cuda/graph_cache.c
              LIBS medley_engine PkgConfig::JANSSON LABELS unit)
  target_include_directories(test_cuda_host SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  set_tests_properties(test_cuda_host PROPERTIES TIMEOUT 120)
endif()
