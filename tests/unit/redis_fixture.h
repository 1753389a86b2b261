/* redis_fixture.h — a real redis-server for unit tests that need one (the worker's answer
 * writing and queue gauges): started on a free port of 127.0.0.1 with no persistence, in a
 * temporary directory, and stopped by the test. $MEDLEY_REDIS_SERVER names the binary, else
 * redis-server on PATH; a machine without it fails the test instead of skipping it, as the
 * queue's integration tests do (tests/queue.cmake). */
#ifndef MEDLEY_TESTS_REDIS_FIXTURE_H
#define MEDLEY_TESTS_REDIS_FIXTURE_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/redis.h"

typedef struct {
    pid_t pid;
    int port;
    md_redis *r; /* a connection to it */
} redis_fixture;

/* A port of 127.0.0.1 nobody listens on now (the kernel's pick). */
static inline int rfx_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
        getsockname(fd, (struct sockaddr *)&a, &n)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* 0 when the server answers PING within 5 s; else -1 with why printed. */
static inline int rfx_start(redis_fixture *f) {
    memset(f, 0, sizeof *f);
    const char *bin = getenv("MEDLEY_REDIS_SERVER");
    if (!bin || !*bin)
        bin = "redis-server";
    f->port = rfx_free_port();
    if (f->port < 0)
        return -1;
    char port[16];
    snprintf(port, sizeof port, "%d", f->port);
    f->pid = fork();
    if (f->pid < 0)
        return -1;
    if (f->pid == 0) {
        execlp(bin, bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", "/tmp", "--loglevel", "warning", (char *)NULL);
        fprintf(stderr, "redis-server not found (%s): apt-get install redis-server\n", bin);
        _exit(127);
    }
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", f->port);
    md_redis_url u;
    md_err e = {0};
    if (md_redis_url_parse(url, &u, &e))
        return -1;
    for (int i = 0; i < 500; i++) {
        int st;
        if (waitpid(f->pid, &st, WNOHANG) == f->pid) {
            f->pid = 0;
            fprintf(stderr, "redis-server exited at start\n");
            return -1;
        }
        if (md_redis_open(&u, &f->r, &e) == 0)
            return 0;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "redis-server on port %d does not answer: %s\n", f->port, e.msg);
    return -1;
}

static inline void rfx_stop(redis_fixture *f) {
    md_redis_close(f->r);
    f->r = NULL;
    if (f->pid > 0) {
        kill(f->pid, SIGTERM);
        waitpid(f->pid, NULL, 0);
    }
    f->pid = 0;
}

/* A command that must succeed; its reply (free it) or a failed test. */
static inline redisReply *rfx_cmd(redis_fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(md_redis_ctx(f->r), fmt, ap);
    va_end(ap);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "redis %s: %s\n", fmt, r ? r->str : "no reply");
        abort();
    }
    return r;
}

static inline long long rfx_int(redis_fixture *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(md_redis_ctx(f->r), fmt, ap);
    va_end(ap);
    long long v = r && r->type == REDIS_REPLY_INTEGER  ? r->integer
                  : r && r->type == REDIS_REPLY_STRING ? atoll(r->str)
                                                       : -1;
    freeReplyObject(r);
    return v;
}

#endif
