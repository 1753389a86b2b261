/* redis_dial.h — reaching a Redis node (redis_dial.c), for redis.c's connections; not part
 * of the public contract (that is redis.h). URLs are parsed in redis_url.c. */
#ifndef MEDLEY_COMMON_REDIS_DIAL_H
#define MEDLEY_COMMON_REDIS_DIAL_H

#include <hiredis/hiredis.h>
#include <stddef.h>

#include "common/err.h"
#include "common/redis.h"

/* Connect to host:port (or u->unix_path when host is NULL) with u's timeouts, then AUTH and
 * SELECT with u's credentials. *out is a ready context, or NULL with e set. */
int md_redis_dial_node(const md_redis_url *u, const char *host, int port, redisContext **out,
                       md_err *e);

/* Ask u's Sentinels in turn for the master, dial it and check with ROLE that it is a primary.
 * hint ("host:port" of a primary the Sentinels announced, or NULL) is tried first. *out is a
 * ready context and peer "host:port", or *out NULL with e naming every failure. */
int md_sentinel_dial(const md_redis_url *u, const char *hint, redisContext **out, char *peer,
                     size_t peersz, md_err *e);

/* Wait (up to max_wait_ms) until no Sentinel of u reports a failover of u->master under way,
 * then addr gets the primary they name ("host:port"). MD_EREDIS when none answers or the
 * failover outlasts the wait. */
int md_sentinel_settled(const md_redis_url *u, int max_wait_ms, char *addr, size_t addrsz,
                        md_err *e);
#endif
