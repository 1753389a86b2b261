# Sharded replicas (docs/sharding.md): the stage link's wire format and sockets (unit, also
# under ASan+UBSan), the same frames mutated at random and thrown at a live stage server
# (fuzz).
set(SHARDING_TEST_LIBS medley_engine PkgConfig::JANSSON)
medley_test(test_wire SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_wire.c
            LIBS ${SHARDING_TEST_LIBS} LABELS unit)
# md_link_tcp_open against md_stage_serve in a thread, on synthetic:tiny: bit for bit the
# in-process stage's answers, and every failure reported within the link's timeout (unit:
# no model file needed, so it runs under ASan+UBSan too).
medley_test(test_stage_tcp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_stage_tcp.c
            LIBS ${SHARDING_TEST_LIBS} LABELS unit)
set_tests_properties(test_stage_tcp PROPERTIES TIMEOUT 300)
medley_test(test_wire_fuzz SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/test_wire_fuzz.c
            LIBS ${SHARDING_TEST_LIBS} LABELS fuzz)
set_tests_properties(test_wire_fuzz PROPERTIES TIMEOUT 600)
# `medley stage` processes under `medley generate --stages`: synthetic:tiny always, SmolLM2
# in three stages when fetched; SIGTERM, usage errors, a taken port.
medley_test(test_stage_cli SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_stage_cli.c
            LIBS ${SHARDING_TEST_LIBS} LABELS e2e)
set_tests_properties(test_stage_cli PROPERTIES TIMEOUT 600)
# A stage serves its replica only (docs/sharding.md "Authentication"): real `medley stage`
# processes and a peer written in Python from the documented wire format. A peer without the
# secret refused before any model is opened; a path or a model outside --model refused with
# one answer whatever it names; 50 idle + 50 slowloris connections per stage leave a real
# head's first step under 2 s; a head silent after READY dropped at --io-timeout-ms; a
# head facing a stopped stage gives up at --stage-load-timeout-ms. ~5 s.
if(MEDLEY_PYTHON)
  add_test(NAME stage_guard
           COMMAND ${MEDLEY_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/integration/stage_guard.py)
  set_tests_properties(stage_guard PROPERTIES LABELS integration TIMEOUT 120
                       ENVIRONMENT "MEDLEY_BIN=$<TARGET_FILE:medley>")
endif()
