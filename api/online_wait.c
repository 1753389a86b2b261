/* online_wait.c — see online.h: the waiter. One thread with its own Redis connection reads the
 * reply streams P reply:{R} of every waiting request with one `XREAD COUNT n BLOCK 100
 * STREAMS ...`, from the last event each has seen (so an event written before the request was
 * registered, or while the thread was elsewhere, is still read), and applies the events:
 * start, delta (text at an offset; a second attempt's text must agree with the first's, else
 * the request is marked diverged), done (the output line). A request registered while the
 * read blocks unblocks it (CLIENT UNBLOCK from the registering thread's connection), so a new
 * request waits for no one else's events. Between reads it answers the requests past their
 * deadline (504) and looks at the sockets of the parked ones: a client that hung up is marked
 * gone and its connection resumed, which closes it (online.c then sets P cancel:{R}). */
#define _GNU_SOURCE /* POLLRDHUP */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/online.h"
#include "common/log.h"
#include "common/util.h"

#define BLOCK_MS 100       /* longest XREAD block: the deadline and hang-up checks' period */
#define READ_COUNT 256     /* events per stream per read */
#define TEXT_MAX (8 << 20) /* bytes of one answer's streamed text: past it the stream fails */

struct api_waiter {
    api_server *s;
    pthread_t th;
    int running;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stopping;
    api_online **reg; /* (n) the registered requests */
    int n, cap;
    md_redis *r;
    long long client_id; /* of r, for CLIENT UNBLOCK; 0 when unknown */
    int blocked, unblock_sent;
};

void api_waiter_lock(api_server *s) {
    pthread_mutex_lock(&s->waiter->lock);
}
void api_waiter_unlock(api_server *s) {
    pthread_mutex_unlock(&s->waiter->lock);
}
int api_waiter_stopping(api_server *s) {
    return s->waiter->stopping;
}

static void client_id(api_waiter *w) {
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "CLIENT ID");
    w->client_id = rep && rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
    if (rep)
        freeReplyObject(rep);
    if (!w->client_id)
        MD_WARN("api",
                "CLIENT ID refused: a new online request may wait up to %d ms for "
                "the waiter's read to end",
                BLOCK_MS);
}

int api_waiter_add(api_server *s, api_online *on) {
    api_waiter *w = s->waiter;
    pthread_mutex_lock(&w->lock);
    if (w->stopping) {
        pthread_mutex_unlock(&w->lock);
        return -1;
    }
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 64;
        api_online **reg = realloc(w->reg, (size_t)cap * sizeof *reg);
        if (!reg) {
            pthread_mutex_unlock(&w->lock);
            return -1;
        }
        w->reg = reg;
        w->cap = cap;
    }
    w->reg[w->n++] = on;
    int unblock = w->blocked && !w->unblock_sent && w->client_id > 0;
    if (unblock)
        w->unblock_sent = 1;
    long long id = w->client_id;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (unblock) { /* the waiter's XREAD does not hold this request's stream: end it now */
        md_err e = {0};
        md_redis *r = api_redis(s, &e);
        redisReply *rep = r ? md_redis_cmd(r, &e, "CLIENT UNBLOCK %lld", id) : NULL;
        if (rep)
            freeReplyObject(rep);
        else if (r)
            api_redis_failed();
    }
    return 0;
}

void api_waiter_remove(api_server *s, api_online *on) {
    api_waiter *w = s->waiter;
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->n; i++)
        if (w->reg[i] == on) {
            w->reg[i] = w->reg[--w->n];
            break;
        }
    pthread_mutex_unlock(&w->lock);
}

/* Still waiting for events. */
static int active(const api_online *on) {
    return !on->finished && !on->failed && !on->gone && !on->diverged;
}

static void fail(api_online *on, unsigned status, const char *code, const char *msg) {
    on->failed = 1;
    on->fail_status = status;
    snprintf(on->fail_code, sizeof on->fail_code, "%s", code);
    snprintf(on->fail_msg, sizeof on->fail_msg, "%s", msg);
}

