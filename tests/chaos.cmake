# The chaos suite (tests/chaos/chaos.py): echo requests through real workers and a real
# redis-server while workers are SIGKILLed and SIGSTOPped, Redis is restarted, every client
# connection is dropped (CLIENT KILL) and Redis's memory fills; fails on any lost, doubled or
# stuck request or error answer. CI runs the short form (label chaos, about 60-90 s); the
# long form (50,000 requests) is run by hand, see tests/chaos/README.md.
if(NOT MEDLEY_PYTHON)
  return()
endif()
set(MEDLEY_CHAOS_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>")
if(MEDLEY_REDIS_SERVER)
  list(APPEND MEDLEY_CHAOS_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()
add_test(NAME chaos_short
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/chaos/chaos.py --short)
set_tests_properties(chaos_short PROPERTIES LABELS chaos TIMEOUT 600
                     ENVIRONMENT "${MEDLEY_CHAOS_ENV}")
