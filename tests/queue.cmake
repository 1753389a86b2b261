# The queue (worker/, common/redis.c, cli/cmd_worker.c, cmd_client.c, cmd_run.c): unit tests of
# validation and URLs; integration tests that start their own redis-server and drive the real
# `medley` binary (and a redis-py client written from docs/protocol.md).
medley_test(test_validate SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_validate.c
            LIBS medley_worker LABELS unit)
medley_test(test_queue_redis_url SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_queue_redis_url.c
            LIBS medley_worker LABELS unit)
