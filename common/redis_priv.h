/* redis_priv.h — what redis.c and redis_sentinel.c share; not part of the public contract
 * (that is redis.h). */
#ifndef MEDLEY_COMMON_REDIS_PRIV_H
#define MEDLEY_COMMON_REDIS_PRIV_H

#include <hiredis/hiredis.h>
#include <stddef.h>

#include "common/err.h"
#include "common/redis.h"

/* Percent-decode src[0..n) into out; MD_EINVAL (naming `what`) on a bad escape or overflow. */
int md_redis_pct_decode(const char *src, size_t n, char *out, size_t outsz, const char *what,
                        md_err *e);
/* A database number from s[0..n) (empty: leaves *db); MD_EINVAL unless a number >= 0. */
int md_redis_parse_db(const char *s, size_t n, int *db, md_err *e);
/* host[:port] or [ipv6][:port] from s[0..n) into host/port; an empty host is 127.0.0.1 and a
 * missing port is defport. MD_EINVAL says what is wrong. */
int md_redis_parse_hostport(const char *s, size_t n, int defport, md_redis_addr *out, md_err *e);
/* Connect to host:port (or u->unix_path when host is NULL) with u's timeouts, then AUTH and
 * SELECT with u's credentials. *out is a ready context, or NULL with e set. */
int md_redis_dial_node(const md_redis_url *u, const char *host, int port, redisContext **out,
                       md_err *e);

/* The part of a sentinel:// URL after the scheme, into u (master, sentinels, credentials). */
int md_sentinel_parse(const char *rest, md_redis_url *u, md_err *e);
/* Ask u's Sentinels in turn for the master, dial it and check with ROLE that it is a primary.
 * *out is a ready context and peer "host:port", or *out NULL with e naming every failure. */
int md_sentinel_dial(const md_redis_url *u, redisContext **out, char *peer, size_t peersz,
                     md_err *e);

#endif
