# Device faults (tests/unit/fault_backend.c: kernels/cuda's errors imitated over the CPU
# backend): the engine's failed-step path on SmolLM2 (unit, so it also runs under ASan+UBSan;
# skipped when the model is not fetched), and the worker's answers when its device dies
# mid-batch against a real redis-server (integration).
medley_test(test_engine_faults
            SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_engine_faults.c
                    ${CMAKE_CURRENT_SOURCE_DIR}/unit/fault_backend.c
            LIBS medley_engine PkgConfig::JANSSON LABELS unit)
set_tests_properties(test_engine_faults PROPERTIES TIMEOUT 600)
# A fault in each op of the unfused pass, and in the fused products / rope_kv / recorded
# passes: separate entries, so the three run in parallel (each loads SmolLM2 per case).
add_test(NAME test_engine_faults_anyop COMMAND test_engine_faults anyop)
add_test(NAME test_engine_faults_fused COMMAND test_engine_faults fused)
set_tests_properties(test_engine_faults_anyop test_engine_faults_fused PROPERTIES
                     LABELS unit TIMEOUT 600)
# NaN outputs of a kernel never become tokens of a successful answer: the engine fails the
# sequences whose logits are not numbers (device argmax answers -1 for a NaN row).
add_test(NAME test_engine_faults_nan COMMAND test_engine_faults nan)
set_tests_properties(test_engine_faults_nan PROPERTIES LABELS unit TIMEOUT 600
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")

medley_test(test_worker_faults
            SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_worker_faults.c
                    ${CMAKE_CURRENT_SOURCE_DIR}/unit/fault_backend.c
            LIBS medley_worker PkgConfig::JANSSON LABELS integration)
set(FAULTS_TEST_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>")
if(MEDLEY_REDIS_SERVER)
  list(APPEND FAULTS_TEST_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()
set_tests_properties(test_worker_faults PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${FAULTS_TEST_ENV}")
# The worker's fault cases, one entry each (test_worker_faults CASE):
#  lossless: nothing lost to a dead device: the worker hands back the entries of a device that
#    failed (not the requests' fault), stops and exits 1; the healthy worker answers them,
#    none failed, none in the DLQ.
#  lastattempt: a request the device failed on its last delivery (max_attempts 1) is answered
#    with the device's sentence instead of going to the DLQ without it.
#  hung: a step that never returns (kind=hang): the step watchdog hands its requests back
#    within 6 s (visibility 60 s), a healthy worker completes the batch while the dead one is
#    stuck, and the dead one stops with "looks hung" once its step returns.
#  loadhung: a model load that never returns (kind=hang in reserve): at startup the process
#    exits 1 within the 0.8 s load limit; under --follow-plan the worker keeps its heartbeat
#    key and the leases of the echo requests it holds alive while the plan's second model
#    hangs in its load, hands them back once the 4 s load limit passes, and stops with "ran
#    past".
foreach(c lossless lastattempt hung loadhung)
  add_test(NAME test_worker_faults_${c} COMMAND test_worker_faults ${c})
  set_tests_properties(test_worker_faults_${c} PROPERTIES LABELS integration TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${FAULTS_TEST_ENV}")
endforeach()
