/* redis.h — Redis connections for every medley process: URL parsing, ACL AUTH, SELECT,
 * connect and command timeouts, reconnection with exponential backoff, and finding the
 * primary through Redis Sentinel.
 *
 * URLs: redis://[user:pass@]host[:port][/db], redis://:pass@host (password only, the
 * `default` user), unix:///path/to/redis.sock[?db=N&user=U&password=P], and
 * sentinel://[user:pass@]host[:port][,host[:port]...]/master[/db]
 *   [?sentinel_user=U&sentinel_password=P] (sentinel ports default to 26379; user:pass is
 * for the Redis nodes, sentinel_* for the Sentinels themselves). User and password may be
 * percent-encoded. The default URL is $MEDLEY_REDIS, else redis://127.0.0.1:6379/0.
 *
 * With a sentinel:// URL every dial (the first and each reconnect) asks the Sentinels in
 * the order given for the master's address (SENTINEL get-master-addr-by-name), connects
 * there and checks with ROLE that the node really is a primary, so a failover is followed
 * by the reconnect that the lost connection already triggers. Each sentinel:// connection
 * also follows the Sentinels' +switch-master announcements (redis_watch.c): the next call
 * after one that names another primary fails as a lost connection, and the reconnect tries
 * the announced primary first, so nothing is written to a demoted node that has not noticed. A demoted primary does not
 * always close its clients: it answers writes with -READONLY and blocked reads with
 * -UNBLOCKED. Those error replies, and -MASTERDOWN, -LOADING and -NOREPLICAS, are reported
 * like a lost connection (NULL + MD_EREDIS) by every md_redis_cmd*() / md_redis_get_reply(),
 * and the connection is marked dead, so callers run their usual reconnect path.
 *
 * A md_redis wraps one hiredis context. Commands go through md_redis_cmd()/_argv() (one
 * round trip) or through md_redis_ctx() with redisAppendCommand*()+md_redis_get_reply() for
 * pipelines. When a reply is NULL the connection is gone: md_redis_reconnect() dials again
 * with backoff (50 ms doubling to 2 s) until it succeeds, the wait budget runs out or *stop
 * becomes non-zero. Callers own replies (freeReplyObject) and the md_redis (md_redis_close).
 * Not thread-safe: one thread per md_redis. */
#ifndef MEDLEY_COMMON_REDIS_H
#define MEDLEY_COMMON_REDIS_H

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stddef.h>

#include "common/err.h"

#define MD_REDIS_MAX_SENTINELS 8

typedef struct {
    char host[256];
    int port;
} md_redis_addr;

typedef struct {
    char host[256];      /* empty for a unix socket or a sentinel:// URL */
    int port;            /* 6379 unless given */
    char unix_path[512]; /* empty for TCP */
    char user[128];      /* empty: AUTH with the password only (the `default` user) */
    char pass[256];      /* empty: no AUTH */
    int db;              /* SELECT db when non-zero */
    int connect_timeout_ms;
    int command_timeout_ms; /* socket read/write timeout; 0 = none */
    /* sentinel:// only: where to ask, and for which master (empty master: not sentinel) */
    char master[128];
    int n_sentinels;
    md_redis_addr sentinels[MD_REDIS_MAX_SENTINELS];
    char sentinel_user[128];
    char sentinel_pass[256];
} md_redis_url;

/* Parse url into *out (timeouts set to 2000 / 10000 ms). MD_EINVAL names what is wrong. */
int md_redis_url_parse(const char *url, md_redis_url *out, md_err *e);
/* $MEDLEY_REDIS when set and non-empty, else "redis://127.0.0.1:6379/0". */
const char *md_redis_default_url(void);
/* The URL without its passwords, for logs ("redis://user:***@host:6379/0"). */
void md_redis_url_describe(const md_redis_url *u, char *out, size_t outsz);

typedef struct md_redis md_redis;

/* Connect, AUTH, SELECT. On failure *out is NULL and e says which step failed. */
int md_redis_open(const md_redis_url *u, md_redis **out, md_err *e);
void md_redis_close(md_redis *r);
/* The live hiredis context (never NULL after a successful open; replaced by reconnect). */
redisContext *md_redis_ctx(md_redis *r);
/* Drop the current connection and dial again with backoff. max_wait_ms < 0 waits forever
 * (until *stop). Returns 0 when connected, MD_ECANCEL when stopped, MD_EREDIS on timeout. */
int md_redis_reconnect(md_redis *r, int max_wait_ms, volatile sig_atomic_t *stop, md_err *e);
/* Where the live connection goes ("127.0.0.1:6380"; for sentinel:// the primary found). */
const char *md_redis_peer(const md_redis *r);
/* Number of successful (re)connections so far; callers redo per-connection setup (SCRIPT
 * LOAD, consumer groups) when it changes. */
unsigned md_redis_generation(const md_redis *r);

/* One command, printf-style as redisCommand. Returns the reply (caller frees), or NULL
 * with MD_EREDIS in e when the connection failed (reconnect, then retry). An error reply
 * is returned as a reply of type REDIS_REPLY_ERROR; callers check. */
redisReply *md_redis_cmd(md_redis *r, md_err *e, const char *fmt, ...);
redisReply *md_redis_cmd_argv(md_redis *r, int argc, const char **argv, const size_t *lens,
                              md_err *e);
/* Whether this connection's user may use keys under prefix ("medley:"): one EXISTS of
 * <prefix>plan. A NOPERM refusal becomes an MD_EINVAL error that names the user and the key and
 * channel patterns its ACL lacks (~<prefix>* &<prefix>*), so a worker or client started with
 * a --prefix its ACL user was not made for stops at once with that sentence. MD_EREDIS when
 * the connection failed. */
int md_redis_check_prefix(md_redis *r, const char *prefix, md_err *e);
/* ROLE on the live connection: MD_EREDIS (and the connection dropped, for the usual
 * reconnect) when the node is no longer a primary. A refused ROLE (an ACL without it) is 0:
 * the next write's -READONLY says the same, later. */
int md_redis_check_primary(md_redis *r, md_err *e);
/* For a sentinel:// connection, after writes that must not be lost: wait until no Sentinel
 * reports a failover under way (up to max_wait_ms), then 0 when they name this connection's
 * node as the primary, MD_ENOTFOUND (e names both) when another, MD_EREDIS when they could
 * not say. Always 0 for other URLs. */
int md_redis_confirm_primary(md_redis *r, int max_wait_ms, md_err *e);
/* Collect one pipelined reply (after redisAppendCommand*). NULL + MD_EREDIS when the
 * connection failed. */
redisReply *md_redis_get_reply(md_redis *r, md_err *e);

/* After writes that must survive a failover: when the primary has connected replicas, WAIT
 * until all of them acknowledge this connection's writes or timeout_ms passes. *replicas is
 * the number connected, *acked how many acknowledged (both 0 on a primary without
 * replicas). Returns 0 (the caller judges *acked), or MD_EREDIS when Redis failed. */
int md_redis_wait_replicas(md_redis *r, int timeout_ms, int *replicas, int *acked, md_err *e);

#endif
