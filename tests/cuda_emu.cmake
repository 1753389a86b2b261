# test_cuda_emu: kernels/cuda's kernels compiled as host C++ (launchers stripped by
# tests/gpu/emu/strip.py) and run on a fiber emulator of the CUDA device API
# (tests/gpu/emu/fake/), against the CPU backend, engine/weights/quant.c and the host sampler. Needs
# no GPU and no CUDA toolkit; C++20 and ucontext (one fiber per CUDA thread). Its reference
# code is compiled here without MEDLEY_HAVE_CUDA so nothing of medley_cuda is linked.
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_FLAGS "-std=c++20")
check_cxx_source_compiles("#include <ucontext.h>\n#include <span>\nint main(){ucontext_t u;return getcontext(&u);}"
                          MEDLEY_HAVE_EMU_CXX)
unset(CMAKE_REQUIRED_FLAGS)
# medley_emu_orders(NAME BINARY ORDERS o... [LABELS l...] [ENV v...]): test NAME_o runs
# BINARY with each block's threads resumed in order o (emu.cc MEDLEY_EMU_ORDER: reverse,
# random:SEED), so a kernel reading another thread's write without a barrier between fails in
# some of them; labelled emu (CI's main build) and LABELS; used here and in cuda_emu_rt.cmake
function(medley_emu_orders name binary)
  cmake_parse_arguments(T "" "" "ORDERS;ENV;LABELS" ${ARGN})
  foreach(order ${T_ORDERS})
    string(REPLACE ":" "_" oname ${order})
    set(env ${T_ENV})
    list(APPEND env "MEDLEY_EMU_ORDER=${order}")
    add_test(NAME ${name}_${oname} COMMAND ${binary})
    set(labels emu ${T_LABELS})
    set_tests_properties(${name}_${oname} PROPERTIES LABELS "${labels}" TIMEOUT 1200
                         SKIP_RETURN_CODE 77 ENVIRONMENT "${env}")
  endforeach()
endfunction()

if(MEDLEY_HAVE_EMU_CXX AND MEDLEY_PYTHON)
  set(EMU ${CMAKE_CURRENT_SOURCE_DIR}/gpu/emu)
  set(EMU_GEN ${CMAKE_CURRENT_BINARY_DIR}/emu/gen)
  set(EMU_GENERATED)
  foreach(f attention gemm sample elementwise dequant)
    add_custom_command(OUTPUT ${EMU_GEN}/${f}.cc
      COMMAND ${CMAKE_COMMAND} -E make_directory ${EMU_GEN}
      COMMAND ${MEDLEY_PYTHON} ${EMU}/strip.py ${CMAKE_SOURCE_DIR}/kernels/cuda/${f}.cu
              ${EMU_GEN}/${f}.cc
      DEPENDS ${EMU}/strip.py ${CMAKE_SOURCE_DIR}/kernels/cuda/${f}.cu
      COMMENT "emulation source from kernels/cuda/${f}.cu")
    list(APPEND EMU_GENERATED ${EMU_GEN}/${f}.cc)
  endforeach()
  file(GLOB EMU_CPU_SRCS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cpu/*.c)
  add_library(medley_emu_ref STATIC ${CMAKE_SOURCE_DIR}/kernels/backend.c ${EMU_CPU_SRCS}
              ${CMAKE_SOURCE_DIR}/engine/weights/gguf.c ${CMAKE_SOURCE_DIR}/engine/weights/quant.c
              ${CMAKE_SOURCE_DIR}/engine/sampler.c ${CMAKE_SOURCE_DIR}/kernels/cuda/step_plan.c)
  target_link_libraries(medley_emu_ref PUBLIC medley_common Threads::Threads m)
  add_executable(test_cuda_emu ${EMU}/test_cuda_emu.cc ${EMU}/emu.cc ${EMU_GENERATED})
  set_source_files_properties(${EMU_GENERATED} PROPERTIES HEADER_FILE_ONLY ON)
  target_compile_features(test_cuda_emu PRIVATE cxx_std_20)
  target_compile_options(test_cuda_emu PRIVATE -O1 -w)
  target_include_directories(test_cuda_emu BEFORE PRIVATE ${EMU}/fake ${CMAKE_CURRENT_BINARY_DIR}/emu
                             ${CMAKE_SOURCE_DIR})
  target_compile_definitions(test_cuda_emu PRIVATE MEDLEY_FIXTURES="${MEDLEY_FIXTURES}")
  target_link_libraries(test_cuda_emu PRIVATE medley_emu_ref)
  add_test(NAME test_cuda_emu COMMAND test_cuda_emu)
  set_tests_properties(test_cuda_emu PROPERTIES LABELS "emu;emu-short" TIMEOUT 1200)
  medley_emu_orders(test_cuda_emu test_cuda_emu ORDERS reverse random:1)
endif()
