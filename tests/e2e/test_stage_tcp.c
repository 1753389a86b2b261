/* test_stage_tcp.c — a pipeline stage over TCP (engine/shard/link_tcp.c against
 * engine/shard/stage_server.c on 127.0.0.1) gives bit for bit what the same stage gives in the
 * head's process (md_link_local_open), for a first stage (hidden states out) and a last one
 * (hidden states in, logits out), over prefill and decode steps. Failures are reported, not
 * waited on: a server that stops mid-conversation, a stage that goes silent (the link's
 * timeout), one that closes mid-answer, answers another step or sends garbage; each names
 * the stage and breaks the link, whose next run fails at once. A head with another model
 * hash is refused with both hashes; a second head is turned away while one is served; the
 * loaded stage is kept for the next head asking for the same; an idle head keeps its stage
 * by its pings, a silent one is dropped at --io-timeout-ms. synthetic:tiny only, so it runs
 * with the unit tests (also under ASan). The stage's own refusals of strangers (no secret, a
 * model outside --model, idle and slowloris connections) are tests/integration/stage_guard.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util.h"
#include "e2e/stage_test_util.h"
#include "engine/shard/link.h"
#include "engine/shard/wire.h"
#include "engine/shard/wire_io.h"

#define LINK_MS 5000

static void open_tcp(int port, const md_stage_config *c, int timeout_ms, md_link **l) {
    md_err e = {0};
    md_link_tcp_opts o = test_link_opts(timeout_ms);
    if (md_link_tcp_open("127.0.0.1", port, c, &o, l, &e))
        fail_msg("%s", e.msg);
}

static void test_tcp_stages_match_local_bit_for_bit(void **state) {
    test_server s0, s1;
    int p0 = test_server_start(&s0, 2000, 5000), p1 = test_server_start(&s1, 2000, 5000);
    assert_true(p0 > 0 && p1 > 0);
    md_stage_config c0 = tiny_config(0, 1), c1 = tiny_config(1, 2);
    md_err e = {0};
    assert_int_equal(md_model_hash(TINY, &c0.model_hash, &e), 0);
    c1.model_hash = c0.model_hash;
    md_link *l0, *l1, *r0, *r1;
    assert_int_equal(md_link_local_open(&c0, &l0, &e), 0);
    assert_int_equal(md_link_local_open(&c1, &l1, &e), 0);
    open_tcp(p0, &c0, LINK_MS, &r0);
    open_tcp(p1, &c1, LINK_MS, &r1);
    assert_string_equal(r0->ops->kind, "tcp");
    char want[64];
    snprintf(want, sizeof want, "tcp://127.0.0.1:%d layers 0-0 on ", p0);
    if (strncmp(r0->ops->describe(r0), want, strlen(want)))
        fail_msg("describe: '%s', expected it to start with '%s'", r0->ops->describe(r0), want);

    enum { EMBD = 128, VOCAB = 512 };
    static float hl[16 * EMBD], hr[16 * EMBD], ll[TINY_SEQS * VOCAB], lr[TINY_SEQS * VOCAB];
    /* prefill of 2 sequences; decode; a third sequence's prefill beside two decodes */
    static const int n_seq[3] = {2, 2, 3}, start[3][3] = {{0, 0}, {5, 3}, {6, 4, 0}},
                     n_new[3][3] = {{5, 3}, {1, 1}, {1, 1, 7}};
    for (int step = 0; step < 3; step++) {
        tiny_batch tb;
        tiny_batch_make(&tb, n_seq[step], start[step], n_new[step], 0);
        size_t nh = (size_t)tb.b.n_tokens * EMBD, nl = (size_t)tb.b.n_logits * VOCAB;
        memset(hr, 0xff, sizeof hr);
        memset(lr, 0xff, sizeof lr);
        assert_int_equal(l0->ops->run(l0, &tb.b, NULL, hl, &e), 0);
        if (r0->ops->run(r0, &tb.b, NULL, hr, &e))
            fail_msg("step %d, stage 0: %s", step, e.msg);
        assert_memory_equal(hl, hr, nh * sizeof(float));
        assert_int_equal(l1->ops->run(l1, &tb.b, hl, ll, &e), 0);
        if (r1->ops->run(r1, &tb.b, hl, lr, &e))
            fail_msg("step %d, stage 1: %s", step, e.msg);
        assert_memory_equal(ll, lr, nl * sizeof(float));
        double sum = 0;
        for (size_t i = 0; i < nl; i++)
            sum += lr[i] * lr[i];
        assert_true(sum > 0); /* real logits, not a zeroed buffer */
    }
    md_link_free(r0);
    md_link_free(r1);
    md_link_free(l0);
    md_link_free(l1);
    assert_int_equal(test_server_stop(&s0), 0);
    assert_int_equal(test_server_stop(&s1), 0);
}

