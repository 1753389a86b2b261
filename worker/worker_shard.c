/* worker_shard.c — sharded replicas on the worker's side (docs/protocol.md §6, "Sharded
 * replicas").
 *
 * A head: a model whose engine runs as pipeline stages, some in other processes — from
 * --stages with a tcp:// stage, or from a plan pipeline replica whose stage 0 names this
 * worker. It reads requests only while its replica is formed (its runner open). It forms when
 * every stage's endpoint is known (a plan's: the stage keys P replica:{R}:stage:<i>) and the
 * engine opens; a failed try waits 0.5 s, doubling to 10 s, before the next. A failed step,
 * or a stage key that vanished or changed, hands back every request the model held (marked
 * idle, as on a device failure: redelivered, counted as one delivery like a crash) and
 * un-forms it; the worker stays up and forms it again.
 *
 * A stage role: a later stage of a plan pipeline that names this worker. It is served by a
 * child `medley stage --listen HOST:PORT` process (killed with the worker: PR_SET_PDEATHSIG),
 * advertised under its stage key once it accepts connections, and the key refreshed with the
 * heartbeat (TTL: 10 s or 3 heartbeat periods, the longer); a child that dies is started
 * again with the same backoff. The stage server is told the layers by the head; it serves
 * the role's model only (--model) and heads that hold the stage secret, which it reads, as
 * the head's links do, from $MEDLEY_STAGE_SECRET_FILE (--stage-secret-file sets it).
 *
 * It owns each model's sh, and wk's srv and last_stage_check. */
#define _GNU_SOURCE
#include "worker/worker_int.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/shard/stage_auth.h"

#define BACKOFF_MIN_MS 500
#define BACKOFF_MAX_MS 10000
#define SRV_LISTEN_MS 30000 /* a stage server not accepting connections by then is restarted */
#define SRV_STOP_MS 3000    /* SIGTERM, then SIGKILL */

static const uint64_t MS = 1000000ull;

int wk_spec_remote(const char *spec) {
    return spec && strstr(spec, "tcp://") != NULL;
}

static int next_backoff(int ms) {
    return ms <= 0 ? BACKOFF_MIN_MS : ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : ms * 2;
}

static const char *my_device(const wk *w) {
    return w->cfg->runner.device && *w->cfg->runner.device ? w->cfg->runner.device : "cpu";
}

/* How the replica is named in logs and heartbeats: "replica R" (a plan's), or "replica"
 * (--stages). */
static const char *replica_name(const model *md, char *out, size_t cap) {
    if (md->sh.pipe.n_stages)
        snprintf(out, cap, "replica %s", md->sh.pipe.replica);
    else
        snprintf(out, cap, "replica");
    return out;
}

/* ---- heads ---- */

