/* test_supervise.c — worker/supervise.c with /bin/sh children and short backoffs: device lists
 * (syntax, checks, GPU duplicates), a child that exits 0 is left stopped, one that keeps
 * failing at startup is given up after max_startup_failures starts, a crashing child is
 * restarted until it stays up and then stopped by SIGTERM, and children's stderr is relayed
 * with their name (JSON objects get a "worker" member, other lines are wrapped). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "worker/supervise.h"

static void split_refuses_empty_entries_and_long_lists(void **st) {
    (void)st;
    char d[4][SV_DEVICE_MAX];
    md_err e = {0};
    assert_int_equal(sv_devices_split("cpu:1,cuda:3", d, 4, &e), 2);
    assert_string_equal(d[0], "cpu:1");
    assert_string_equal(d[1], "cuda:3");
    assert_int_equal(sv_devices_split("cpu", d, 4, &e), 1);
    const char *bad[] = {"",         ",cpu",      "cpu,",
                         "cpu,,cpu", "a,b,c,d,e", "cpu,0123456789012345678901234567890123456789"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        md_err_clear(&e);
        assert_int_equal(sv_devices_split(bad[i], d, 4, &e), MD_EINVAL);
        assert_true(strlen(e.msg) > 10);
    }
    assert_non_null(strstr(e.msg, "entry 2"));
}

static void check_resolves_cpu_names_and_refuses_bad_ones(void **st) {
    (void)st;
    char d[3][SV_DEVICE_MAX] = {"cpu", "cpu:2", "cpu"}; /* a CPU device may repeat */
    md_err e = {0};
    assert_int_equal(sv_devices_check(d, 3, &e), 0);
    assert_string_equal(d[1], "cpu:2");
    char b[2][SV_DEVICE_MAX] = {"cpu", "cpu:x"};
    assert_int_equal(sv_devices_check(b, 2, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "entry 2 of 2"));
    assert_non_null(strstr(e.msg, "cpu:x"));
    char u[1][SV_DEVICE_MAX] = {"tpu:0"};
    assert_int_equal(sv_devices_check(u, 1, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "tpu:0"));
}

/* Without a usable GPU cuda:0 fails with the backend's reason; with one, "cuda" and "cuda:0"
 * are the same GPU and listing it twice is refused. */
static void check_names_the_gpu_it_cannot_use_or_that_repeats(void **st) {
    (void)st;
    char name[SV_DEVICE_MAX];
    md_err e = {0};
    char d[2][SV_DEVICE_MAX] = {"cuda:0", "cuda"};
    int usable = md_backend_resolve("cuda:0", name, sizeof name, &e) == 0;
    md_err_clear(&e);
    int rc = sv_devices_check(d, 2, &e);
    if (usable) {
        assert_int_equal(rc, MD_EINVAL);
        assert_non_null(strstr(e.msg, "cuda:0 twice"));
    } else {
        assert_true(rc == MD_EUNSUPP || rc == MD_EDEVICE);
        assert_non_null(strstr(e.msg, "entry 1 of 2"));
        assert_non_null(strstr(e.msg, "cuda:0"));
    }
}

static volatile sig_atomic_t g_stop;
static void on_alarm(int sig) {
    (void)sig;
    g_stop = 1;
}

