# deploy/ (docs/operations.md, "Runbook"): the probe command the manifests and units call,
# and offline checks of the manifests, units, alert rules and container build.
# deploy_health: `medley health` against a real redis-server and worker (frozen, draining,
# stopped, loading, Redis gone). deploy_k8s: every manifest through kubernetes-validate
# --strict at a pinned Kubernetes version plus cross-references (Secrets, ConfigMaps,
# selectors, grace periods). deploy_systemd: systemd-analyze verify of both units.
# deploy_prometheus: promtool check rules + promtool test rules. deploy_container: builds
# the CPU image where podman/buildah can, else skips (77) — the only skip the issue allows.
# A missing tool fails the others: scripts/setup.sh installs them.
if(NOT MEDLEY_PYTHON)
  message(WARNING "python3 not found: the deploy tests are not registered")
  return()
endif()
set(MEDLEY_DEPLOY_TEST_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>")
if(MEDLEY_REDIS_SERVER)
  list(APPEND MEDLEY_DEPLOY_TEST_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()

add_test(NAME deploy_health
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_health.py)
add_test(NAME deploy_k8s
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_k8s.py)
add_test(NAME deploy_systemd
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_systemd.sh)
add_test(NAME deploy_prometheus
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_prometheus.sh)
add_test(NAME deploy_container
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_container.sh)
set_tests_properties(deploy_health deploy_k8s deploy_systemd deploy_prometheus deploy_container
                     PROPERTIES LABELS integration TIMEOUT 120
                     ENVIRONMENT "${MEDLEY_DEPLOY_TEST_ENV}")
set_tests_properties(deploy_container PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900)
# deploy_container_packages: what CI can check of the images without podman — every base image
# pinned by digest, the build stage installs the package of every REQUIRED lookup of
# CMakeLists.txt, the runtime stage those of every library the built medley needs (unit, ~1 s).
add_test(NAME deploy_container_packages
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_container_packages.py)
set_tests_properties(deploy_container_packages PROPERTIES LABELS unit TIMEOUT 60
                     ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
# deploy_drain: a dashboard drain exits 10 (final for the systemd unit), a restarted worker
# holds (not ready) until undrained; the --devices supervisor likewise (~15 s).
add_test(NAME deploy_drain
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/deploy_drain.py)
set_tests_properties(deploy_drain PROPERTIES LABELS integration TIMEOUT 90
                     ENVIRONMENT "${MEDLEY_DEPLOY_TEST_ENV}")
