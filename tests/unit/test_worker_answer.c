/* test_worker_answer.c — worker/worker_answer.c against a real redis-server: answers become
 * OpenAI Batch output lines with medley's fields, the completion script writes each custom_id
 * once, entries are XACKed and XDELed only after it ran, a vanished batch's answer is dropped,
 * and a device failure hands the entry back until its last attempt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "redis_fixture.h"
#include "worker/worker_int.h"

static redis_fixture R;

typedef struct {
    wk_config cfg;
    wk w;
    job jobs[2];
} world;

/* A worker with model "m" read from stream t:q (group workers), device type L4 at $3.60/h. */
static void world_init(world *x) {
    memset(x, 0, sizeof *x);
    x->cfg.device_type = "L4";
    x->cfg.usd_per_hour = 3.6;
    x->cfg.max_attempts = 3;
    wk *w = &x->w;
    w->cfg = &x->cfg;
    w->r = R.r;
    snprintf(w->prefix, sizeof w->prefix, "t:");
    snprintf(w->me, sizeof w->me, "w1");
    snprintf(w->events, sizeof w->events, "t:events");
    w->mod[0].state = SLOT_ON;
    snprintf(w->mod[0].name, sizeof w->mod[0].name, "m");
    w->mod[0].jobs = x->jobs;
    w->mod[0].n_jobs = 2;
    w->st[0].state = SLOT_ON;
    w->st[0].m = 0;
    snprintf(w->st[0].key, sizeof w->st[0].key, "t:q");
    md_err e = {0};
    assert_int_equal(q_script_load(R.r, q_complete_lua, w->sha, &e), 0); /* as worker.c does */
}

static void world_free(world *x) {
    for (int i = 0; i < x->w.n_ans; i++)
        free(x->w.ans[i].line);
    free(x->w.ans);
}

/* A new entry of t:q delivered to this worker: its id in id. */
static void deliver(char *id) {
    freeReplyObject(rfx_cmd(&R, "XADD t:q * x 1"));
    redisReply *r = rfx_cmd(&R, "XREADGROUP GROUP %s w1 COUNT 1 STREAMS t:q >", Q_GROUP);
    assert_int_equal(r->type, REDIS_REPLY_ARRAY);
    snprintf(id, ENTRY_ID_MAX, "%s", r->element[0]->element[1]->element[0]->element[0]->str);
    freeReplyObject(r);
}

/* The i-th output line of batch b, parsed. */
static json_t *out_line(const char *b, int i) {
    redisReply *r = rfx_cmd(&R, "XRANGE t:{%s}:out - +", b);
    assert_true((size_t)i < r->elements);
    redisReply *f = r->element[i]->element[1];
    json_t *j = NULL;
    for (size_t k = 0; k + 1 < f->elements; k += 2)
        if (!strcmp(f->element[k]->str, "line"))
            j = json_loads(f->element[k + 1]->str, 0, NULL);
    freeReplyObject(r);
    assert_non_null(j);
    return j;
}

static int setup(void **st) {
    (void)st;
    if (rfx_start(&R))
        return -1;
    freeReplyObject(rfx_cmd(&R, "FLUSHALL"));
    freeReplyObject(rfx_cmd(&R, "XGROUP CREATE t:q %s 0 MKSTREAM", Q_GROUP));
    return 0;
}

static int teardown(void **st) {
    (void)st;
    rfx_stop(&R);
    return 0;
}

static void error_answer_is_written_once_then_acked_and_deleted(void **st) {
    (void)st;
    world x;
    world_init(&x);
    wk *w = &x.w;
    freeReplyObject(rfx_cmd(&R, "HSET t:{b1}:meta status in_progress total 2"));
    char id[ENTRY_ID_MAX];
    deliver(id);
    wk_answer_error(w, 0, id, "b1", "c1", "expired", "too late", 1500, 2);
    assert_int_equal(w->n_ans, 1);
    assert_int_equal(w->n_failed, 1);
    wk_flush(w);
    assert_int_equal(w->n_ans, 0);
    assert_false(w->broken);
    assert_int_equal(rfx_int(&R, "XLEN t:{b1}:out"), 1);
    assert_int_equal(rfx_int(&R, "HGET t:{b1}:meta failed"), 1);
    assert_int_equal(rfx_int(&R, "XLEN t:q"), 0); /* XDEL after the XACK */
    json_t *j = out_line("b1", 0);
    assert_string_equal(json_string_value(json_object_get(j, "custom_id")), "c1");
    assert_true(json_is_null(json_object_get(j, "response")));
    json_t *err = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(err, "code")), "expired");
    assert_string_equal(json_string_value(json_object_get(err, "message")), "too late");
    json_t *md = json_object_get(j, "medley");
    assert_string_equal(json_string_value(json_object_get(md, "worker")), "w1");
    assert_string_equal(json_string_value(json_array_get(json_object_get(md, "device_types"), 0)),
                        "L4");
    assert_int_equal(json_integer_value(json_object_get(md, "attempt")), 2);
    json_decref(j);
    /* a second answer for the same custom_id (a redelivery) changes nothing */
    deliver(id);
    wk_answer_error(w, 0, id, "b1", "c1", "server_error", "again", 0, 3);
    wk_flush(w);
    assert_int_equal(w->n_ans, 0);
    assert_int_equal(rfx_int(&R, "XLEN t:{b1}:out"), 1);
    assert_int_equal(rfx_int(&R, "HGET t:{b1}:meta failed"), 1);
    assert_int_equal(rfx_int(&R, "XLEN t:q"), 0);
    world_free(&x);
}