/* A connection to resume (whoever clears parked resumes it). */
typedef struct {
    struct MHD_Connection **c;
    int n, cap;
} resumes;

static void wake(resumes *rs, api_online *on) {
    if (!on->parked)
        return;
    if (rs->n == rs->cap) {
        int cap = rs->cap ? rs->cap * 2 : 64;
        struct MHD_Connection **c = realloc(rs->c, (size_t)cap * sizeof *c);
        if (!c)
            return; /* left parked: the next pass wakes it */
        rs->c = c;
        rs->cap = cap;
    }
    on->parked = 0;
    rs->c[rs->n++] = on->c;
}

static void resume_all(resumes *rs) {
    for (int i = 0; i < rs->n; i++)
        MHD_resume_connection(rs->c[i]);
    rs->n = 0;
}

/* Deadlines, and the sockets of parked requests (under the lock). */
static void sweep(api_waiter *w, resumes *rs) {
    long long now = md_wall_ms();
    struct pollfd pf[64];
    api_online *who[64];
    int k = 0;
    for (int i = 0; i <= w->n; i++) {
        if (k == 64 || (i == w->n && k)) {
            if (poll(pf, (nfds_t)k, 0) > 0)
                for (int j = 0; j < k; j++)
                    if (pf[j].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
                        who[j]->gone = 1;
                        wake(rs, who[j]);
                    }
            k = 0;
        }
        if (i == w->n)
            break;
        api_online *on = w->reg[i];
        if (!active(on))
            continue;
        if (now > on->deadline_ms) {
            char msg[200];
            snprintf(msg, sizeof msg,
                     "no answer within %u s (--online-timeout): the workers serving '%.100s' are "
                     "busy or gone",
                     w->s->cfg->online_timeout_s, on->model);
            fail(on, MHD_HTTP_GATEWAY_TIMEOUT, "timeout", msg);
            wake(rs, on);
        } else if (on->parked && on->fd >= 0) {
            pf[k] = (struct pollfd){.fd = on->fd, .events = POLLRDHUP};
            who[k++] = on;
        }
    }
}

/* A delta event: text[0..n) is the answer's bytes from off. */
static void apply_delta(api_online *on, long long off, const char *text, size_t n) {
    if (off < 0 || (size_t)off > on->text_len)
        return; /* ahead of what came: another attempt's, its done event settles it */
    size_t have = on->text_len - (size_t)off, overlap = have < n ? have : n;
    if (memcmp(on->text + off, text, overlap)) {
        on->diverged = 1; /* a second attempt wrote other text than the first */
        return;
    }
    size_t more = n - overlap;
    if (!more)
        return;
    if (on->text_len + more > TEXT_MAX) {
        fail(on, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error",
             "the answer is too long to stream");
        return;
    }
    if (on->text_len + more + 1 > on->text_cap) {
        size_t cap = (on->text_len + more + 1) * 2;
        char *t = realloc(on->text, cap);
        if (!t) {
            fail(on, MHD_HTTP_INTERNAL_SERVER_ERROR, "server_error", "out of memory");
            return;
        }
        on->text = t;
        on->text_cap = cap;
    }
    memcpy(on->text + on->text_len, text + overlap, more);
    on->text_len += more;
    on->text[on->text_len] = 0;
}

static const char *fv(redisReply *f, const char *name, size_t *len) {
    for (size_t i = 0; f && f->type == REDIS_REPLY_ARRAY && i + 1 < f->elements; i += 2)
        if (f->element[i]->str && !strcmp(f->element[i]->str, name)) {
            *len = f->element[i + 1]->len;
            return f->element[i + 1]->str;
        }
    return NULL;
}

