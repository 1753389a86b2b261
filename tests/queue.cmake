# The queue (queue/, worker/, common/redis.c, cli/cmd_worker.c, cmd_client.c, cmd_run.c): unit
# tests of validation, output-line logprobs and URLs; integration tests that start their own
# redis-server and drive the real `medley` binary (and a redis-py client and worker written from
# docs/protocol.md). They are registered even when redis-server is missing, so that a machine
# without it fails them ("redis-server not found") instead of skipping them silently.
medley_test(test_validate SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_validate.c
            LIBS medley_queue LABELS unit)
medley_test(test_queue_online SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_queue_online.c
            LIBS medley_queue LABELS unit)
medley_test(test_worker_logprobs SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_worker_logprobs.c
            LIBS medley_worker LABELS unit)
medley_test(test_queue_redis_url SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_queue_redis_url.c
            LIBS medley_queue LABELS unit)
medley_test(test_queue_plan SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_queue_plan.c
            LIBS medley_queue LABELS unit)
medley_test(test_worker_assign SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_worker_assign.c
            LIBS medley_worker LABELS unit)
# worker/worker_answer.c and worker_metrics.c, the worker's leaves, against a redis-server they
# start on a free port (tests/unit/redis_fixture.h).
medley_test(test_worker_answer SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_worker_answer.c
            LIBS medley_worker LABELS unit)
medley_test(test_worker_metrics SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_worker_metrics.c
            LIBS medley_worker LABELS unit)
foreach(t test_worker_answer test_worker_metrics)
  if(MEDLEY_REDIS_SERVER)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
  endif()
endforeach()
# worker/grammars.c: the per-runner cache of compiled constraints, with the real compiler.
medley_test(test_worker_grammars SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_worker_grammars.c
            LIBS medley_worker LABELS unit)
# Mutated input lines through validation, the grammar cache and a matcher's first masks.
medley_test(test_validate_fuzz SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/test_validate_fuzz.c
            LIBS medley_worker LABELS fuzz)
set_tests_properties(test_validate_fuzz PROPERTIES TIMEOUT 600)
# worker/supervise.c (medley worker --devices) with /bin/sh children and short backoffs.
medley_test(test_supervise SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_supervise.c
            LIBS medley_worker LABELS unit)

if(NOT MEDLEY_PYTHON)
  message(WARNING "python3 not found: the queue's integration tests are not registered")
  return()
endif()
set(MEDLEY_QUEUE_TEST_ENV "MEDLEY_BIN=$<TARGET_FILE:medley>")
if(MEDLEY_REDIS_SERVER)
  list(APPEND MEDLEY_QUEUE_TEST_ENV "MEDLEY_REDIS_SERVER=${MEDLEY_REDIS_SERVER}")
endif()

# medley_queue_py(NAME SCRIPT LABEL TIMEOUT [args...]): tests/integration/SCRIPT.py with args,
# in the queue tests' environment; an e2e one skips (exit 77) where the model is not fetched
function(medley_queue_py name script label timeout)
  add_test(NAME ${name}
           COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/${script}.py ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS ${label} TIMEOUT ${timeout}
                       ENVIRONMENT "${MEDLEY_QUEUE_TEST_ENV}")
  if(label STREQUAL "e2e")
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()

# Integration: plain python3 scripts (redis-py, jsonschema from scripts/requirements-test.txt).
# plan_routing: `medley submit` picks class streams as docs/protocol.md says; plan_follow:
# --follow-plan on hand-written plans (a model moved between workers mid-batch, reclaim and
# DLQ on class streams); plan_scheduler: the same with plans from the real `medley scheduler`.
foreach(t queue_crash queue_redis_restart queue_malformed queue_lifecycle protocol_client
        protocol_worker plan_routing plan_follow plan_scheduler)
  medley_queue_py(${t} ${t} integration 300)
endforeach()

# queue_hostile: issue 25's defects, one test each (docs/protocol.md §3, §6, §8): a custom_id
# hidden in a line too large to parse, reconnects counted as deliveries, Redis refusing the
# completion script (OOM, NOPERM), slow takeover under a backlog, class streams of a plan
# unread by --model workers.
foreach(c dupid reconnect refused refused_heartbeat takeover classes)
  medley_queue_py(queue_hostile_${c} queue_hostile integration 300 ${c})
