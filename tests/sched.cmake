# scheduler/: performance model, candidates, placement MILP, plans, simulator, daemon.
medley_test(test_sched_perf SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_perf.c
            LIBS medley_sched LABELS unit)
medley_test(test_sched_milp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_sched_milp.c
            LIBS medley_sched LABELS unit)