/* A layout the stage must refuse: the server answers ERROR and closes; the link says why. */
static void test_bad_layout_is_refused_by_the_stage(void **state) {
    test_server s;
    int port = test_server_start(&s, 2000, 5000);
    md_stage_config c = tiny_config(0, 1);
    md_link *r;
    open_tcp(port, &c, LINK_MS, &r);
    tiny_batch tb;
    static const int start[1] = {0}, n_new[1] = {4};
    tiny_batch_make(&tb, 1, start, n_new, 0);
    tb.tokens[2] = 512; /* outside the vocabulary */
    static float h[16 * 128];
    md_err e = {0};
    assert_int_equal(r->ops->run(r, &tb.b, NULL, h, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "layers 0-0"));
    assert_non_null(strstr(e.msg, "token 2 is 512, outside the vocabulary"));
    md_link_free(r);
    assert_int_equal(test_server_stop(&s), 0);
}

static void test_stopped_server_breaks_the_link(void **state) {
    test_server s;
    int port = test_server_start(&s, 2000, 5000);
    md_stage_config c = tiny_config(1, 2);
    md_link *r;
    open_tcp(port, &c, LINK_MS, &r);
    tiny_batch tb;
    static const int start[1] = {0}, n_new[1] = {3};
    tiny_batch_make(&tb, 1, start, n_new, 0);
    static float h[16 * 128], out[512];
    md_err e = {0};
    assert_int_equal(r->ops->run(r, &tb.b, h, out, &e), 0);
    assert_int_equal(test_server_stop(&s), 0); /* closes the head's connection */
    uint64_t t0 = md_mono_ns();
    assert_int_not_equal(r->ops->run(r, &tb.b, h, out, &e), 0);
    assert_true((md_mono_ns() - t0) / 1000000 < LINK_MS / 2);
    char where[64];
    snprintf(where, sizeof where, "tcp://127.0.0.1:%d layers 1-1", port);
    assert_non_null(strstr(e.msg, where));
    /* broken: the next run fails at once with the same reason */
    char first[sizeof e.msg];
    snprintf(first, sizeof first, "%s", e.msg);
    assert_int_not_equal(r->ops->run(r, &tb.b, h, out, &e), 0);
    assert_non_null(strstr(e.msg, "down since an earlier step"));
    assert_non_null(strstr(e.msg, first));
    md_link_free(r);
}

/* A stage that answers HELLO correctly, then misbehaves on the first RUN. */
typedef enum { FAKE_SILENT, FAKE_CLOSE_HALF, FAKE_WRONG_SEQ, FAKE_GARBAGE } fake_kind;

typedef struct {
    fake_kind kind;
    int lfd, port;
    volatile int quit;
    pthread_t th;
} fake_stage;

