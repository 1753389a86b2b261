/* test_metrics.c — common/metrics: the exact text of a small registry (escaping, cumulative
 * histogram buckets with +Inf, _sum and _count), bad names and full families, label values
 * that are not UTF-8 or too long, updates racing a render; common/metrics_http: GET /metrics,
 * 404, 405, a taken port and bad addresses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/metrics.h"
#include "common/metrics_http.h"

static void renders_exact_text_with_escaping_and_cumulative_buckets(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    const char *ml[] = {"model", "code"};
    md_metric *failed =
        md_metrics_counter(reg, "t_failed_total", "Failed \\ requests\nby code.", 2, ml, 8, &e);
    md_metric *held = md_metrics_gauge(reg, "t_held", "Held.", 0, NULL, 1, &e);
    const char *hl[] = {"model"};
    const double b[] = {0.1, 1, 10};
    md_metric *wait = md_metrics_histogram(reg, "t_wait_seconds", "Wait.", 1, hl, 4, b, 3, &e);
    assert_non_null(failed);
    assert_non_null(held);
    assert_non_null(wait);
    md_counter_add(md_metric_at2(failed, "m\"1", "a\\b\nc"), 2);
    md_counter_add(md_metric_at2(failed, "m\"1", "a\\b\nc"), 1);
    md_counter_add(md_metric_at2(failed, "echo", "server_error"), 0.5);
    md_counter_add(md_metric_at2(failed, "echo", "server_error"), -7); /* ignored */
    md_gauge_set(md_metric_at0(held), -3);
    md_series *w = md_metric_at1(wait, "echo");
    md_histogram_observe(w, 0.05);
    md_histogram_observe(w, 0.1); /* le is inclusive */
    md_histogram_observe(w, 5);
    md_histogram_observe(w, 100);
    size_t len = 0;
    char *text = md_metrics_render(reg, &len);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    assert_string_equal(text, "# HELP t_failed_total Failed \\\\ requests\\nby code.\n"
                              "# TYPE t_failed_total counter\n"
                              "t_failed_total{model=\"m\\\"1\",code=\"a\\\\b\\nc\"} 3\n"
                              "t_failed_total{model=\"echo\",code=\"server_error\"} 0.5\n"
                              "# HELP t_held Held.\n"
                              "# TYPE t_held gauge\n"
                              "t_held -3\n"
                              "# HELP t_wait_seconds Wait.\n"
                              "# TYPE t_wait_seconds histogram\n"
                              "t_wait_seconds_bucket{model=\"echo\",le=\"0.1\"} 2\n"
                              "t_wait_seconds_bucket{model=\"echo\",le=\"1\"} 2\n"
                              "t_wait_seconds_bucket{model=\"echo\",le=\"10\"} 3\n"
                              "t_wait_seconds_bucket{model=\"echo\",le=\"+Inf\"} 4\n"
                              "t_wait_seconds_sum{model=\"echo\"} 105.15\n"
                              "t_wait_seconds_count{model=\"echo\"} 4\n");
    free(text);
    md_metrics_free(reg);
}

static void hidden_gauge_is_left_out_until_set_again(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    const char *l[] = {"stream"};
    md_metric *lag = md_metrics_gauge(reg, "t_lag_entries", "Lag.", 1, l, 4, &e);
    md_series *a = md_metric_at1(lag, "a"), *b = md_metric_at1(lag, "b");
    md_gauge_set(a, 1);
    md_gauge_set(b, 2);
    md_series_hide(a);
    char *text = md_metrics_render(reg, NULL);
    assert_null(strstr(text, "stream=\"a\""));
    assert_non_null(strstr(text, "t_lag_entries{stream=\"b\"} 2\n"));
    free(text);
    md_gauge_set(md_metric_at1(lag, "a"), 7);
    text = md_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "t_lag_entries{stream=\"a\"} 7\n"));
    free(text);
    md_metrics_free(reg);
}

static void bad_names_duplicates_and_full_families_are_refused(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    assert_null(md_metrics_counter(reg, "1bad", "", 0, NULL, 1, &e));
    assert_int_equal(e.code, MD_EINVAL);
    assert_null(md_metrics_counter(reg, "bad-name", "", 0, NULL, 1, &e));
    const char *reserved[] = {"__x"};
    assert_null(md_metrics_gauge(reg, "ok_name", "", 1, reserved, 2, &e));
    const char *le[] = {"le"};
    const double b[] = {1};
    assert_null(md_metrics_histogram(reg, "h_seconds", "", 1, le, 2, b, 1, &e));
    const double unsorted[] = {2, 1};
    assert_null(md_metrics_histogram(reg, "h_seconds", "", 0, NULL, 1, unsorted, 2, &e));
    const char *l[] = {"model"};
    md_metric *m = md_metrics_counter(reg, "t_total", "", 1, l, 2, &e);
    assert_non_null(m);
    assert_null(md_metrics_counter(reg, "t_total", "", 1, l, 2, &e));
    assert_non_null(strstr(e.msg, "registered already"));
    assert_non_null(md_metric_at1(m, "a"));
    assert_non_null(md_metric_at1(m, "b"));
    assert_null(md_metric_at1(m, "c")); /* full */
    md_counter_add(md_metric_at1(m, "c"), 1);
    assert_ptr_equal(md_metric_at1(m, "a"), md_metric_at1(m, "a"));
    char *text = md_metrics_render(reg, NULL);
    assert_null(strstr(text, "\"c\""));
    free(text);
    md_metrics_free(reg);
}