/* Hand back every request model m holds, close its runner, and say why it is not formed. */
static void unform(wk *w, int m, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void unform(wk *w, int m, const char *fmt, ...) {
    model *md = &w->mod[m];
    int held = 0;
    for (int i = 0; i < md->n_jobs; i++)
        if (md->jobs[i].used) {
            md->jobs[i].handback = 1;
            held++;
        }
    wk_hand_back(w);
    if (md->runner) {
        wk_runner_close(md->runner);
        md->runner = NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(md->sh.why, sizeof md->sh.why, fmt, ap);
    va_end(ap);
    MD_WARN("worker", "%s: %s (%d request(s) handed back)", md->name, md->sh.why, held);
    w->last_hb = 0; /* say so in the heartbeat at once */
}

void wk_shard_start(wk *w, int m, const wk_pipe *pipe, const char *spec) {
    model *md = &w->mod[m];
    if (md->runner)
        unform(w, m, "re-forming as %s", pipe ? pipe->replica : "--stages");
    memset(&md->sh, 0, sizeof md->sh);
    md->sh.on = 1;
    if (pipe) {
        md->sh.pipe = *pipe;
        snprintf(md->sh.why, sizeof md->sh.why,
                 "replica %s not formed: waiting for the keys of its stages", pipe->replica);
    } else {
        snprintf(md->sh.spec, sizeof md->sh.spec, "%s", spec);
        snprintf(md->sh.why, sizeof md->sh.why, "replica not formed yet");
    }
    w->last_stage_check = 0; /* look at the keys at once */
}

int wk_shard_stop(wk *w, int m, md_err *e) {
    model *md = &w->mod[m];
    if (md->runner)
        unform(w, m, "running whole again");
    memset(&md->sh, 0, sizeof md->sh);
    return wk_open_runner(w, m, &w->cfg->runner, e);
}

int wk_shard_same(const wk *w, int m, const wk_pipe *pipe) {
    const wk_pipe *p = &w->mod[m].sh.pipe;
    if (!w->mod[m].sh.on || p->n_stages != pipe->n_stages || strcmp(p->replica, pipe->replica))
        return 0;
    for (int i = 0; i < p->n_stages; i++)
        if (p->lo[i] != pipe->lo[i] || p->hi[i] != pipe->hi[i])
            return 0;
    return 1;
}

void wk_shard_failed(wk *w, int m, const md_err *e) {
    shard *sh = &w->mod[m].sh;
    char who[WK_REPLICA_ID + 16];
    sh->backoff_ms = BACKOFF_MIN_MS;
    sh->next_try_ns = md_mono_ns() + (uint64_t)sh->backoff_ms * MS;
    unform(w, m, "%s not formed: a step failed: %s", replica_name(&w->mod[m], who, sizeof who),
           e->msg);
}

/* The stages of a plan pipeline: this worker's device for stage 0, the endpoints for the
 * others. 0, or -1 when it does not fit. */
static int build_spec(const wk *w, const shard *sh, char *out, size_t cap) {
    const wk_pipe *p = &sh->pipe;
    size_t used = (size_t)snprintf(out, cap, "%s:%d-%d", my_device(w), p->lo[0], p->hi[0] - 1);
    for (int i = 1; i < p->n_stages && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, ",%s:%d-%d", sh->endpoint[i], p->lo[i],
                                 p->hi[i] - 1);
    return used < cap ? 0 : -1;
}

/* A stage key's value as a stage of a --stages list: tcp://HOST:PORT/DEVICE, no commas. */
static int endpoint_ok(const char *v) {
    return !strncmp(v, "tcp://", 6) && strlen(v) < WK_ENDPOINT_MAX && !strchr(v, ',') &&
           strchr(v + 6, '/');
}

/* A plan head's look at its stage keys. Formed: a key that vanished or changed un-forms it.
 * Not formed: says which are missing, and a change of endpoints allows a try at once.
 * Returns 1 when every key holds an endpoint. */
static int check_keys(wk *w, int m, uint64_t now) {
    model *md = &w->mod[m];
    shard *sh = &md->sh;
    const wk_pipe *p = &sh->pipe;
    char keys[WK_PIPE_MAX][Q_KEY_MAX];
    const char *argv[WK_PIPE_MAX + 1];
    size_t lens[WK_PIPE_MAX + 1];
    argv[0] = "MGET";
    lens[0] = 4;
    for (int i = 1; i < p->n_stages; i++) {
        q_key_stage(keys[i], w->prefix, p->replica, i);
        argv[i] = keys[i];
        lens[i] = strlen(keys[i]);
    }
    md_err e = {0};
    redisReply *rep = md_redis_cmd_argv(w->r, p->n_stages, argv, lens, &e);
    if (!rep) {
        w->broken = 1;
        return 0;
    }
    if (rep->type != REDIS_REPLY_ARRAY || (int)rep->elements != p->n_stages - 1) {
        MD_WARN("worker", "MGET of %s's stage keys: unexpected reply", p->replica);
        freeReplyObject(rep);
        return 0;
    }
    char missing[256] = "";
    size_t mlen = 0;
    int changed = 0, first_bad = 0, first_missing = 0;
    for (int i = 1; i < p->n_stages; i++) {
        redisReply *v = rep->element[i - 1];
        const char *s = v->type == REDIS_REPLY_STRING ? v->str : NULL;
        if (!s || !endpoint_ok(s)) {
            if (s && !first_bad) {
                first_bad = i;
                MD_WARN("worker", "%s holds \"%.200s\": not tcp://HOST:PORT/DEVICE", keys[i], s);
            }
            if (!first_missing)
                first_missing = i;
            mlen += (size_t)snprintf(missing + mlen, sizeof missing - mlen, "%s%d",
                                     mlen ? ", " : "", i + 1);
            if (mlen >= sizeof missing)
                mlen = sizeof missing - 1;
            if (sh->endpoint[i][0])
                changed = 1;
            sh->endpoint[i][0] = 0;
            continue;
        }
        if (strcmp(sh->endpoint[i], s)) {
            changed = 1;
            snprintf(sh->endpoint[i], WK_ENDPOINT_MAX, "%s", s);
        }
    }
    freeReplyObject(rep);
    if (md->runner && (changed || missing[0])) {
        sh->backoff_ms = 0;
        sh->next_try_ns = now;
        if (missing[0])
            unform(w, m, "replica %s not formed: the endpoint of stage %s vanished (%s)",
                   p->replica, missing, keys[first_missing]);
        else
            unform(w, m, "replica %s not formed: a stage moved to another endpoint", p->replica);
        return 0;
    }
    if (md->runner)
        return 1;
    if (missing[0]) {
        char rid[WK_REPLICA_ID];
        snprintf(rid, sizeof rid, "%s", p->replica);
        snprintf(sh->why, sizeof sh->why, "replica %s not formed: waiting for stage %s (no %s)",
                 rid, missing, keys[first_missing]);
        return 0;
    }
    if (changed) { /* new endpoints: try them now, whatever the backoff said about the old */
        sh->backoff_ms = 0;
        sh->next_try_ns = now;
    }
    return 1;
}

/* Open model m's engine over its stages. On failure: why, and the next try after the backoff. */
static void try_form(wk *w, int m, uint64_t now) {
    model *md = &w->mod[m];
    shard *sh = &md->sh;
    char spec[WK_SPEC_MAX], who[WK_REPLICA_ID + 16];
    replica_name(md, who, sizeof who);
    if (sh->pipe.n_stages) {
        if (build_spec(w, sh, spec, sizeof spec)) {
            snprintf(sh->why, sizeof sh->why, "%s not formed: its stages are too long", who);
            return;
        }
        snprintf(sh->spec, sizeof sh->spec, "%s", spec);
    } else {
        snprintf(spec, sizeof spec, "%s", sh->spec);
    }
    wk_runner_opts o = w->cfg->runner;
    o.stages = spec;
    MD_INFO("worker", "%s: forming %s over %s", md->name, who, spec);
    md_err e = {0};
    if (wk_open_runner(w, m, &o, &e)) {
        if (w->device_failed)
            return; /* the watchdog gave up on the load: the worker stops */
        sh->backoff_ms = next_backoff(sh->backoff_ms);
        sh->next_try_ns = now + (uint64_t)sh->backoff_ms * MS;
        snprintf(sh->why, sizeof sh->why, "%s not formed: %s", who, e.msg);
        MD_WARN("worker", "%s: %s; next try in %.1f s", md->name, sh->why, sh->backoff_ms / 1e3);
        return;
    }
    sh->backoff_ms = 0;
    sh->why[0] = 0;
    MD_INFO("worker", "%s: %s formed; serving (%d slots)", md->name, who,
            wk_runner_capacity(md->runner));
    w->last_hb = 0;
    wk_take_own(w, 1); /* what it handed back is still pending for this worker: resume it */
}

/* ---- stage roles ---- */

/* "HOST:PORT" (HOST may be [v6]) into host and port. 0 or -1. */
static int split_listen(const char *s, char *host, size_t cap, int *port) {
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return -1;
    size_t n = (size_t)(colon - s);
    if (s[0] == '[' && s[n - 1] == ']') {
        s++;
        n -= 2;
    }
    if (n == 0 || n >= cap)
        return -1;
    memcpy(host, s, n);
    host[n] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535)
        return -1;
    *port = (int)p;
    return 0;
}

/* A TCP connection to host:port: -1 when none could be made (within timeout_ms), else the
 * socket. port 0 with bind_only: a socket bound to a free port of host, listening nowhere. */
static int tcp_socket(const char *host, int port, int bind_only, int timeout_ms) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, ps, &hints, &ai) || !ai)
        return -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0;
    if (ok && bind_only) {
        ok = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    } else if (ok) {
        fcntl(fd, F_SETFL, O_NONBLOCK);
        ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            ok = poll(&pf, 1, timeout_ms) == 1 &&
                 getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0;
        }
    }
    freeaddrinfo(ai);
    if (!ok && fd >= 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static int wildcard(const char *host) {
    return !strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !strcmp(host, "*") || !*host;
}

/* Start v's child `medley stage`. 0, or an error naming what failed. */
static int srv_spawn(wk *w, stage_srv *v, md_err *e) {
    const char *secret = getenv(MD_STAGE_SECRET_ENV);
    if (!secret || !*secret)
        return md_errf(e, MD_EINVAL,
                       "a stage server needs the stage secret: start the worker with "
                       "--stage-secret-file FILE, the same file as the replica's head "
                       "(docs/sharding.md \"Authentication\")");
    const char *listen =
        w->cfg->stage_listen && *w->cfg->stage_listen ? w->cfg->stage_listen : "127.0.0.1:0";
    char host[256];
    int port;
    if (split_listen(listen, host, sizeof host, &port))
        return md_errf(e, MD_EINVAL, "--stage-listen %s: expected HOST:PORT", listen);
    if (port == 0) { /* a free port: the kernel's pick for a socket bound and let go */
        int fd =
            tcp_socket(wildcard(host) ? (strchr(host, ':') ? "::" : "0.0.0.0") : host, 0, 1, 0);
        struct sockaddr_storage a;
        socklen_t al = sizeof a;
        if (fd < 0 || getsockname(fd, (struct sockaddr *)&a, &al)) {
            if (fd >= 0)
                close(fd);
            return md_errf(e, MD_EIO, "--stage-listen %s: no free port on %s", listen, host);
        }
        port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                             : ((struct sockaddr_in *)&a)->sin_port);
        close(fd);
    } else { /* several stages on one worker: consecutive ports */
        port += (int)(v - w->srv);
    }
    int v6 = strchr(host, ':') != NULL;
    char listen_arg[300], threads[16], cap[32];
    snprintf(listen_arg, sizeof listen_arg, v6 ? "[%s]:%d" : "%s:%d", host, port);
    const char *dev = my_device(w);
    const char *exe =
        w->cfg->stage_exe && *w->cfg->stage_exe ? w->cfg->stage_exe : "/proc/self/exe";
    const char *argv[16];
    int k = 0;
    argv[k++] = "medley";
    argv[k++] = "stage";
    argv[k++] = "--listen";
    argv[k++] = listen_arg;
    argv[k++] = "--device";
    argv[k++] = dev;
    argv[k++] = "--model";
    argv[k++] = v->role.model;
    if (w->cfg->runner.n_threads > 0) {
        snprintf(threads, sizeof threads, "%d", w->cfg->runner.n_threads);
        argv[k++] = "--threads";
        argv[k++] = threads;
    }
    if (w->cfg->runner.mem_cap > 0) {
        snprintf(cap, sizeof cap, "%zu", w->cfg->runner.mem_cap);
        argv[k++] = "--mem-cap";
        argv[k++] = cap;
    }
    if (md_log_json())
        argv[k++] = "--log-json";
    argv[k] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return md_errf(e, MD_EIO, "cannot start a stage server (fork: %s)", strerror(errno));
    if (pid == 0) {
        /* dies with the worker, even by SIGKILL: a stage must not outlive its advertiser */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        for (int fd = 3; fd < 1024; fd++) /* the worker's Redis and stage connections */
            close(fd);
        execv(exe, (char *const *)argv);
        fprintf(stderr, "medley worker: cannot run %s stage: %s\n", exe, strerror(errno));
        _exit(127);
    }
    v->pid = (int)pid;
    v->port = port;
    v->ready = 0;
    v->started_ns = v->probed_ns = md_mono_ns();
    const char *adv = wildcard(host) ? w->host : host;
    snprintf(v->endpoint, sizeof v->endpoint,
             strchr(adv, ':') ? "tcp://[%s]:%d/%s" : "tcp://%s:%d/%s", adv, port, dev);
    MD_INFO("worker",
            "stage %d of replica %s (%s layers %d-%d): started a stage server (pid %d) "
            "on %s",
            v->role.stage + 1, v->role.replica, v->role.model, v->role.lo, v->role.hi - 1, v->pid,
            listen_arg);
    return 0;
}