static void *fake_main(void *arg) {
    fake_stage *f = arg;
    md_err e = {0};
    int fd = -1;
    char peer[64];
    while (md_wire_accept(f->lfd, &fd, peer, sizeof peer, &e) && !f->quit)
        usleep(1000);
    if (fd < 0)
        return NULL;
    md_wire_buf b = {0}, out = {0};
    md_wire_hdr h;
    int eof;
    md_stage_config c;
    int nv, ne;
    md_hparams hp;
    md_wire_auth a = {.secret = test_secret()};
    if (md_stage_nonce(a.stage_nonce, &e) || md_wire_put_challenge(&out, a.stage_nonce, &e) ||
        md_wire_send(fd, out.p, out.len, md_wire_deadline(2000), &e) ||
        md_wire_recv_frame(fd, 1u << MD_WIRE_HELLO, 0, md_wire_deadline(2000), NULL, &h, &b, &eof,
                           &e) ||
        md_wire_hello_verify(b.p, b.len, &a, &e) ||
        md_wire_get_hello(b.p, b.len, &c, &nv, &ne, &e) || md_model_shape(c.model, &hp, &e))
        goto done;
    md_wire_ready r = {.model_hash = c.model_hash,
                       .lo = c.lo,
                       .hi = c.hi,
                       .n_layer = hp.n_layer,
                       .n_embd = hp.n_embd,
                       .n_vocab = hp.n_vocab,
                       .idle_ms = 60000};
    snprintf(r.describe, sizeof r.describe, "layers %d-%d on a fake", c.lo, c.hi - 1);
    md_wire_put_ready(&out, &r, &a, &e);
    md_wire_send(fd, out.p, out.len, md_wire_deadline(2000), &e);
    md_wire_limits l;
    md_wire_limits_for(&c, hp.n_embd, hp.n_vocab, &l, &e);
    if (md_wire_recv_frame(fd, 1u << MD_WIRE_RUN, l.max_payload, md_wire_deadline(2000), NULL, &h,
                           &b, &eof, &e))
        goto done;
    float *res = md_wire_result_begin(&out, (size_t)hp.n_vocab, &e);
    memset(res, 0, (size_t)hp.n_vocab * sizeof(float));
    md_wire_result_end(&out, f->kind == FAKE_WRONG_SEQ ? h.seq + 1 : h.seq);
    if (f->kind == FAKE_CLOSE_HALF)
        md_wire_send(fd, out.p, out.len / 2, md_wire_deadline(2000), &e);
    else if (f->kind == FAKE_WRONG_SEQ)
        md_wire_send(fd, out.p, out.len, md_wire_deadline(2000), &e);
    else if (f->kind == FAKE_GARBAGE) {
        memset(out.p, 0x5a, 64);
        md_wire_send(fd, out.p, 64, md_wire_deadline(2000), &e);
    }
    while (f->kind == FAKE_SILENT && !f->quit)
        usleep(1000);
done:
    close(fd);
    md_wire_buf_free(&b);
    md_wire_buf_free(&out);
    return NULL;
}

