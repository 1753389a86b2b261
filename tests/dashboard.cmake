# The dashboard (dashboard/, cli/cmd_dashboard.c): a unit test of the token check and the
# UTF-8 repair; integration tests with their own
# redis-server, real workers and the real binary. dashboard_browser drives Debian's chromium
# through chromium-driver with selenium (scripts/setup.sh, scripts/requirements-test.txt);
# it fails, not skips, where they are missing. Its screenshots go to build/artifacts/.
# dashboard_ops (Chromium too): the plan at phone width, unserved batches and their cancel,
# the read token, DLQ prompt bodies hidden by default (~15 s).
medley_test(test_dashboard SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_dashboard.c
            LIBS medley_dashboard LABELS unit)

if(NOT MEDLEY_PYTHON)
  message(WARNING "python3 not found: the dashboard's integration tests are not registered")
  return()
endif()
set(MEDLEY_DASH_TEST_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>"
    "MEDLEY_ARTIFACTS=${CMAKE_BINARY_DIR}/artifacts")
if(MEDLEY_REDIS_SERVER)
  list(APPEND MEDLEY_DASH_TEST_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()
foreach(t dashboard_actions dashboard_browser dashboard_ops)
  add_test(NAME ${t} COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/${t}.py)
  set_tests_properties(${t} PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "${MEDLEY_DASH_TEST_ENV}")
endforeach()