static int key_ttl_s(const wk *w) {
    int t = (3 * w->cfg->heartbeat_ms + 999) / 1000;
    return t > 10 ? t : 10;
}

static void set_key(wk *w, stage_srv *v) {
    if (w->broken)
        return;
    md_err e = {0};
    redisReply *rep = md_redis_cmd(w->r, &e, "SET %s %s EX %d", v->key, v->endpoint, key_ttl_s(w));
    if (!rep)
        w->broken = 1;
    else
        freeReplyObject(rep);
}

/* Delete v's key if it still holds v's endpoint (another worker may hold the role now). */
static void del_key(wk *w, stage_srv *v) {
    if (w->broken || !v->endpoint[0])
        return;
    md_err e = {0};
    char sha[41];
    q_script_sha(q_stage_del_lua, sha);
    for (int tries = 0; tries < 2; tries++) {
        redisReply *rep = md_redis_cmd(w->r, &e, "EVALSHA %s 1 %s %s", sha, v->key, v->endpoint);
        if (!rep) {
            w->broken = 1;
            return;
        }
        int noscript = rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "NOSCRIPT", 8);
        freeReplyObject(rep);
        /* Not loaded (a restarted Redis): load it if this user may; else the key expires. */
        if (!noscript || q_script_load(w->r, q_stage_del_lua, sha, &e))
            return;
    }
}

