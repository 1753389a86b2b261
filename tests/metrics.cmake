# Metrics (common/metrics*.c, worker/worker_metrics.c, scheduler/daemon_metrics.c): the
# renderer and HTTP server's unit test is in common.cmake; here the worker and scheduler as a
# real Prometheus (Debian's prometheus package: prometheus + promtool) scrapes them. Registered
# even where prometheus is missing, so such a machine fails it instead of skipping it.
if(NOT MEDLEY_PYTHON)
  return()
endif()
set(MEDLEY_METRICS_TEST_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>")
if(MEDLEY_REDIS_SERVER)
  list(APPEND MEDLEY_METRICS_TEST_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()
add_test(NAME metrics_prometheus
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/metrics_prometheus.py)
set_tests_properties(metrics_prometheus PROPERTIES LABELS integration TIMEOUT 90
                     ENVIRONMENT "${MEDLEY_METRICS_TEST_ENV}")
# metrics_cost_default: without --usd-per-hour a worker takes its --device-type's price from
# the GPU catalog (what deploy/k8s relies on); the flag overrides it (~5 s).
add_test(NAME metrics_cost_default
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/metrics_cost_default.py)
set_tests_properties(metrics_cost_default PROPERTIES LABELS integration TIMEOUT 60
                     ENVIRONMENT "${MEDLEY_METRICS_TEST_ENV}")
