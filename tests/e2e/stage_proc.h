/* stage_proc.h — `medley stage` processes for the tests that run stages in other processes
 * (test_stage_cli.c, test_sharding.c): start one on a port the kernel picks, read the port
 * from its log, stop it with SIGTERM. Each serves the models these tests ask for
 * (synthetic:tiny, synthetic:tiny-tp:q8_0, SmolLM2 by its path when fetched) to heads holding
 * a secret made for the test run (stage_secret_file()), which is also put in
 * $MEDLEY_STAGE_SECRET_FILE, so heads in the test's process and the commands it runs sign
 * with it. The binary is $MEDLEY_BIN (set by ctest). cmocka's assertions: include after
 * <cmocka.h>. */
#ifndef MEDLEY_TESTS_STAGE_PROC_H
#define MEDLEY_TESTS_STAGE_PROC_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "e2e/test_engine_util.h"

static inline const char *stage_bin(void) {
    const char *b = getenv("MEDLEY_BIN");
    return b && *b ? b : NULL;
}

typedef struct {
    pid_t pid;
    int port;
    char log[64]; /* its stderr */
} stage_proc;

/* The text of a file (static buffer). */
static inline const char *slurp(const char *path) {
    static char text[1 << 16];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f)
        fclose(f);
    return text;
}

/* The secret file of this test process (made on first use, removed at exit), also put in
 * $MEDLEY_STAGE_SECRET_FILE. */
static char stage_secret_path[64];
static inline void stage_secret_remove(void) {
    unlink(stage_secret_path);
}
static inline const char *stage_secret_file(void) {
    if (!stage_secret_path[0]) {
        snprintf(stage_secret_path, sizeof stage_secret_path, "/tmp/medley-stage-secret-XXXXXX");
        int fd = mkstemp(stage_secret_path);
        assert_true(fd >= 0);
        char key[33];
        snprintf(key, sizeof key, "%08x%08x%08x%08x", (unsigned)getpid(), (unsigned)rand(),
                 (unsigned)rand(), (unsigned)time(NULL));
        assert_int_equal(write(fd, key, 32), 32);
        close(fd);
        atexit(stage_secret_remove);
        setenv("MEDLEY_STAGE_SECRET_FILE", stage_secret_path, 1);
    }
    return stage_secret_path;
}

/* `medley stage --listen listen --threads 1` with the test secret and models; waits for its
 * "listening on" line (port into s->port) unless it exits first. Returns 0 listening, else
 * its exit status. */
static inline int stage_start(stage_proc *s, const char *listen) {
    snprintf(s->log, sizeof s->log, "/tmp/medley-stage-cli-XXXXXX");
    int fd = mkstemp(s->log);
    assert_true(fd >= 0);
    const char *secret = stage_secret_file(), *model = test_model_path();
    char smol[4096];
    snprintf(smol, sizeof smol, "%s", model ? model : "synthetic:tiny");
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) {
        dup2(fd, 2);
        execl(stage_bin(), "medley", "stage", "--listen", listen, "--threads", "1", "--secret-file",
              secret, "--model", "synthetic:tiny", "--model", "synthetic:tiny-tp:q8_0", "--model",
              smol, (char *)NULL);
        _exit(127);
    }
    close(fd);
    for (int i = 0; i < 500; i++) {
        const char *l = strstr(slurp(s->log), "stage: listening on 127.0.0.1:");
        if (l) {
            s->port = atoi(l + strlen("stage: listening on 127.0.0.1:"));
            return 0;
        }
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        usleep(20000);
    }
    fail_msg("medley stage did not start: %s", slurp(s->log));
    return -1;
}

/* SIGTERM, then its exit status (it must exit within 10 s). */
static inline int stage_stop(stage_proc *s) {
    kill(s->pid, SIGTERM);
    for (int i = 0; i < 1000; i++) {
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        usleep(10000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    fail_msg("medley stage did not stop on SIGTERM: %s", slurp(s->log));
    return -1;
}

#endif
