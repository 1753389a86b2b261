# Device faults (tests/unit/fault_backend.c: kernels/cuda's errors imitated over the CPU
# backend): the engine's failed-step path on SmolLM2 (unit, so it also runs under ASan+UBSan;
# skipped when the model is not fetched), and the worker's answers when its device dies
# mid-batch against a real redis-server (integration).
medley_test(test_engine_faults
            SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_engine_faults.c
                    ${CMAKE_CURRENT_SOURCE_DIR}/unit/fault_backend.c
            LIBS medley_engine PkgConfig::JANSSON LABELS unit)
set_tests_properties(test_engine_faults PROPERTIES TIMEOUT 300)
# NaN outputs of a kernel must never become tokens of a successful answer. DISABLED: today
# they do (NaN logits: greedy rows get token 0 from the argmax, sampled rows a token from NaN
# probabilities, and the sequences finish "length" as if nothing happened); enable it when
# the engine fails the sequences whose logits are not finite.
add_test(NAME test_engine_faults_nan COMMAND test_engine_faults nan)
set_tests_properties(test_engine_faults_nan PROPERTIES LABELS unit TIMEOUT 300 DISABLED TRUE
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
# Nothing lost to a dead device (its requests retried by the healthy worker, none failed, none
# in the DLQ). DISABLED until the worker hands back the entries of a device that failed
# instead of answering them with server_error (today the dead worker fails the whole batch
# within milliseconds: see the "answered" test's output); enable it with that change.
add_test(NAME test_worker_faults_lossless COMMAND test_worker_faults lossless)
set_tests_properties(test_worker_faults_lossless PROPERTIES LABELS integration TIMEOUT 300
                     SKIP_RETURN_CODE 77 DISABLED TRUE ENVIRONMENT "${FAULTS_TEST_ENV}")