/* The child ended (status st): forget it, take its key away, restart after the backoff. */
static void srv_died(wk *w, stage_srv *v, int st, uint64_t now) {
    MD_WARN("worker", "stage %d of replica %s: the stage server (pid %d) %s %d; restarting it",
            v->role.stage + 1, v->role.replica, v->pid,
            WIFSIGNALED(st) ? "was killed by signal" : "exited with status",
            WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    if (v->ready)
        del_key(w, v);
    v->pid = 0;
    v->ready = 0;
    /* a server that ran a while restarts at once; one that keeps dying, slower and slower */
    v->backoff_ms = now - v->started_ns > 30000 * MS ? BACKOFF_MIN_MS : next_backoff(v->backoff_ms);
    v->next_try_ns = now + (uint64_t)v->backoff_ms * MS;
}

/* End v's child (SIGTERM, then SIGKILL) and delete its key. */
static void srv_stop(wk *w, stage_srv *v) {
    if (v->pid > 0) {
        kill(v->pid, SIGTERM);
        int st = 0;
        uint64_t t0 = md_mono_ns();
        while (waitpid(v->pid, &st, WNOHANG) == 0) {
            if (md_mono_ns() - t0 > SRV_STOP_MS * MS) {
                kill(v->pid, SIGKILL);
                waitpid(v->pid, &st, 0);
                break;
            }
            usleep(10000);
        }
        MD_INFO("worker", "stage %d of replica %s: stage server (pid %d) stopped",
                v->role.stage + 1, v->role.replica, v->pid);
    }
    del_key(w, v);
    memset(v, 0, sizeof *v);
}

/* Watch, (re)start and probe the stage servers. */
static void roles_tick(wk *w, uint64_t now) {
    for (int k = 0; k < WK_ROLES_MAX; k++) {
        stage_srv *v = &w->srv[k];
        if (!v->used)
            continue;
        int st = 0;
        if (v->pid > 0 && waitpid(v->pid, &st, WNOHANG) == v->pid)
            srv_died(w, v, st, now);
        if (v->pid == 0 && now >= v->next_try_ns) {
            md_err e = {0};
            if (srv_spawn(w, v, &e)) {
                v->backoff_ms = next_backoff(v->backoff_ms);
                v->next_try_ns = now + (uint64_t)v->backoff_ms * MS;
                MD_ERROR("worker", "stage %d of replica %s: %s; next try in %.1f s",
                         v->role.stage + 1, v->role.replica, e.msg, v->backoff_ms / 1e3);
            }
            continue;
        }
        if (v->pid > 0 && !v->ready && now - v->probed_ns >= 50 * MS) {
            v->probed_ns = now;
            char host[256];
            int port;
            const char *listen = w->cfg->stage_listen && *w->cfg->stage_listen
                                     ? w->cfg->stage_listen
                                     : "127.0.0.1:0";
            split_listen(listen, host, sizeof host, &port);
            int fd = tcp_socket(wildcard(host) ? "127.0.0.1" : host, v->port, 0, 200);
            if (fd >= 0) {
                close(fd);
                v->ready = 1;
                set_key(w, v);
                MD_INFO("worker", "stage %d of replica %s served at %s (key %s)", v->role.stage + 1,
                        v->role.replica, v->endpoint, v->key);
                w->last_hb = 0;
            } else if (now - v->started_ns > SRV_LISTEN_MS * MS) {
                MD_ERROR("worker",
                         "stage %d of replica %s: the stage server (pid %d) does not "
                         "accept connections on port %d after %d s; killing it",
                         v->role.stage + 1, v->role.replica, v->pid, v->port, SRV_LISTEN_MS / 1000);
                kill(v->pid, SIGKILL);
            }
        }
    }
}

void wk_roles_apply(wk *w, const wk_role *roles, int n) {
    for (int k = 0; k < WK_ROLES_MAX; k++) {
        stage_srv *v = &w->srv[k];
        int keep = 0;
        for (int i = 0; i < n && v->used && !keep; i++)
            keep = !strcmp(roles[i].replica, v->role.replica) && roles[i].stage == v->role.stage;
        if (v->used && !keep)
            srv_stop(w, v);
    }
    for (int i = 0; i < n; i++) {
        stage_srv *v = NULL, *free_v = NULL;
        for (int k = 0; k < WK_ROLES_MAX && !v; k++) {
            stage_srv *x = &w->srv[k];
            if (x->used && !strcmp(x->role.replica, roles[i].replica) &&
                x->role.stage == roles[i].stage)
                v = x;
            else if (!x->used && !free_v)
                free_v = x;
        }
        if (!v && free_v) {
            v = free_v;
            memset(v, 0, sizeof *v);
            v->used = 1;
            q_key_stage(v->key, w->prefix, roles[i].replica, roles[i].stage);
        }
        if (v)
            v->role = roles[i]; /* the model and layers are the head's to tell the server */
    }
}

void wk_roles_refresh(wk *w) {
    for (int k = 0; k < WK_ROLES_MAX && !w->broken; k++)
        if (w->srv[k].used && w->srv[k].ready)
            set_key(w, &w->srv[k]);
}

void wk_roles_stop(wk *w) {
    for (int k = 0; k < WK_ROLES_MAX; k++)
        if (w->srv[k].used)
            srv_stop(w, &w->srv[k]);
}

/* ---- each turn ---- */

void wk_shard_tick(wk *w) {
    uint64_t now = md_mono_ns();
    int look = now - w->last_stage_check >= (uint64_t)w->cfg->plan_check_ms * MS;
    if (look)
        w->last_stage_check = now;
    for (int m = 0; m < WK_MAX_MODELS && !w->broken && !w->device_failed; m++) {
        model *md = &w->mod[m];
        if (md->state != SLOT_ON || !md->sh.on)
            continue;
        if (md->sh.pipe.n_stages) {
            if (!look)
                continue;
            if (!check_keys(w, m, now) || md->runner)
                continue;
        }
        if (!md->runner && now >= md->sh.next_try_ns)
            try_form(w, m, now);
    }
    if (!w->broken)
        roles_tick(w, now);
}