/* The events of one reply stream (an array of [id, fields]) onto its request. */
static void apply(api_online *on, redisReply *entries, resumes *rs) {
    int woke = 0;
    for (size_t i = 0; i < entries->elements; i++) {
        redisReply *en = entries->element[i];
        if (en->type != REDIS_REPLY_ARRAY || en->elements < 2 || !en->element[0]->str)
            continue;
        snprintf(on->last, sizeof on->last, "%s", en->element[0]->str);
        if (!active(on))
            continue;
        size_t tl = 0, n = 0;
        const char *type = fv(en->element[1], "type", &tl);
        if (!type)
            continue;
        if (!strcmp(type, "start")) {
            woke |= !on->started && on->stream;
            on->started = 1;
        } else if (!strcmp(type, "delta")) {
            const char *off = fv(en->element[1], "off", &tl);
            const char *text = fv(en->element[1], "text", &n);
            if (off && text) {
                apply_delta(on, atoll(off), text, n);
                woke |= on->stream;
            }
        } else if (!strcmp(type, "done")) {
            const char *line = fv(en->element[1], "line", &n);
            json_error_t je;
            on->done = line ? json_loadb(line, n, 0, &je) : NULL;
            if (on->done)
                on->finished = 1;
            else
                fail(on, MHD_HTTP_BAD_GATEWAY, "server_error", "the worker's answer is not JSON");
            woke = 1;
        }
    }
    if (woke || !active(on))
        wake(rs, on);
}

/* The connection failed: dial again; a queue that stays away fails every waiting request. */
static void reconnect(api_waiter *w, resumes *rs) {
    md_err e = {0};
    if (md_redis_reconnect(w->r, 2000, NULL, &e) == 0) {
        client_id(w);
        return;
    }
    MD_WARN("api", "online requests: %s", e.msg);
    pthread_mutex_lock(&w->lock);
    for (int i = 0; i < w->n; i++)
        if (active(w->reg[i])) {
            fail(w->reg[i], MHD_HTTP_SERVICE_UNAVAILABLE, "redis_unavailable",
                 "the queue became unavailable while the request waited");
            wake(rs, w->reg[i]);
        }
    pthread_mutex_unlock(&w->lock);
    resume_all(rs);
}

/* One XREAD over the active requests' streams; returns its reply (NULL: connection lost). */
static redisReply *read_events(api_waiter *w, char (*keys)[API_REPLY_KEY_MAX], char (*ids)[48],
                               int k) {
    const char **argv = malloc((size_t)(6 + 2 * k) * sizeof *argv);
    size_t *lens = malloc((size_t)(6 + 2 * k) * sizeof *lens);
    if (!argv || !lens) {
        free(argv);
        free(lens);
        usleep(BLOCK_MS * 1000);
        return NULL; /* out of memory: taken as a lost connection, dialled again */
    }
    char count[16], block[16];
    snprintf(count, sizeof count, "%d", READ_COUNT);
    snprintf(block, sizeof block, "%d", BLOCK_MS);
    int a = 0;
    argv[a++] = "XREAD";
    argv[a++] = "COUNT";
    argv[a++] = count;
    argv[a++] = "BLOCK";
    argv[a++] = block;
    argv[a++] = "STREAMS";
    for (int i = 0; i < k; i++)
        argv[a++] = keys[i];
    for (int i = 0; i < k; i++)
        argv[a++] = ids[i];
    for (int i = 0; i < a; i++)
        lens[i] = strlen(argv[i]);
    md_err e = {0};
    redisReply *rep = md_redis_cmd_argv(w->r, a, argv, lens, &e);
    free(argv);
    free(lens);
    return rep;
}