static void label_values_become_valid_utf8_and_are_cut(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    const char *l[] = {"model"};
    md_metric *m = md_metrics_gauge(reg, "t_g", "", 1, l, 4, &e);
    md_gauge_set(md_metric_at1(m, "a\xff\xc3(b\xc3\xa9"), 1); /* bad byte, bad pair, é */
    char longv[400];
    memset(longv, 'x', sizeof longv);
    memcpy(longv + 126, "\xc3\xa9", 2); /* é across the cut: left out whole */
    longv[399] = '\0';
    md_gauge_set(md_metric_at1(m, longv), 2);
    char *text = md_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "t_g{model=\"a?"
                                 "?(b\xc3\xa9\"} 1\n"));
    char want[200];
    snprintf(want, sizeof want, "t_g{model=\"%.126s\"} 2\n", longv);
    assert_non_null(strstr(text, want));
    free(text);
    md_metrics_free(reg);
}

typedef struct {
    md_series *c;
    md_series *h;
} race_arg;

static void *bump(void *p) {
    race_arg *a = p;
    for (int i = 0; i < 100000; i++) {
        md_counter_add(a->c, 1);
        md_histogram_observe(a->h, 0.5);
    }
    return NULL;
}

static void updates_racing_renders_are_all_counted(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    md_metric *c = md_metrics_counter(reg, "t_total", "", 0, NULL, 1, &e);
    const double b[] = {1};
    md_metric *h = md_metrics_histogram(reg, "t_seconds", "", 0, NULL, 1, b, 1, &e);
    race_arg a = {md_metric_at0(c), md_metric_at0(h)};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, bump, &a);
    for (int i = 0; i < 50; i++)
        free(md_metrics_render(reg, NULL));
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    char *text = md_metrics_render(reg, NULL);
    assert_non_null(strstr(text, "t_total 400000\n"));
    assert_non_null(strstr(text, "t_seconds_count 400000\n"));
    assert_non_null(strstr(text, "t_seconds_sum 200000\n"));
    free(text);
    md_metrics_free(reg);
}

/* One HTTP/1.0 exchange with 127.0.0.1:port; the whole response into out. */
static void http(int port, const char *request, char *out, size_t cap) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(write(s, request, strlen(request)), (ssize_t)strlen(request));
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(s, out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = '\0';
    close(s);
}

static void http_serves_metrics_and_refuses_the_rest(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    md_metric *c = md_metrics_counter(reg, "t_requests_total", "Requests.", 0, NULL, 1, &e);
    md_counter_add(md_metric_at0(c), 42);
    md_metrics_http *h = NULL;
    assert_int_equal(md_metrics_http_start("127.0.0.1:0", reg, &h, &e), 0);
    int port = md_metrics_http_port(h);
    assert_true(port > 0);
    char resp[8192];
    http(port, "GET /metrics HTTP/1.0\r\n\r\n", resp, sizeof resp);
    assert_non_null(strstr(resp, " 200 OK\r\n"));
    assert_non_null(strstr(resp, "text/plain; version=0.0.4"));
    assert_non_null(strstr(resp, "\r\n\r\n# HELP t_requests_total Requests.\n"));
    assert_non_null(strstr(resp, "t_requests_total 42\n"));
    http(port, "GET /other HTTP/1.0\r\n\r\n", resp, sizeof resp);
    assert_non_null(strstr(resp, " 404 "));
    http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", resp, sizeof resp);
    assert_non_null(strstr(resp, " 405 "));
    assert_non_null(strstr(resp, "Allow: GET, HEAD"));

    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    md_metrics_http *h2 = NULL;
    assert_int_equal(md_metrics_http_start(addr, reg, &h2, &e), MD_EINVAL);
    assert_null(h2);
    assert_non_null(strstr(e.msg, "is taken"));
    md_metrics_http_stop(h);
    md_metrics_free(reg);
}

static void http_bad_addresses_are_said_plainly(void **st) {
    md_err e = {0};
    md_metrics *reg = md_metrics_new();
    md_metrics_http *h = NULL;
    const char *bad[] = {"9100",  "127.0.0.1:", "127.0.0.1:70000",
                         ":9100", "::1:9100",   "127.0.0.1:9x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(md_metrics_http_start(bad[i], reg, &h, &e), MD_EINVAL);
        assert_non_null(strstr(e.msg, "metrics address"));
    }
    assert_int_equal(md_metrics_http_start("no-such-host.invalid:9100", reg, &h, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "does not resolve"));
    assert_int_equal(md_metrics_http_start("192.0.2.1:0", reg, &h, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "not an address of this machine"));
    md_metrics_free(reg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(renders_exact_text_with_escaping_and_cumulative_buckets),
        cmocka_unit_test(hidden_gauge_is_left_out_until_set_again),
        cmocka_unit_test(bad_names_duplicates_and_full_families_are_refused),
        cmocka_unit_test(label_values_become_valid_utf8_and_are_cut),
        cmocka_unit_test(updates_racing_renders_are_all_counted),
        cmocka_unit_test(http_serves_metrics_and_refuses_the_rest),
        cmocka_unit_test(http_bad_addresses_are_said_plainly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
