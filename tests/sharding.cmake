# Sharded replicas (docs/sharding.md): the stage link's wire format and sockets (unit, also
# under ASan+UBSan), the same frames mutated at random and thrown at a live stage server
# (fuzz).
set(SHARDING_TEST_LIBS medley_engine PkgConfig::JANSSON)
medley_test(test_wire SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_wire.c
            LIBS ${SHARDING_TEST_LIBS} LABELS unit)