endforeach()

# Redis failover through Sentinel (common/redis_dial.c): a primary, a replica and three
# redis-sentinel on loopback; the primary SIGKILLed mid-batch while the replica lags, then a
# SENTINEL FAILOVER, then a hand demotion of a plain redis:// primary (~40 s). Every
# custom_id exactly once on the surviving primary (docs/protocol.md §6).
medley_queue_py(queue_sentinel queue_sentinel integration 240)

# Every schema is valid and every example follows it (no Redis needed).
add_test(NAME queue_schema_examples
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/queue_schema_examples.py)
set_tests_properties(queue_schema_examples PROPERTIES LABELS unit)

# e2e: medley run with the real engine on SmolLM2 (skipped, code 77, when the model is absent).
medley_queue_py(queue_run_smollm2 queue_run_smollm2 e2e 900)

# Sampling extras and logprobs of input lines (queue/validate.c, worker/logprobs.c):
# worker_sampling on the echo model through a real Redis; worker_sampling_smollm2 on the real
# engine through `medley run`, against `medley generate` with the same flags.
medley_queue_py(worker_sampling worker_sampling integration 120)
medley_queue_py(worker_sampling_smollm2 worker_sampling e2e 600 --engine)

# Structured outputs, the request side (docs/structured.md): response_format, tools, medley's
# regex / choice / grammar, logit_bias, refused fields and hostile schemas in one `medley run`
# on SmolLM2; stop answers validate with jsonschema, tool calls parse with the openai SDK.
medley_queue_py(structured_run structured_run e2e 600)

# medley worker --devices: one supervisor, one child worker per device (worker/supervise.h).
# worker_devices: bad device lists, 2,000 echo requests over two children with one SIGKILLed
# and restarted, SIGTERM stop, give-up on children that cannot start (~20 s);
# worker_devices_smollm2: 8 short requests on the real engine over two CPU children.
medley_queue_py(worker_devices worker_devices integration 300)
medley_queue_py(worker_devices_smollm2 worker_devices e2e 600 --engine)

# TLS and least privilege (docs/operations.md): queue_acl_source checks deploy/redis/users.acl
# against the commands the C source sends (scripts/redis-acl.py; no Redis); queue_tls_acl runs
# a worker and every client command as that user through an stunnel sidecar to a TLS-only
# redis-server, and checks NOPERM outside medley:*, --prefix errors and certificate checks
# (~15 s; needs stunnel4 and openssl).
add_test(NAME queue_acl_source
         COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/queue_acl_source.py)
set_tests_properties(queue_acl_source PROPERTIES LABELS unit)
medley_queue_py(queue_tls_acl queue_tls_acl integration 120)
# redis_roles: a Redis user per role from deploy/redis/users.acl: a 2,000-line batch end to end
# with every role on its own user, and each role's forbidden commands refused (NOPERM); ~5 s.
medley_queue_py(redis_roles redis_roles integration 120)
# redis_forgery: what the ACL cannot stop (docs/operations.md, "Threat model"): a fake
# consumer's XACKs found and rerun (medley_unanswered_acks_total) and forged answers dropped
# by `medley results`, the batch complete with the real answers; ~6 s.
medley_queue_py(redis_forgery redis_forgery integration 120)
# queue_failover: a primary, two replicas, three Sentinels, three workers: SENTINEL FAILOVER
# (and a submit 0.3 s after it) and SIGKILL; workers on the new primary within 2 s of the
# announcement, every submit that exited 0 exactly once (~40 s; MEDLEY_FAILOVER_LINES=5000
# for the issue's full size).
medley_queue_py(queue_failover queue_failover integration 180)
# queue_submit_retry: `medley submit --batch-id` killed at random points then run again: one
# batch, each custom_id once; the same input again is reported, another refused; a user
# refused ROLE is told about +role +wait and --no-replica-check (~10 s).
medley_queue_py(queue_submit_retry queue_submit_retry integration 120)

# tool_choice "auto" (docs/structured.md): SmolLM2 with --chat-template hermes; nudged lines
# come back as valid calls of the template's <tool_call> format, plain ones as text (~20 s)
medley_queue_py(tools_auto_run tools_auto_run e2e 600)
