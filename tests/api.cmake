# `medley api` (api/, cli/cmd_api.c; docs/api.md): integration tests with their own
# redis-server, real `medley worker` processes and the real `openai` Python SDK
# (scripts/requirements-test.txt). api_openai_sdk: OpenAI's documented Batch flow and
# tenant isolation; api_hostile: bad multipart, huge bodies and headers, traversal ids,
# JSON bombs, a connection flood and slowloris, bounded; api_crash: the API process and a
# worker SIGKILLed mid-batch with two API processes alternated, every custom_id once
# (2,000 lines here); api_curl: the curl walk-through of docs/api.md, run as written;
# api_online: online chat and completions, streamed and not, refusals, cancels, an API
# process killed mid-stream, priority over a batch.
# Label long (left out by scripts/test.sh, run by hand: ctest -L long): the issue's sizes,
# api_hostile_full (10,000 connections held, a 30 s slowloris of 2,000, against the default
# limits; ~1 min, needs ulimit -n >= 10500) and api_crash_full (20,000 lines, ~2 min).
# test_api_keys (unit): the key file and the bearer-token match of api/keys.c.
medley_test(test_api_keys SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_api_keys.c
            LIBS medley_api LABELS unit)
# test_api_sse (unit): the event-stream chunks and JSON answers made from output lines (api/sse.c).
medley_test(test_api_sse SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_api_sse.c
            LIBS medley_api LABELS unit)
if(NOT MEDLEY_PYTHON)
  message(WARNING "python3 not found: the api's integration tests are not registered")
  return()
endif()
set(MEDLEY_API_TEST_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>" "MEDLEY_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
if(MEDLEY_REDIS_SERVER)
  list(APPEND MEDLEY_API_TEST_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()
foreach(t api_openai_sdk api_hostile api_crash api_curl api_online)
  add_test(NAME ${t} COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/${t}.py)
  set_tests_properties(${t} PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "${MEDLEY_API_TEST_ENV}")
endforeach()
add_test(NAME api_hostile_full COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/api_hostile.py)
set_tests_properties(api_hostile_full PROPERTIES LABELS long TIMEOUT 600 RUN_SERIAL ON
                     ENVIRONMENT "${MEDLEY_API_TEST_ENV};MEDLEY_API_HOSTILE_FULL=1")
add_test(NAME api_crash_full COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/api_crash.py)
set_tests_properties(api_crash_full PROPERTIES LABELS long TIMEOUT 600 RUN_SERIAL ON
                     ENVIRONMENT "${MEDLEY_API_TEST_ENV};MEDLEY_API_CRASH_LINES=20000")
# api_smollm2 (e2e): the same flow on SmolLM2-135M through the real engine, 3 short requests;
# skipped (77) where the model is not fetched.
add_test(NAME api_smollm2 COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/api_smollm2.py)
set_tests_properties(api_smollm2 PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${MEDLEY_API_TEST_ENV}")
# api_online_smollm2 (e2e): online chat and completions on SmolLM2-135M, the SDK's stream
# iterator's text equal to the answer at temperature 0; skipped (77) without the model.
add_test(NAME api_online_smollm2
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/api_online_smollm2.py)
set_tests_properties(api_online_smollm2 PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77
                     ENVIRONMENT "${MEDLEY_API_TEST_ENV}")
# bench/api scaled down on the echo model (seconds): bench_api.py (a 200-line batch, both
# paths) and bench_online.py (3 requests each way), both on bench_api.py's medley_stack.
add_test(NAME bench_api_small
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_SOURCE_DIR}/bench/api/bench_api.py
                 --medley $<TARGET_FILE:medley> -n 200 --reps 1)
add_test(NAME bench_online_echo
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_SOURCE_DIR}/bench/api/bench_online.py
                 --medley $<TARGET_FILE:medley> --model echo --reps 3 --max-tokens 4)
set_tests_properties(bench_api_small bench_online_echo PROPERTIES LABELS integration TIMEOUT 120)
