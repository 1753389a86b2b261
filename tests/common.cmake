medley_test(test_common_err SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_common.c LABELS unit)
medley_test(test_dtype SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_dtype.c LABELS unit)
medley_test(test_metrics SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_metrics.c LABELS unit)