static void finished_request_becomes_a_chat_completion_line(void **st) {
    (void)st;
    world x;
    world_init(&x);
    wk *w = &x.w;
    freeReplyObject(rfx_cmd(&R, "HSET t:{b2}:meta status in_progress total 1"));
    job *j = &x.jobs[1];
    j->used = 1;
    j->s = 0;
    j->chat = 1;
    j->attempt = 1;
    j->share_s = 10; /* of $3.60/h: $0.01 */
    deliver(j->id);
    snprintf(j->batch, sizeof j->batch, "b2");
    snprintf(j->custom_id, sizeof j->custom_id, "c2");
    w->live = 1;
    wk_result res = {
        .text = "hi there", .finish_reason = "stop", .prompt_tokens = 3, .completion_tokens = 2};
    wk_on_done(w, j, &res);
    assert_false(j->used);
    assert_int_equal(w->live, 0);
    assert_int_equal(w->n_ok, 1);
    assert_int_equal(w->n_tokens, 2);
    wk_flush(w);
    assert_int_equal(w->n_ans, 0);
    json_t *l = out_line("b2", 0);
    json_t *resp = json_object_get(l, "response");
    assert_int_equal(json_integer_value(json_object_get(resp, "status_code")), 200);
    json_t *body = json_object_get(resp, "body");
    assert_string_equal(json_string_value(json_object_get(body, "object")), "chat.completion");
    assert_string_equal(json_string_value(json_object_get(body, "model")), "m");
    json_t *c0 = json_array_get(json_object_get(body, "choices"), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c0, "message"), "content")), "hi there");
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(body, "usage"), "total_tokens")), 5);
    double cost = json_real_value(json_object_get(json_object_get(l, "medley"), "cost_usd"));
    assert_true(cost > 0.00999 && cost < 0.01001);
    json_decref(l);
    /* its only line answered: the script finished the batch */
    redisReply *s = rfx_cmd(&R, "HGET t:{b2}:meta status");
    assert_string_equal(s->str, "completed");
    freeReplyObject(s);
    world_free(&x);
}

static void answer_of_a_vanished_batch_is_dropped_and_acked(void **st) {
    (void)st;
    world x;
    world_init(&x);
    wk *w = &x.w;
    char id[ENTRY_ID_MAX];
    deliver(id);
    q_verr ve = {.status = 400};
    snprintf(ve.code, sizeof ve.code, "invalid_value");
    snprintf(ve.message, sizeof ve.message, "bad");
    wk_answer_invalid(w, 0, id, "gone", "c3", &ve, 0, 1);
    wk_flush(w);
    assert_int_equal(w->n_ans, 0);
    assert_int_equal(rfx_int(&R, "EXISTS t:{gone}:out"), 0);
    redisReply *p = rfx_cmd(&R, "XPENDING t:q %s", Q_GROUP);
    assert_int_equal(p->element[0]->integer, 0);
    freeReplyObject(p);
    world_free(&x);
}

static void device_failure_hands_back_until_the_last_attempt(void **st) {
    (void)st;
    world x;
    world_init(&x);
    wk *w = &x.w;
    job *j = &x.jobs[0];
    j->used = 1;
    j->attempt = 1;
    snprintf(j->id, sizeof j->id, "1-1");
    snprintf(j->batch, sizeof j->batch, "b4");
    w->live = 1;
    wk_result res = {.device_lost = 1, .error = "CUDA error"};
    wk_on_done(w, j, &res);
    assert_true(j->used); /* held until wk_hand_back gives it to others */
    assert_true(j->handback);
    assert_int_equal(w->n_ans, 0);
    j->handback = 0;
    j->attempt = 3; /* the last delivery: answered with the device's failure */
    wk_on_done(w, j, &res);
    assert_false(j->used);
    assert_int_equal(w->n_ans, 1);
    json_t *l = json_loads(w->ans[0].line, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(l, "error"), "message"));
    assert_non_null(strstr(msg, "the device failed on the last of 3 attempts: CUDA error"));
    json_decref(l);
    world_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(error_answer_is_written_once_then_acked_and_deleted),
        cmocka_unit_test(finished_request_becomes_a_chat_completion_line),
        cmocka_unit_test(answer_of_a_vanished_batch_is_dropped_and_acked),
        cmocka_unit_test(device_failure_hands_back_until_the_last_attempt),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