static void *run(void *arg) {
    api_waiter *w = arg;
    resumes rs = {0};
    char(*keys)[API_REPLY_KEY_MAX] = NULL;
    char(*ids)[48] = NULL;
    int cap = 0;
    pthread_mutex_lock(&w->lock);
    while (!w->stopping) {
        int k = 0;
        for (int i = 0; i < w->n; i++)
            k += active(w->reg[i]);
        if (!k) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += BLOCK_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&w->cond, &w->lock, &ts);
            continue;
        }
        sweep(w, &rs);
        if (k > cap) {
            int nc = k * 2;
            void *nk = realloc(keys, (size_t)nc * sizeof *keys);
            if (nk)
                keys = nk;
            void *ni = nk ? realloc(ids, (size_t)nc * sizeof *ids) : NULL;
            if (ni)
                ids = ni;
            if (!ni) {
                pthread_mutex_unlock(&w->lock);
                resume_all(&rs);
                usleep(BLOCK_MS * 1000);
                pthread_mutex_lock(&w->lock);
                continue;
            }
            cap = nc;
        }
        k = 0;
        for (int i = 0; i < w->n; i++)
            if (active(w->reg[i])) {
                memcpy(keys[k], w->reg[i]->key, sizeof keys[k]);
                memcpy(ids[k++], w->reg[i]->last, sizeof ids[0]);
            }
        w->blocked = 1;
        w->unblock_sent = 0;
        pthread_mutex_unlock(&w->lock);
        resume_all(&rs);
        redisReply *rep = k ? read_events(w, keys, ids, k) : NULL;
        pthread_mutex_lock(&w->lock);
        w->blocked = 0;
        if (k && !rep) {
            pthread_mutex_unlock(&w->lock);
            reconnect(w, &rs);
            pthread_mutex_lock(&w->lock);
            continue;
        }
        if (rep && rep->type == REDIS_REPLY_ARRAY)
            for (size_t i = 0; i < rep->elements; i++) {
                redisReply *st = rep->element[i];
                if (st->type != REDIS_REPLY_ARRAY || st->elements != 2 || !st->element[0]->str ||
                    st->element[1]->type != REDIS_REPLY_ARRAY)
                    continue;
                for (int j = 0; j < w->n; j++)
                    if (!strcmp(w->reg[j]->key, st->element[0]->str)) {
                        apply(w->reg[j], st->element[1], &rs);
                        break;
                    }
            }
        else if (rep && rep->type == REDIS_REPLY_ERROR)
            MD_WARN("api", "online requests: XREAD: %s", rep->str);
        if (rep)
            freeReplyObject(rep);
        pthread_mutex_unlock(&w->lock);
        resume_all(&rs);
        pthread_mutex_lock(&w->lock);
    }
    /* stopping: nothing is waited for any more */
    for (int i = 0; i < w->n; i++)
        if (active(w->reg[i]) || w->reg[i]->parked) {
            if (active(w->reg[i]))
                fail(w->reg[i], MHD_HTTP_SERVICE_UNAVAILABLE, "shutting_down",
                     "the API process is stopping");
            wake(&rs, w->reg[i]);
        }
    pthread_mutex_unlock(&w->lock);
    resume_all(&rs);
    free(rs.c);
    free(keys);
    free(ids);
    return NULL;
}

int api_waiter_start(api_server *s, md_err *e) {
    api_waiter *w = calloc(1, sizeof *w);
    if (!w)
        return md_errf(e, MD_ENOMEM, "out of memory");
    w->s = s;
    md_redis_url u = s->url;
    if (u.command_timeout_ms > 0 && u.command_timeout_ms < BLOCK_MS + 5000)
        u.command_timeout_ms = BLOCK_MS + 5000; /* a blocked XREAD must not time out */
    int rc = md_redis_open(&u, &w->r, e);
    if (rc) {
        free(w);
        return rc;
    }
    client_id(w);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    s->waiter = w;
    if (pthread_create(&w->th, NULL, run, w)) {
        s->waiter = NULL;
        md_redis_close(w->r);
        free(w);
        return md_errf(e, MD_EIO, "cannot start the online requests' thread");
    }
    w->running = 1;
    return 0;
}

void api_waiter_stop(api_server *s) {
    api_waiter *w = s->waiter;
    if (!w || !w->running)
        return;
    pthread_mutex_lock(&w->lock);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->th, NULL); /* its read ends within BLOCK_MS */
    w->running = 0;
}

void api_waiter_free(api_server *s) {
    api_waiter *w = s->waiter;
    if (!w)
        return;
    api_waiter_stop(s);
    md_redis_close(w->r);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w->reg);
    free(w);
    s->waiter = NULL;
}
