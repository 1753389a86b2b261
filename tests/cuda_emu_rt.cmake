# The whole CUDA backend on the CPU emulator: kernels/cuda's .cu files with their launchers
# kept (strip.py --launchers turns each <<<>>> launch into a launch on the emulated runtime),
# ctx.cu included, on tests/gpu/emu/emu_rt.cc (the CUDA runtime and cuBLAS calls they make:
# one emulated device, streams that run at once or record while capturing, graphs that
# replay), and backend_cuda.c, step_plan.c and graph_cache.c compiled as they are against the
# toolkit's real cuda_runtime_api.h. The GPU tests' own sources link against it as *_emu
# tests, so the backend's host code, its launchers and its kernels run together, through the
# engine, without a GPU. Needs the toolkit's headers (CUDA builds only), C++20 and Python.
# Slow (one fiber per CUDA thread, all on one host thread): the tests run on small models.
find_package(CUDAToolkit QUIET)
if(MEDLEY_HAVE_CUDA AND CUDAToolkit_FOUND AND MEDLEY_HAVE_EMU_CXX AND MEDLEY_PYTHON)
  set(EMU ${CMAKE_CURRENT_SOURCE_DIR}/gpu/emu)
  set(EMU_RT_GEN ${CMAKE_CURRENT_BINARY_DIR}/emu/rt)
  set(EMU_RT_GENERATED)
  foreach(f ctx attention gemm sample elementwise dequant encoder)
    add_custom_command(OUTPUT ${EMU_RT_GEN}/${f}.cc
      COMMAND ${CMAKE_COMMAND} -E make_directory ${EMU_RT_GEN}
      COMMAND ${MEDLEY_PYTHON} ${EMU}/strip.py --launchers ${CMAKE_SOURCE_DIR}/kernels/cuda/${f}.cu
              ${EMU_RT_GEN}/${f}.cc
      DEPENDS ${EMU}/strip.py ${CMAKE_SOURCE_DIR}/kernels/cuda/${f}.cu
      COMMENT "emulated-runtime source from kernels/cuda/${f}.cu")
    list(APPEND EMU_RT_GENERATED ${EMU_RT_GEN}/${f}.cc)
  endforeach()
  # kernels and launchers (C++ on the fake headers)
  add_library(medley_cuda_emu_dev OBJECT ${EMU}/emu.cc ${EMU}/emu_rt.cc ${EMU_RT_GENERATED})
  target_compile_features(medley_cuda_emu_dev PRIVATE cxx_std_20)
  target_compile_options(medley_cuda_emu_dev PRIVATE -O2 -fno-strict-aliasing -w)
  target_include_directories(medley_cuda_emu_dev BEFORE PRIVATE ${EMU}/fake ${CMAKE_SOURCE_DIR})
  # the backend's host code (C on the real headers)
  add_library(medley_cuda_emu_host OBJECT ${CMAKE_SOURCE_DIR}/kernels/cuda/backend_cuda.c
              ${CMAKE_SOURCE_DIR}/kernels/cuda/step_plan.c
              ${CMAKE_SOURCE_DIR}/kernels/cuda/graph_cache.c)
  target_include_directories(medley_cuda_emu_host PRIVATE ${CMAKE_SOURCE_DIR})
  target_include_directories(medley_cuda_emu_host SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(medley_cuda_emu_host PRIVATE medley_common)

  # name: the test; src: a tests/gpu source built for a real device as well; ENV: more
  # environment for the run; LABELS: emu-short (CI, here and under ASan in build-emu-asan),
  # emu (CI, this build only) or emu-long (by hand: ctest -L emu-long); emu is added to each
  function(medley_emu_test name src)
    cmake_parse_arguments(T "" "" "ENV;LABELS" ${ARGN})
    medley_test(${name} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/gpu/${src}
                $<TARGET_OBJECTS:medley_cuda_emu_dev> $<TARGET_OBJECTS:medley_cuda_emu_host>
                LIBS medley_engine medley_kernels PkgConfig::JANSSON Threads::Threads
                LABELS emu ${T_LABELS})
    set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
    if(T_ENV)
      set_property(TEST ${name} APPEND PROPERTY ENVIRONMENT ${T_ENV})
    endif()
  endfunction()
  medley_emu_test(test_cuda_backend_emu test_cuda_backend.c LABELS emu-short)
  # the backend's host logic (graphs, weight copies, argument checks) on the real ctx.cu and
  # gemm.cu, compared through emu_rt.cc's launch log (an emulator-only test, no device build)
  medley_emu_test(test_cuda_host_emu emu/test_cuda_host_emu.c)
  medley_emu_test(test_cuda_engine_emu test_cuda_engine.c LABELS emu-short)
  # encoders (BERT): each encoder op against the CPU backend, then the embedder on a small
  # synthetic BERT on cuda:0 against cpu (cosine >= 0.9999)
  medley_emu_test(test_cuda_encoder_emu test_cuda_encoder.c LABELS emu-short
                  ENV MEDLEY_GPU_TEST_SMALL=1)
  medley_emu_orders(test_cuda_encoder_emu test_cuda_encoder_emu ORDERS reverse random:1
                    ENV MEDLEY_GPU_TEST_SMALL=1)
  # the backend and the kernel test with each block's threads resumed in other orders
  medley_emu_orders(test_cuda_backend_emu test_cuda_backend_emu ORDERS reverse random:1)
  # the same binary's fault case: the 40th launch (after the model's load, within its first
  # steps) leaves a sticky illegal-address error
  add_test(NAME test_cuda_engine_fault_emu COMMAND test_cuda_engine_emu)
  set_tests_properties(test_cuda_engine_fault_emu PROPERTIES LABELS "emu;emu-short" TIMEOUT 300
                       ENVIRONMENT "MEDLEY_EMU_FAIL_LAUNCH=40;MEDLEY_TEST_FILTER=*fault*")
  # the engine on the emulated device, graphs and device sampling, on a small synthetic model:
  # every case (2 to 6 minutes here) by hand; CI its small-batch case (also under ASan) and
  # its penalties case
  medley_emu_test(test_cuda_graphs_emu test_cuda_graphs.c LABELS emu-long
                  ENV MEDLEY_GPU_TEST_MODEL=synthetic:tiny-hd64:q4_0)
  add_test(NAME test_cuda_graphs_emu_short COMMAND test_cuda_graphs_emu)
  set_tests_properties(test_cuda_graphs_emu_short PROPERTIES LABELS "emu;emu-short" TIMEOUT 900
                       SKIP_RETURN_CODE 77 ENVIRONMENT
                       "MEDLEY_GPU_TEST_MODEL=synthetic:tiny-hd64:q4_0;MEDLEY_TEST_FILTER=*small_batches*")
  add_test(NAME test_cuda_graphs_emu_penalties COMMAND test_cuda_graphs_emu)
  set_tests_properties(test_cuda_graphs_emu_penalties PROPERTIES LABELS emu TIMEOUT 900
                       SKIP_RETURN_CODE 77 ENVIRONMENT
                       "MEDLEY_GPU_TEST_MODEL=synthetic:tiny-hd64:q4_0;MEDLEY_TEST_FILTER=*penalties*")
  # SmolLM2 on the emulated device against the CPU backend and llama.cpp (the fixtures):
  # built, not run by ctest (tens of minutes here); run it by hand (docs/cuda.md)
  medley_emu_test(test_cuda_e2e_emu test_cuda_e2e.c)
  # the GPU kernel test (dequantization, every matmul path, sampling, graphs, the pool, sticky
  # errors) on the emulator at small shapes (MEDLEY_GPU_TEST_SMALL)
  medley_emu_test(test_cuda_kernels_emu test_cuda_kernels.c LABELS emu-short
                  ENV MEDLEY_GPU_TEST_SMALL=1)
  medley_emu_orders(test_cuda_kernels_emu test_cuda_kernels_emu ORDERS reverse
                    LABELS emu-long ENV MEDLEY_GPU_TEST_SMALL=1)
  set_tests_properties(test_cuda_e2e_emu PROPERTIES DISABLED TRUE)
  # its logits cases alone, by hand (3 minutes or more here): SmolLM2's logits on the
  # emulated device against the CPU backend, the exact f64 pass and llama.cpp
  add_test(NAME test_cuda_e2e_logits_emu COMMAND test_cuda_e2e_emu)
  set_tests_properties(test_cuda_e2e_logits_emu PROPERTIES LABELS "emu;emu-long;e2e" TIMEOUT 900
                       SKIP_RETURN_CODE 77 ENVIRONMENT "MEDLEY_TEST_FILTER=*logits*")

  # The device check's other binaries on the emulator, for its rehearsal
  # (tests/gpu/run-device-check.sh --emu): the CLI (medley profile --device cuda:0) and the
  # GPU benchmarks, the same sources linked on the emulated runtime
  function(medley_emu_exe name)
    add_executable(${name} ${ARGN} $<TARGET_OBJECTS:medley_cuda_emu_dev>
                   $<TARGET_OBJECTS:medley_cuda_emu_host>)
    set_target_properties(${name} PROPERTIES LINKER_LANGUAGE CXX)
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR})
  endfunction()
  file(GLOB MEDLEY_CLI_EMU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/cli/*.c)
  medley_emu_exe(medley_emu ${MEDLEY_CLI_EMU_SOURCES})
  target_link_libraries(medley_emu PRIVATE medley_api medley_dashboard medley_worker medley_queue
                        medley_sched medley_engine medley_kernels medley_common m)
  foreach(b gpu:bench_llama8b gemv:bench_gemv attn:bench_attn sample:bench_sample)
    string(REPLACE ":" ";" bp ${b})
    list(GET bp 0 bname)
    list(GET bp 1 bsrc)
    medley_emu_exe(medley_${bname}_bench_emu ${CMAKE_SOURCE_DIR}/bench/gpu/${bsrc}.c)
    target_link_libraries(medley_${bname}_bench_emu PRIVATE medley_engine medley_kernels medley_common m)
  endforeach()
  # the rehearsal itself: the whole device check script on the emulator at small shapes,
  # every step run and read back into summary.md (PyTorch's steps skip where torch is absent)
  add_test(NAME test_device_check_emu
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/gpu/run-device-check.sh --emu)
  set_tests_properties(test_device_check_emu PROPERTIES LABELS emu TIMEOUT 900
                       ENVIRONMENT "MEDLEY_EMU_BUILD=${CMAKE_BINARY_DIR};OUT=${CMAKE_BINARY_DIR}/devcheck-emu")
endif()