static void test_misbehaving_stage_is_reported_within_the_timeout(void **state) {
    static const struct {
        fake_kind kind;
        const char *says;
    } cases[] = {{FAKE_SILENT, "timed out"},
                 {FAKE_CLOSE_HALF, "closed by the peer"},
                 {FAKE_WRONG_SEQ, "answered step 2"},
                 {FAKE_GARBAGE, "magic 0x5a5a5a5a"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_stage f = {.kind = cases[i].kind};
        md_err e = {0};
        assert_int_equal(md_wire_listen("127.0.0.1", 0, &f.lfd, &f.port, &e), 0);
        assert_int_equal(pthread_create(&f.th, NULL, fake_main, &f), 0);
        md_stage_config c = tiny_config(1, 2);
        md_link *r;
        open_tcp(f.port, &c, 300, &r);
        tiny_batch tb;
        static const int start[1] = {0}, n_new[1] = {2};
        tiny_batch_make(&tb, 1, start, n_new, 0);
        static float h[16 * 128], out[512];
        uint64_t t0 = md_mono_ns();
        assert_int_not_equal(r->ops->run(r, &tb.b, h, out, &e), 0);
        uint64_t ms = (md_mono_ns() - t0) / 1000000;
        if (!strstr(e.msg, cases[i].says) || !strstr(e.msg, "layers 1-1") || ms > 2000)
            fail_msg("case %zu after %llu ms: '%s'", i, (unsigned long long)ms, e.msg);
        if (cases[i].kind == FAKE_SILENT)
            assert_true(ms >= 290 && strstr(e.msg, "timeout 300 ms"));
        t0 = md_mono_ns();
        assert_int_not_equal(r->ops->run(r, &tb.b, h, out, &e), 0);
        assert_true((md_mono_ns() - t0) / 1000000 < 50);
        f.quit = 1;
        pthread_join(f.th, NULL);
        close(f.lfd);
        md_link_free(r);
    }
}

static void test_wrong_model_hash_is_refused_naming_both(void **state) {
    test_server s;
    int port = test_server_start(&s, 2000, 5000);
    md_stage_config c = tiny_config(0, 1);
    md_err e = {0};
    uint64_t real;
    assert_int_equal(md_model_hash(TINY, &real, &e), 0);
    c.model_hash = real ^ 0x5555;
    md_link *r = (md_link *)1;
    md_link_tcp_opts o = test_link_opts(LINK_MS);
    assert_int_equal(md_link_tcp_open("127.0.0.1", port, &c, &o, &r, &e), MD_EINVAL);
    assert_null(r);
    char h1[20], h2[20], where[64];
    snprintf(h1, sizeof h1, "%016llx", (unsigned long long)real);
    snprintf(h2, sizeof h2, "%016llx", (unsigned long long)c.model_hash);
    snprintf(where, sizeof where, "stage tcp://127.0.0.1:%d layers 0-0 refused", port);
    if (!strstr(e.msg, h1) || !strstr(e.msg, h2) || !strstr(e.msg, where))
        fail_msg("'%s'", e.msg);
    /* the server goes on serving */
    c.model_hash = real;
    open_tcp(port, &c, LINK_MS, &r);
    md_link_free(r);
    assert_int_equal(test_server_stop(&s), 0);
}

static void test_second_head_is_turned_away(void **state) {
    test_server s;
    int port = test_server_start(&s, 2000, 5000);
    md_stage_config c = tiny_config(0, 1);
    md_link *r1, *r2 = NULL;
    md_err e = {0};
    open_tcp(port, &c, LINK_MS, &r1);
    md_link_tcp_opts o = test_link_opts(LINK_MS);
    assert_int_equal(md_link_tcp_open("127.0.0.1", port, &c, &o, &r2, &e), MD_EIO);
    assert_non_null(strstr(e.msg, "busy serving head 127.0.0.1:"));
    md_link_free(r1);
    open_tcp(port, &c, LINK_MS, &r2); /* once the first has left */
    md_link_free(r2);
    assert_int_equal(test_server_stop(&s), 0);
}

/* A head with nothing to do keeps its stage: the link PINGs at a third of the stage's
 * --io-timeout-ms (300 ms here), so after 1 s idle (over three timeouts) the next step runs
 * on the same connection; and a head the server drops for silence finds out at its next
 * step (a signed HELLO, READY, then nothing: the server closes at io_ms). */
static void test_idle_head_is_kept_by_its_pings_a_silent_one_dropped(void **state) {
    test_server s;
    int port = test_server_start(&s, 2000, 300);
    md_stage_config c = tiny_config(0, 1);
    md_link *r;
    open_tcp(port, &c, LINK_MS, &r);
    tiny_batch tb;
    static const int start[1] = {0}, n_new[1] = {3};
    tiny_batch_make(&tb, 1, start, n_new, 0);
    static float h[16 * 128];
    md_err e = {0};
    assert_int_equal(r->ops->run(r, &tb.b, NULL, h, &e), 0);
    usleep(1000 * 1000);
    if (r->ops->run(r, &tb.b, NULL, h, &e))
        fail_msg("after 1 s idle: %s", e.msg);
    md_link_free(r);

    /* a head that says HELLO and then nothing */
    int fd;
    assert_int_equal(md_wire_connect("127.0.0.1", port, 1000, &fd, &e), 0);
    md_wire_buf b = {0};
    md_wire_hdr hd;
    md_wire_auth a = {.secret = test_secret()};
    assert_int_equal(md_wire_recv_frame(fd, 1u << MD_WIRE_CHALLENGE, 0, md_wire_deadline(1000),
                                        NULL, &hd, &b, NULL, &e),
                     0);
    assert_int_equal(md_wire_get_challenge(b.p, b.len, a.stage_nonce, &e), 0);
    assert_int_equal(md_stage_nonce(a.head_nonce, &e), 0);
    assert_int_equal(md_wire_put_hello(&b, &c, 512, 128, &a, &e), 0);
    assert_int_equal(md_wire_send(fd, b.p, b.len, md_wire_deadline(1000), &e), 0);
    if (md_wire_recv_frame(fd, 1u << MD_WIRE_READY, 0, md_wire_deadline(2000), NULL, &hd, &b, NULL,
                           &e))
        fail_msg("%s", e.msg);
    uint64_t t0 = md_mono_ns();
    int eof = 0;
    /* the server's ERROR saying why, then its close */
    assert_int_equal(md_wire_recv_frame(fd, 1u << MD_WIRE_ERROR, 0, md_wire_deadline(3000), NULL,
                                        &hd, &b, &eof, &e),
                     0);
    uint64_t ms = (md_mono_ns() - t0) / 1000000;
    if (ms < 250 || ms > 1000)
        fail_msg("dropped after %llu ms, expected about 300", (unsigned long long)ms);
    char why[256];
    int code;
    assert_int_equal(md_wire_get_error(b.p, b.len, &code, why, sizeof why, &e), 0);
    assert_non_null(strstr(why, "--io-timeout-ms"));
    close(fd);
    md_wire_buf_free(&b);
    assert_int_equal(test_server_stop(&s), 0);
}

/* stderr into a file while f runs; its text (static). */
static const char *capture_stderr(void (*f)(int), int arg) {
    static char text[16384];
    char path[] = "/tmp/medley-stage-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    f(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    close(fd);
    return text;
}

static void three_heads(int port) {
    md_stage_config c = tiny_config(0, 1);
    md_link *r;
    for (int i = 0; i < 2; i++) {
        open_tcp(port, &c, LINK_MS, &r);
        md_link_free(r);
    }
    c.max_tokens = 8; /* other sizes: another stage */
    open_tcp(port, &c, LINK_MS, &r);
    md_link_free(r);
}

static size_t count(const char *s, const char *what) {
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static void test_loaded_stage_is_kept_for_the_same_request(void **state) {
    test_server s;
    int port = test_server_start(&s, 2000, 5000);
    const char *log = capture_stderr(three_heads, port);
    assert_int_equal(test_server_stop(&s), 0);
    if (count(log, ": loading synthetic:tiny layers 0-0") != 2 || count(log, "already loaded") != 1)
        fail_msg("log:\n%s", log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_stages_match_local_bit_for_bit),
        cmocka_unit_test(test_bad_layout_is_refused_by_the_stage),
        cmocka_unit_test(test_stopped_server_breaks_the_link),
        cmocka_unit_test(test_misbehaving_stage_is_reported_within_the_timeout),
        cmocka_unit_test(test_wrong_model_hash_is_refused_naming_both),
        cmocka_unit_test(test_second_head_is_turned_away),
        cmocka_unit_test(test_loaded_stage_is_kept_for_the_same_request),
        cmocka_unit_test(test_idle_head_is_kept_by_its_pings_a_silent_one_dropped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
