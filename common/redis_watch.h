/* redis_watch.h — following Sentinel's +switch-master as it happens (redis_watch.c), for
 * redis.c's sentinel:// connections; not part of the public contract (that is redis.h). */
#ifndef MEDLEY_COMMON_REDIS_WATCH_H
#define MEDLEY_COMMON_REDIS_WATCH_H
#include <stddef.h>
#include "common/err.h"
#include "common/redis.h"

typedef struct md_sentinel_watch md_sentinel_watch;

/* Start one thread per Sentinel of u, each subscribed to +switch-master (reconnecting every
 * 0.5 s while its Sentinel is away). *out owns them; md_sentinel_watch_stop joins and frees. */
int md_sentinel_watch_start(const md_redis_url *u, md_sentinel_watch **out, md_err *e);
/* How many switches of u->master were announced; addr gets the newest primary "host:port"
 * ("" before any). Thread-safe. */
unsigned md_sentinel_watch_seq(md_sentinel_watch *w, char *addr, size_t addrsz);
void md_sentinel_watch_stop(md_sentinel_watch *w);
#endif
