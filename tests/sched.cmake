# scheduler/: performance model, candidates, placement MILP, plans, simulator, daemon.
medley_test(test_sched_perf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_perf.c
            LIBS medley_sched LABELS unit)
medley_test(test_sched_milp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_milp.c
            LIBS medley_sched LABELS unit)
medley_test(test_sched_calibration SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_calibration.c
            LIBS medley_sched LABELS unit)
medley_test(test_sched_pp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_pp.c
            LIBS medley_sched LABELS unit)
medley_test(test_sched_fleet_agg SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_fleet_agg.c
            LIBS medley_sched LABELS unit)
medley_test(test_sched_names SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_names.c
            LIBS medley_sched LABELS unit)
# Issue 39 item 10: a common fraction of every demand at 1,000 GPUs x 20 models, 25x-50x over.
medley_test(test_sched_fair SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_fair.c
            LIBS medley_sched LABELS unit)
# Issue 39 item 14: the hand-written plan of docs/sharding.md, as workers read it.
medley_test(test_sched_plan_example
            SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_plan_example.c
            LIBS medley_worker LABELS unit)
medley_test(test_sched_sim SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_sim.c
            LIBS medley_sched LABELS unit)
if(MEDLEY_REDIS_SERVER)
  medley_test(test_sched_daemon SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_sched_daemon.c
              LIBS medley_sched Threads::Threads LABELS integration)
endif()
if(MEDLEY_PYTHON)
  add_test(NAME test_sched_schemas
           COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_sched_schemas.py)
  set_tests_properties(test_sched_schemas PROPERTIES LABELS unit
                       ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
  # `medley plan` on hostile inputs: unknown keys in every object, figures of 1e308 / 1e100
  # (issue 26 item 5): exit 1 naming the field, never a GLPK abort.
  # `medley plan --profile`: aliases and driver names match, TP-2 calibrated or measured,
  # unknown devices refused, unused profiles noted (issue 26 item 1).
  add_test(NAME sched_profiles
           COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/sched_profiles.py)
  set_tests_properties(sched_profiles PROPERTIES LABELS unit TIMEOUT 300
                       ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
  add_test(NAME sched_bad_input
           COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/sched_bad_input.py)
  set_tests_properties(sched_bad_input PROPERTIES LABELS unit TIMEOUT 300
                       ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
endif()
# Benchmark (not a test): build-dir/tests/bench_sched [bench/scheduler/scenarios.json]
add_executable(bench_sched ${CMAKE_SOURCE_DIR}/bench/scheduler/bench_sched.c)
target_link_libraries(bench_sched PRIVATE medley_sched medley_common m)
target_compile_definitions(bench_sched PRIVATE MEDLEY_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# the fleets and workloads it shares with the scheduler tests
target_include_directories(bench_sched PRIVATE ${CMAKE_SOURCE_DIR}/tests)
# Issue 39 item 11: a --follow-plan worker reads the plan's steal classes when its own are
# empty (real redis-server, the real binary, the echo runner).
if(COMMAND medley_queue_py)
  medley_queue_py(plan_steal plan_steal integration 120)
endif()
