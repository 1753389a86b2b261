/* supervise.c — see supervise.h. One process per device, because a clean process is the only
 * safe container for a device's engine: the CUDA runtime does not survive fork(), the parent
 * may already have asked the driver about the devices, and a crash (or the OOM killer) then
 * takes one device down, not all. Children are fork + exec of the same binary with their own
 * argv; the supervisor itself is a single-threaded poll loop over the children's stderr pipes,
 * so a child's exit is seen both as EOF on its pipe and by waitpid. */
#define _GNU_SOURCE
#include "worker/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "kernels/backend.h"

int sv_devices_split(const char *list, char out[][SV_DEVICE_MAX], int max, md_err *e) {
    if (!list || !*list)
        return md_errf(e, MD_EINVAL, "--devices needs at least one device (D or D,D,...)");
    int n = 0;
    for (const char *p = list;;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == 0)
            return md_errf(e, MD_EINVAL, "--devices \"%s\": entry %d is empty", list, n + 1);
        if (n == max)
            return md_errf(e, MD_EINVAL, "--devices \"%s\" names more than %d devices", list, max);
        if (len >= SV_DEVICE_MAX)
            return md_errf(e, MD_EINVAL, "--devices: entry %d (\"%.*s\") is longer than %d bytes",
                           n + 1, (int)len, p, SV_DEVICE_MAX - 1);
        memcpy(out[n], p, len);
        out[n][len] = 0;
        n++;
        if (!c)
            return n;
        p = c + 1;
    }
}

int sv_devices_check(char dev[][SV_DEVICE_MAX], int n, md_err *e) {
    for (int i = 0; i < n; i++) {
        char name[SV_DEVICE_MAX];
        md_err de = {0};
        if (md_backend_resolve(dev[i], name, sizeof name, &de))
            return md_errf(e, de.code, "--devices entry %d of %d: %s", i + 1, n, de.msg);
        /* a GPU: "cuda" or "cuda:K", whose syntax resolve checked and asked the driver about */
        md_device_id id;
        int gpu = md_device_parse(name, &id, NULL) == 0 && id.kind == MD_DEVICE_CUDA && !id.exact;
        if (gpu) {
            snprintf(name, sizeof name, "cuda:%d", id.index);
        } else {
            /* resolve passes other names through; opening a one-thread backend applies the
             * backend's own rules ("cpu:0", "cpu:x" and unknown names are refused) */
            md_backend *be = NULL;
            if (md_backend_open(name, 1, &be, &de))
                return md_errf(e, de.code, "--devices entry %d of %d: %s", i + 1, n, de.msg);
            md_backend_free(be);
        }
        for (int j = 0; j < i; j++)
            if (gpu && !strcmp(dev[j], name))
                return md_errf(e, MD_EINVAL,
                               "--devices names %s twice (entries %d and %d): one engine per GPU",
                               name, j + 1, i + 1);
        memcpy(dev[i], name, sizeof name);
    }
    return 0;
}

void sv_config_default(sv_config *c) {
    memset(c, 0, sizeof *c);
    c->exe = "/proc/self/exe";
    c->json = 1;
    c->backoff_min_ms = 1000;
    c->backoff_max_ms = 30000;
    c->stable_ms = 60000;
    c->startup_ms = 10000;
    c->max_startup_failures = 5;
}

#define LINE_MAX_BYTES 8192

enum { K_RUNNING, K_WAITING, K_DONE, K_GAVE_UP, K_BAD, K_DRAINED };

typedef struct {
    int state;
    pid_t pid;                /* > 0 while running */
    int fd;                   /* read end of its stderr pipe; -1 when closed */
    uint64_t started_ns;      /* md_mono_ns() at its last start */
    uint64_t restart_ns;      /* K_WAITING: when to start it again */
    int backoff_ms;           /* delay before the next restart */
    int startup_failures;     /* consecutive deaths within startup_ms of starting */
    char ended[96];           /* how it last ended ("exit code 1", "signal 9 (Killed)") */
    size_t len;               /* bytes of an unfinished line in buf */
    char buf[LINE_MAX_BYTES]; /* a longer line is relayed in pieces */
} kid;

