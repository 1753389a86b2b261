medley_test(test_common_err SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_common.c LABELS unit)
