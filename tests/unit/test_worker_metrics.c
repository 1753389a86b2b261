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

#include "common/util.h"
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
    /* two in-progress batches of m: b1 late at its rate (4 of 10 lines in 90 s, 10 s left),
     * b2 on time; b3 is another model's */
    long long now = md_wall_ms();
    freeReplyObject(rfx_cmd(&R, "ZADD t:batches 1 b1 2 b2 3 b3"));
    freeReplyObject(rfx_cmd(&R,
                            "HSET t:{b1}:meta status in_progress model m total 10 completed 3 "
                            "failed 1 created_at %lld started_at %lld deadline %lld",
                            now - 100000, now - 90000, now + 10000));
    freeReplyObject(rfx_cmd(&R,
                            "HSET t:{b2}:meta status in_progress model m total 4 completed 2 "
                            "failed 0 created_at %lld started_at %lld deadline %lld",
                            now - 2000, now - 1000, now + 3600000));
    freeReplyObject(rfx_cmd(&R, "HSET t:{b3}:meta status in_progress model other total 4"));

    md_err e = {0};
    assert_int_equal(wk_metrics_start(w, &e), 0);
    assert_non_null(w->mx);
    wk_metrics_started(w, 0, 1500);
    wk_metrics_answered(w, 0, NULL);
    wk_metrics_answered(w, 0, "expired");
    wk_result res = {
        .prompt_tokens = 3, .completion_tokens = 2, .first_token_ms = 20, .finish_reason = "stop"};
    /* arrived 2 s ago, 1.5 s of it queued: TTFT from arrival 1.52 s, TPOT (0.5 - 0.02) s */
    wk_metrics_result(w, 0, &res, 1500, md_wall_ms() - 2000, 0.25);
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
    has(t, "medley_time_to_first_token_seconds_sum{model=\"m\"} 1.52\n");
    has(t, "medley_e2e_request_latency_seconds_count{model=\"m\"} 1\n");
    has(t, "medley_time_per_output_token_seconds_count{model=\"m\"} 1\n");
    has(t, "medley_requests_finished_total{model=\"m\",finish_reason=\"stop\"} 1\n");
    has(t, "medley_request_prompt_tokens_sum{model=\"m\"} 3\n");
    has(t, "medley_request_generation_tokens_sum{model=\"m\"} 2\n");
    has(t, "medley_worker_heartbeat_age_seconds ");
    has(t, "medley_batch_progress_ratio{batch=\"b1\",model=\"m\"} 0.4\n");
    has(t, "medley_batch_deadline_at_risk{batch=\"b1\",model=\"m\"} 1\n");
    has(t, "medley_batch_deadline_at_risk{batch=\"b2\",model=\"m\"} 0\n");
    assert_null(strstr(t, "batch=\"b3\""));
    has(t, "process_cpu_seconds_total ");
    has(t, "process_resident_memory_bytes ");
    has(t, "process_open_fds ");
    has(t, "process_start_time_seconds ");
    has(t, "medley_build_info{version=");
    free(t);
    wk_metrics_stop(w);
    assert_null(w->mx);
    free(w);
}

/* A batch that ends leaves the gauges; 70 batches over time reuse the room of ended ones. */
static void ended_batches_leave_and_their_room_is_reused(void **st) {
    (void)st;
    wk_config cfg = {0};
    wk *w = calloc(1, sizeof *w);
    w->cfg = &cfg;
    w->r = R.r;
    snprintf(w->prefix, sizeof w->prefix, "t:");
    w->mod[0].state = SLOT_ON;
    snprintf(w->mod[0].name, sizeof w->mod[0].name, "m");
    md_metrics *reg = md_metrics_new();
    md_err e = {0};
    wk_batch_mx *b = wk_batch_mx_new(reg, &e);
    assert_non_null(b);
    freeReplyObject(rfx_cmd(&R, "FLUSHALL"));
    for (int i = 0; i < 70; i++) {
        freeReplyObject(rfx_cmd(&R, "ZADD t:batches %d x%d", i, i));
        freeReplyObject(rfx_cmd(&R,
                                "HSET t:{x%d}:meta status in_progress model m total 2 "
                                "completed 1 failed 0",
                                i));
        if (i > 0)
            freeReplyObject(rfx_cmd(&R, "HSET t:{x%d}:meta status completed", i - 1));
        wk_batch_mx_tick(b, w);
        assert_false(w->broken);
    }
    size_t len;
    char *t = md_metrics_render(reg, &len);
    has(t, "medley_batch_progress_ratio{batch=\"x69\",model=\"m\"} 0.5\n");
    assert_null(strstr(t, "batch=\"x68\""));
    assert_null(strstr(t, "batch=\"x0\""));
    free(t);
    /* the rule: late at the rate so far, or past half the window with no answer */
    assert_int_equal(wk_batch_at_risk(100, 0, 10, 200, 10, 5), 0);  /* 5 more by 190 */
    assert_int_equal(wk_batch_at_risk(100, 0, 10, 150, 10, 5), 1);  /* needs until 190 */
    assert_int_equal(wk_batch_at_risk(300, 0, 10, 200, 10, 5), 1);  /* past it */
    assert_int_equal(wk_batch_at_risk(100, 0, 0, 0, 10, 5), 0);     /* no deadline */
    assert_int_equal(wk_batch_at_risk(40, 0, 0, 100, 10, 0), 0);    /* none yet, early */
    assert_int_equal(wk_batch_at_risk(60, 0, 0, 100, 10, 0), 1);    /* none yet, late */
    assert_int_equal(wk_batch_at_risk(300, 0, 10, 200, 10, 10), 0); /* all answered */
    wk_batch_mx_free(b);
    md_metrics_free(reg);
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
    wk_metrics_result(w, 0, &res, 1, 0, 1);
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
        cmocka_unit_test(ended_batches_leave_and_their_room_is_reused),
        cmocka_unit_test(without_an_address_every_hook_is_a_no_op),
        cmocka_unit_test(a_taken_port_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