/* Stop after ms (0: never), through SIGALRM as a SIGTERM handler would. */
static void stop_after(int ms) {
    g_stop = 0;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {ms / 1000, (ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static char g_dir[64];

static void fast(sv_config *c, sv_child *kids, int n) {
    sv_config_default(c);
    c->exe = "/bin/sh";
    c->children = kids;
    c->n = n;
    c->backoff_min_ms = 20;
    c->backoff_max_ms = 80;
    c->max_startup_failures = 3;
}

static int lines_in(const char *path) {
    FILE *f = fopen(path, "r");
    int n = 0, ch;
    if (!f)
        return 0;
    while ((ch = fgetc(f)) != EOF)
        n += ch == '\n';
    fclose(f);
    return n;
}

static void child_exiting_0_is_not_restarted(void **st) {
    (void)st;
    char script[256], path[128];
    snprintf(path, sizeof path, "%s/ok", g_dir);
    snprintf(script, sizeof script, "echo x >> %s; exit 0", path);
    char *argv[] = {"sh", "-c", script, NULL};
    sv_child k = {"ok.0", "cpu", argv};
    sv_config c;
    fast(&c, &k, 1);
    md_err e = {0};
    stop_after(0);
    assert_int_equal(sv_run(&c, &g_stop, &e), 0);
    assert_int_equal(lines_in(path), 1);
}

static void child_failing_at_startup_is_given_up_others_keep_running(void **st) {
    (void)st;
    char s0[256], s1[256], p0[128], p1[128];
    snprintf(p0, sizeof p0, "%s/bad", g_dir);
    snprintf(p1, sizeof p1, "%s/good", g_dir);
    snprintf(s0, sizeof s0, "echo x >> %s; exit 3", p0);
    snprintf(s1, sizeof s1, "echo x >> %s; exec sleep 30", p1);
    char *a0[] = {"sh", "-c", s0, NULL}, *a1[] = {"sh", "-c", s1, NULL};
    sv_child k[2] = {{"bad.0", "cuda:0", a0}, {"good.1", "cuda:1", a1}};
    sv_config c;
    fast(&c, k, 2);
    md_err e = {0};
    stop_after(1500); /* 20 + 40 ms of backoff, then the good one is stopped */
    assert_int_equal(sv_run(&c, &g_stop, &e), MD_EIO);
    assert_int_equal(lines_in(p0), 3);
    assert_int_equal(lines_in(p1), 1); /* never restarted; SIGTERM on stop is clean */
    assert_non_null(strstr(e.msg, "1 of 2"));
    assert_non_null(strstr(e.msg, "bad.0 (cuda:0): given up after exit code 3"));
    assert_null(strstr(e.msg, "good.1"));
}

static void crashing_child_is_restarted_until_it_stays_up(void **st) {
    (void)st;
    char script[512], path[128];
    snprintf(path, sizeof path, "%s/crash", g_dir);
    /* killed by a signal twice, then up until stopped */
    snprintf(script, sizeof script,
             "echo x >> %s; [ $(wc -l < %s) -ge 3 ] && exec sleep 30; kill -9 $$", path, path);
    char *argv[] = {"sh", "-c", script, NULL};
    sv_child k = {"crash.0", "cpu", argv};
    sv_config c;
    fast(&c, &k, 1);
    md_err e = {0};
    stop_after(1000);
    assert_int_equal(sv_run(&c, &g_stop, &e), 0);
    assert_int_equal(lines_in(path), 3);
}

/* Children's stderr, captured by pointing our fd 2 at a file while sv_run runs. */
static void stderr_lines_carry_the_child_name(void **st) {
    (void)st;
    char out[128];
    snprintf(out, sizeof out, "%s/stderr", g_dir);
    char *argv[] = {"sh", "-c",
                    "printf '{\"level\":\"info\",\"msg\":\"hi\"}\\nplain text\\n\\377x\\nno "
                    "newline' >&2",
                    NULL};
    sv_child k = {"W.3", "cpu", argv};
    sv_config c;
    fast(&c, &k, 1);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600), saved = dup(2);
    assert_true(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, 2);
    md_err e = {0};
    stop_after(0);
    int rc = sv_run(&c, &g_stop, &e);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    assert_int_equal(rc, 0);
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    char line[1024];
    int objects = 0, wrapped = 0, tail = 0, bytes = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o)
            continue; /* the supervisor's own lines are text here (no md_log_set_json) */
        assert_string_equal(json_string_value(json_object_get(o, "worker")), "W.3");
        const char *msg = json_string_value(json_object_get(o, "msg"));
        const char *comp = json_string_value(json_object_get(o, "component"));
        objects += msg && !strcmp(msg, "hi") && !comp;
        wrapped += msg && !strcmp(msg, "plain text") && comp && !strcmp(comp, "stderr");
        bytes += msg && !strcmp(msg, "?x");
        tail += msg && !strcmp(msg, "no newline");
        json_decref(o);
    }
    fclose(f);
    assert_int_equal(objects, 1);
    assert_int_equal(wrapped, 1);
    assert_int_equal(bytes, 1);
    assert_int_equal(tail, 1);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/medley-supervise-XXXXXX");
    if (!mkdtemp(g_dir))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_refuses_empty_entries_and_long_lists),
        cmocka_unit_test(check_resolves_cpu_names_and_refuses_bad_ones),
        cmocka_unit_test(check_names_the_gpu_it_cannot_use_or_that_repeats),
        cmocka_unit_test(child_exiting_0_is_not_restarted),
        cmocka_unit_test(child_failing_at_startup_is_given_up_others_keep_running),
        cmocka_unit_test(crashing_child_is_restarted_until_it_stays_up),
        cmocka_unit_test(stderr_lines_carry_the_child_name),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