/* One relayed line, written with one writev so lines of different children never mix. */
static void relay_line(const sv_config *cfg, const char *name, const char *line, size_t len) {
    if (!cfg->json) {
        struct iovec v[5] = {
            {"[", 1}, {(void *)name, strlen(name)}, {"] ", 2}, {(void *)line, len}, {"\n", 1}};
        ssize_t w = writev(2, v, 5); /* < 0: stderr gone, nothing to tell it */
        (void)w;
        return;
    }
    json_t *o = json_loadb(line, len, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        json_t *msg = json_stringn(line, len);
        if (!msg) { /* not UTF-8: keep the ASCII, mark the rest */
            char clean[LINE_MAX_BYTES];
            for (size_t i = 0; i < len; i++)
                clean[i] = (unsigned char)line[i] < 0x80 ? line[i] : '?';
            msg = json_stringn(clean, len);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[40];
        snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
        o = json_pack("{s:s, s:s, s:s, s:o*}", "ts", when, "level", "info", "component", "stderr",
                      "msg", msg);
    }
    if (!o)
        return;
    json_object_set_new(o, "worker", json_string(name));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        return;
    struct iovec v[2] = {{s, strlen(s)}, {"\n", 1}};
    ssize_t w = writev(2, v, 2); /* < 0: stderr gone, nothing to tell it */
    (void)w;
    free(s);
}

/* Relay what the child's pipe holds now; at EOF (or when `final`, after it was reaped) also
 * its unfinished last line, and close the pipe. */
static void drain(const sv_config *cfg, const sv_child *c, kid *k, int final) {
    while (k->fd >= 0) {
        ssize_t r = read(k->fd, k->buf + k->len, sizeof k->buf - k->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0) {
            k->len += (size_t)r;
            size_t start = 0;
            for (size_t i = 0; i < k->len; i++)
                if (k->buf[i] == '\n') {
                    relay_line(cfg, c->name, k->buf + start, i - start);
                    start = i + 1;
                }
            if (start == 0 && k->len == sizeof k->buf) {
                relay_line(cfg, c->name, k->buf, k->len);
                start = k->len;
            }
            memmove(k->buf, k->buf + start, k->len - start);
            k->len -= start;
            continue;
        }
        if (r < 0 && errno == EAGAIN && !final)
            return;
        if (k->len)
            relay_line(cfg, c->name, k->buf, k->len);
        k->len = 0;
        close(k->fd);
        k->fd = -1;
    }
}

/* fork + exec child i with its stderr on a fresh pipe. Returns 0, or -1 (logged) when no
 * process could be made; the caller counts that as a failed start. */
static int start(const sv_config *cfg, int i, kid *k, pid_t self) {
    const sv_child *c = &cfg->children[i];
    int p[2];
    if (pipe2(p, O_CLOEXEC)) {
        snprintf(k->ended, sizeof k->ended, "no pipe: %s", strerror(errno));
        MD_ERROR("supervise", "cannot start %s (%s): pipe: %s", c->name, c->what, strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(k->ended, sizeof k->ended, "fork failed: %s", strerror(errno));
        MD_ERROR("supervise", "cannot start %s (%s): fork: %s", c->name, c->what, strerror(errno));
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        /* the child: async-signal-safe calls only until exec */
        if (dup2(p[1], 2) < 0)
            _exit(126);
        /* stop (gracefully) when the supervisor dies, even by SIGKILL; if it already has,
         * PDEATHSIG came too late, so leave now */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != self)
            _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(cfg->exe, c->argv);
        static const char msg[] = "medley worker: the supervisor could not exec its child\n";
        if (write(2, msg, sizeof msg - 1) < 0)
            _exit(127);
        _exit(127);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    k->state = K_RUNNING;
    k->pid = pid;
    k->fd = p[0];
    k->len = 0;
    k->started_ns = md_mono_ns();
    MD_INFO("supervise", "started %s on %s as pid %d", c->name, c->what, (int)pid);
    return 0;
}

static void describe(int status, char *out, size_t n) {
    if (WIFEXITED(status))
        snprintf(out, n, "exit code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, n, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(out, n, "wait status %d", status);
}

/* A child ended (or could not start: ran_ms 0) while not stopping: wait and restart it, or
 * give up on it after max_startup_failures quick deaths in a row. */
static void schedule(const sv_config *cfg, const sv_child *c, kid *k, double ran_ms, int others,
                     uint64_t now) {
    if (ran_ms >= cfg->stable_ms)
        k->backoff_ms = cfg->backoff_min_ms;
    if (ran_ms < cfg->startup_ms)
        k->startup_failures++;
    else
        k->startup_failures = 0;
    if (k->startup_failures >= cfg->max_startup_failures) {
        k->state = K_GAVE_UP;
        MD_ERROR("supervise",
                 "giving up on %s (%s): it failed %d times in a row within %.0f s of starting "
                 "(last: %s); %d other worker(s) keep running",
                 c->name, c->what, k->startup_failures, cfg->startup_ms / 1000.0, k->ended, others);
        return;
    }
    MD_WARN("supervise", "%s (%s) died: %s after %.1f s; restarting it in %.1f s", c->name, c->what,
            k->ended, ran_ms / 1000.0, k->backoff_ms / 1000.0);
    k->state = K_WAITING;
    k->restart_ns = now + (uint64_t)k->backoff_ms * 1000000ull;
    k->backoff_ms =
        k->backoff_ms > cfg->backoff_max_ms / 2 ? cfg->backoff_max_ms : k->backoff_ms * 2;
}

/* Child i was reaped with this wait status: its new state, said in the log; restarted
 * later (schedule) unless it stopped on purpose, was drained, or the supervisor stops. */
static void ended(const sv_config *cfg, kid *ks, int i, int status, int stopping) {
    kid *k = &ks[i];
    const sv_child *c = &cfg->children[i];
    drain(cfg, c, k, 1);
    k->pid = 0;
    uint64_t t = md_mono_ns();
    double ran_ms = (double)(t - k->started_ns) / 1e6;
    describe(status, k->ended, sizeof k->ended);
    int clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    int drained =
        cfg->drained_code && WIFEXITED(status) && WEXITSTATUS(status) == cfg->drained_code;
    if (drained) {
        k->state = K_DRAINED;
        MD_INFO("supervise", "%s (%s) was drained by an operator: not restarting it", c->name,
                c->what);
    } else if (stopping) {
        /* SIGTERM before its handler was installed (still starting) is clean too */
        clean = clean || (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
        k->state = clean ? K_DONE : K_BAD;
        md_log(clean ? MD_LOG_INFO : MD_LOG_ERROR, "supervise", "%s (%s) stopped: %s after %.1f s",
               c->name, c->what, k->ended, ran_ms / 1000.0);
    } else if (clean) {
        k->state = K_DONE;
        MD_WARN("supervise",
                "%s (%s) exited 0 by itself after %.1f s (stopped on purpose): not "
                "restarting it",
                c->name, c->what, ran_ms / 1000.0);
    } else {
        int others = 0;
        for (int j = 0; j < cfg->n; j++)
            others += j != i && (ks[j].state == K_RUNNING || ks[j].state == K_WAITING);
        schedule(cfg, c, k, ran_ms, others, t);
    }
}

int sv_run(const sv_config *cfg, volatile sig_atomic_t *stop, md_err *e) {
    if (cfg->n < 1 || cfg->n > SV_MAX_CHILDREN)
        return md_errf(e, MD_EINVAL, "supervise: %d children (1..%d)", cfg->n, SV_MAX_CHILDREN);
    if (cfg->backoff_min_ms < 1 || cfg->backoff_max_ms < cfg->backoff_min_ms ||
        cfg->max_startup_failures < 1)
        return md_errf(e, MD_EINVAL, "supervise: backoff %d..%d ms, %d startup failures",
                       cfg->backoff_min_ms, cfg->backoff_max_ms, cfg->max_startup_failures);
    kid *ks = calloc((size_t)cfg->n, sizeof *ks);
    if (!ks)
        return md_errf(e, MD_ENOMEM, "supervise: out of memory");
    pid_t self = getpid();
    int stopping = 0;
    for (int i = 0; i < cfg->n; i++) {
        ks[i].fd = -1;
        ks[i].backoff_ms = cfg->backoff_min_ms;
        ks[i].state = K_WAITING; /* restart_ns 0: start now */
    }
    for (;;) {
        uint64_t now = md_mono_ns();
        if (*stop && !stopping) {
            stopping = 1;
            int running = 0;
            for (int i = 0; i < cfg->n; i++) {
                if (ks[i].state == K_RUNNING) {
                    kill(ks[i].pid, SIGTERM);
                    running++;
                } else if (ks[i].state == K_WAITING) {
                    ks[i].state = K_DONE;
                }
            }
            MD_INFO("supervise", "stopping: SIGTERM sent to %d worker(s), waiting for them",
                    running);
        }
        int live = 0;
        /* waitpid is polled: 4 times a second, 50 when a child closed its pipe (exiting) */
        uint64_t next = now + 250000000ull;
        for (int i = 0; i < cfg->n; i++) {
            kid *k = &ks[i];
            if (k->state == K_WAITING && k->restart_ns <= now && start(cfg, i, k, self) < 0) {
                int others = 0;
                for (int j = 0; j < cfg->n; j++)
                    others += j != i && (ks[j].state == K_RUNNING || ks[j].state == K_WAITING);
                schedule(cfg, &cfg->children[i], k, 0, others, now);
            }
            if (k->state == K_WAITING && k->restart_ns < next)
                next = k->restart_ns;
            if (k->state == K_RUNNING && k->fd < 0 && now + 20000000ull < next)
                next = now + 20000000ull;
            live += k->state == K_RUNNING || k->state == K_WAITING;
        }
        if (!live)
            break;

        struct pollfd pf[SV_MAX_CHILDREN];
        int at[SV_MAX_CHILDREN], np = 0;
        for (int i = 0; i < cfg->n; i++)
            if (ks[i].fd >= 0) {
                pf[np] = (struct pollfd){.fd = ks[i].fd, .events = POLLIN};
                at[np++] = i;
            }
        int wait_ms = next > now ? (int)((next - now) / 1000000ull) + 1 : 0;
        int r = poll(pf, (nfds_t)np, wait_ms); /* EINTR: a signal; *stop is looked at above */
        for (int p = 0; r > 0 && p < np; p++)
            if (pf[p].revents)
                drain(cfg, &cfg->children[at[p]], &ks[at[p]], 0);

        for (int i = 0; i < cfg->n; i++) {
            int status;
            if (ks[i].state == K_RUNNING && waitpid(ks[i].pid, &status, WNOHANG) == ks[i].pid)
                ended(cfg, ks, i, status, stopping);
        }
    }

    char bad[512] = "";
    size_t used = 0;
    int n_bad = 0, n_drained = 0;
    for (int i = 0; i < cfg->n; i++)
        n_drained += ks[i].state == K_DRAINED;
    for (int i = 0; i < cfg->n; i++) {
        if (ks[i].state != K_GAVE_UP && ks[i].state != K_BAD)
            continue;
        n_bad++;
        int w = snprintf(bad + used, sizeof bad - used, "%s%s (%s): %s%s", used ? "; " : "",
                         cfg->children[i].name, cfg->children[i].what,
                         ks[i].state == K_GAVE_UP ? "given up after " : "", ks[i].ended);
        if (w > 0)
            used = used + (size_t)w < sizeof bad ? used + (size_t)w : sizeof bad - 1;
    }
    free(ks);
    if (n_bad)
        return md_errf(e, MD_EIO, "%d of %d worker(s) did not end cleanly: %s", n_bad, cfg->n, bad);
    return n_drained == cfg->n ? SV_DRAINED : 0;
}
