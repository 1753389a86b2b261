# Sharded replicas on the worker's side (worker/worker_shard.c, docs/protocol.md §6 "Sharded
# replicas"): real redis-server, real binary, SmolLM2-135M on the CPU; skipped (exit 77) where
# the model is not fetched, and their TCP parts where this build has no `medley stage`.
#  worker_stages: --stages cpu:0-6,cpu:7-29 answers as a plain worker does; a remote stage that
#    does not answer leaves the worker up, reading nothing, saying why; a `medley stage`
#    SIGKILLed mid-batch and restarted: the head hands back, forms again, every answer once.
#  plan_stages: a plan with one two-stage replica over two --follow-plan workers (head and
#    stage); 2,000 requests exactly once, then again with the stage worker SIGKILLed
#    mid-batch and restarted.
if(NOT MEDLEY_PYTHON)
  return()
endif()
set(SHARDING_WORKER_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>")
if(MEDLEY_REDIS_SERVER)
  list(APPEND SHARDING_WORKER_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()
foreach(t worker_stages plan_stages)
  add_test(NAME ${t} COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/${t}.py)
  set_tests_properties(${t} PROPERTIES LABELS integration TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${SHARDING_WORKER_ENV}")
endforeach()
