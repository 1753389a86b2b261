/* test_worker_metrics.c — worker/worker_metrics.c: the hooks count where things happen, the
 * loop's tick sets the gauges (answers held, device, queue lag and pending from a real
 * redis-server, the DLQ), and the HTTP endpoint serves them (docs/operations.md, Metrics). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "redis_fixture.h"
#include "worker/worker_int.h"

static redis_fixture R;

static int setup(void **st) {
    (void)st;
    return rfx_start(&R);
}

static int teardown(void **st) {
    (void)st;
    rfx_stop(&R);
    return 0;
}

/* GET /metrics from 127.0.0.1:port: the body (malloc'd). */
static char *scrape(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while ((k = read(fd, buf + n, cap - n - 1)) > 0) {
        n += (size_t)k;
        if (n + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[n] = 0;
    return buf;
}

static void has(const char *text, const char *line) {
    if (!strstr(text, line))
        fail_msg("no \"%s\" in\n%s", line, text);
}

static void hooks_and_tick_show_on_the_endpoint(void **st) {
    (void)st;
    wk_config cfg = {0};
    char addr[32];
    int port = rfx_free_port();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    cfg.metrics_addr = addr;
    cfg.device_type = "L4";
    cfg.usd_per_hour = 3.6;
    wk *w = calloc(1, sizeof *w);
    w->cfg = &cfg;
    w->r = R.r;
    snprintf(w->prefix, sizeof w->prefix, "t:");
    snprintf(w->me, sizeof w->me, "w1");
    w->plan_applied = -1;
    w->cls_seen = -2;
    w->mod[0].state = SLOT_ON;
    snprintf(w->mod[0].name, sizeof w->mod[0].name, "m");
    w->st[0].state = SLOT_ON;
    snprintf(w->st[0].key, sizeof w->st[0].key, "t:q");
    /* the stream: 3 entries, 1 delivered and not answered; the model's DLQ: 1 entry */
    freeReplyObject(rfx_cmd(&R, "FLUSHALL"));
    freeReplyObject(rfx_cmd(&R, "XGROUP CREATE t:q %s 0 MKSTREAM", Q_GROUP));
    for (int i = 0; i < 3; i++)
        freeReplyObject(rfx_cmd(&R, "XADD t:q * x %d", i));
    freeReplyObject(rfx_cmd(&R, "XREADGROUP GROUP %s w1 COUNT 1 STREAMS t:q >", Q_GROUP));
    char dlq[Q_KEY_MAX];
    q_key_dlq(dlq, w->prefix, "m");
    freeReplyObject(rfx_cmd(&R, "XADD %s * x 1", dlq));

    md_err e = {0};
    assert_int_equal(wk_metrics_start(w, &e), 0);
    assert_non_null(w->mx);
    wk_metrics_started(w, 0, 1500);
    wk_metrics_answered(w, 0, NULL);
    wk_metrics_answered(w, 0, "expired");
    wk_result res = {.prompt_tokens = 3, .completion_tokens = 2, .first_token_ms = 20};
    wk_metrics_result(w, 0, &res, 0.25);
    wk_metrics_taken_over(w, 0, 2);
    wk_metrics_dead_letter(w, 0);
    wk_metrics_handed_back(w, 0, 4);
    w->n_ans = 5;
    wk_metrics_tick(w);
    assert_false(w->broken);

    char *t = scrape(port);
    has(t, "medley_worker_info{worker=\"w1\"} 1\n");
    has(t, "medley_requests_started_total{model=\"m\"} 1\n");
    has(t, "medley_queue_wait_seconds_count{model=\"m\"} 1\n");
    has(t, "medley_requests_succeeded_total{model=\"m\"} 1\n");
    has(t, "medley_requests_failed_total{model=\"m\",code=\"expired\"} 1\n");
    has(t, "medley_prompt_tokens_total{model=\"m\"} 3\n");
    has(t, "medley_completion_tokens_total{model=\"m\"} 2\n");
    has(t, "medley_request_cost_usd_total{model=\"m\"} 0.25\n");
    has(t, "medley_takeovers_total{model=\"m\"} 2\n");
    has(t, "medley_dead_letters_total{model=\"m\"} 1\n");
    has(t, "medley_requests_handed_back_total{model=\"m\"} 4\n");
    has(t, "medley_answers_held 5\n");
    has(t, "medley_device_usd_per_hour 3.6\n");
    has(t, "medley_device_info{device_type=\"L4\",name=\"\"} 1\n");
    has(t, "medley_plan_version -1\n");
    has(t, "medley_queue_lag_entries{stream=\"t:q\"} 2\n");
    has(t, "medley_queue_pending_entries{stream=\"t:q\"} 1\n");
    has(t, "medley_dlq_entries{model=\"m\"} 1\n");
    free(t);
    wk_metrics_stop(w);
    assert_null(w->mx);
    free(w);
}

static void without_an_address_every_hook_is_a_no_op(void **st) {
    (void)st;
    wk_config cfg = {0};
    wk *w = calloc(1, sizeof *w);
    w->cfg = &cfg;
    md_err e = {0};
    assert_int_equal(wk_metrics_start(w, &e), 0);
    assert_null(w->mx);
    wk_result res = {0};
    wk_metrics_started(w, 0, 1);
    wk_metrics_answered(w, 0, "x");
    wk_metrics_result(w, 0, &res, 1);
    wk_metrics_polled(w, 0);
    wk_metrics_tick(w);
    wk_metrics_stop(w);
    free(w);
}

static void a_taken_port_is_an_error(void **st) {
    (void)st;
    wk_config cfg = {0};
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", R.port); /* redis-server holds it */
    cfg.metrics_addr = addr;
    wk *w = calloc(1, sizeof *w);
    w->cfg = &cfg;
    md_err e = {0};
    assert_int_not_equal(wk_metrics_start(w, &e), 0);
    assert_null(w->mx);
    assert_non_null(strstr(e.msg, "--metrics"));
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hooks_and_tick_show_on_the_endpoint),
        cmocka_unit_test(without_an_address_every_hook_is_a_no_op),
        cmocka_unit_test(a_taken_port_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
