/* test_wire_fuzz.c — mutated stage link frames (engine/shard/wire.h), first to the decoders, then
 * to a live md_stage_serve.
 *
 * Decoders: valid HELLO, READY, RUN (first and inner stage), RESULT, ERROR and CHALLENGE
 * frames get bit
 * flips, byte changes, int32 fields set to edge values, truncation, inserted and deleted
 * bytes, half of them with their header re-sealed (length and CRCs recomputed) so the
 * mutation reaches the payload decoders instead of stopping at a CRC (a READY is signed
 * again before its decoder, so the mutation reaches the fields behind its MAC). Each goes the way a
 * receiver takes it (header, limits, CRC, decoder) and straight into every decoder; every
 * buffer is a malloc of its exact size (ASan sees a read past it). A decoder must refuse
 * with a message or give a result within its limits.
 *
 * Live: a server (synthetic:tiny, stage thread of the test) gets, after its CHALLENGE, random
 * bytes, mutated HELLOs (half of them signed again over the mutation, so they reach the
 * HELLO decoder), HELLOs asking for what it cannot serve, then mutated RUNs re-sealed so they
 * reach md_batch_check and, when they pass it, md_stage_run; a head that stops mid-frame and
 * one that never says HELLO. Each connection must end with a frame or a close within the
 * server's timeouts, never a hang; afterwards the server still serves a real head, with
 * answers bit for bit a local stage's.
 *
 * MEDLEY_FUZZ_ITERS scales the rounds (default 4000 per frame type, a tenth of that live);
 * the seed is fixed so a failure reproduces; MEDLEY_FUZZ_SEED overrides it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/util.h"
#include "e2e/stage_test_util.h"
#include "engine/shard/link.h"
#include "engine/shard/wire.h"
#include "engine/shard/wire_io.h"
#include "fuzz/fuzz_util.h"

/* The fixed handshake the decoder fuzz signs its frames with. */
static md_wire_auth *fz_auth(void) {
    static md_wire_auth a;
    a.secret = test_secret();
    memset(a.stage_nonce, 0x33, sizeof a.stage_nonce);
    memset(a.head_nonce, 0x44, sizeof a.head_nonce);
    return &a;
}

static int seed_rng(void **state) {
    (void)state;
    fuzz_seed(0x3d5a6e1f);
    return 0;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Mutate the frame f of *n bytes (room for cap) in place. */
static void mutate(uint8_t *f, size_t *n, size_t cap) {
    static const uint32_t edges[] = {0,   1,          2,          3,          4,          7,    8,
                                     15,  16,         63,         64,         255,        256,  511,
                                     512, 0x7fffffff, 0x80000000, 0xffffffff, 0xfffffffe, 65536};
    int rounds = 1 + (int)fuzz_below(3);
    for (int r = 0; r < rounds; r++) {
        switch (fuzz_below(6)) {
        case 0: /* bit flips */
            for (int k = 1 + (int)fuzz_below(4); k > 0 && *n; k--) {
                size_t bit = fuzz_below(*n * 8);
                f[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            }
            break;
        case 1:
            if (*n)
                f[fuzz_below(*n)] = (uint8_t)fuzz_rnd();
            break;
        case 2: /* an int32 field (payload offsets are 4-aligned) to an edge value, or +-1 */
            if (*n >= MD_WIRE_HDR + 4) {
                size_t off = MD_WIRE_HDR + 4 * fuzz_below((*n - MD_WIRE_HDR) / 4);
                uint32_t v = edges[fuzz_below(sizeof edges / sizeof edges[0])];
                if (fuzz_rnd() & 1) {
                    v = (uint32_t)f[off] | (uint32_t)f[off + 1] << 8 | (uint32_t)f[off + 2] << 16 |
                        (uint32_t)f[off + 3] << 24;
                    v += fuzz_rnd() & 1 ? 1u : 0xffffffffu;
                }
                put32(f + off, v);
            }
            break;
        case 3: *n = fuzz_below(*n + 1); break;
        case 4: { /* insert up to 8 bytes */
            size_t k = 1 + fuzz_below(8), at = fuzz_below(*n + 1);
            if (*n + k <= cap)
                fuzz_insert(f, n, at, k);
            break;
        }
        default: { /* delete a range */
            size_t at = fuzz_below(*n + 1), k = fuzz_below(*n - at + 1);
            fuzz_delete(f, n, at, k);
        }
        }
    }
}

/* Recompute the header's length and both CRCs, keeping its type and sequence number. */
static void reseal(uint8_t *f, size_t n) {
    if (n < MD_WIRE_HDR)
        return;
    int type = f[6] | f[7] << 8;
    uint32_t seq =
        (uint32_t)f[20] | (uint32_t)f[21] << 8 | (uint32_t)f[22] << 16 | (uint32_t)f[23] << 24;
    md_wire_hdr_put(f, type, seq, n - MD_WIRE_HDR, md_wire_crc(f + MD_WIRE_HDR, n - MD_WIRE_HDR));
}

/* Every decoder on payload p of n bytes (an exact-size copy is made); results checked. */
static void decode_all(const uint8_t *src, size_t n, const md_wire_limits *l) {
    uint8_t *p = fuzz_copy(src, n);
    assert_non_null(p);
    md_err e = {0};
    md_stage_config c;
    int nv, ne;
    if (md_wire_get_hello(p, n, &c, &nv, &ne, &e) == 0) {
        assert_true(c.lo >= 0 && c.lo < c.hi && c.model[0]);
        assert_true(memchr(c.model, 0, sizeof c.model) && memchr(c.device, 0, sizeof c.device));
        assert_true(c.max_tokens >= 1 && c.max_seqs >= 1 && c.max_blocks >= 1 && nv >= 0);
    } else {
        assert_true(e.code < 0 && e.msg[0]);
    }
    md_wire_ready r;
    if (n >= MD_STAGE_MAC) { /* signed again, so the fields behind the MAC are decoded */
        uint8_t *q = fuzz_copy(src, n);
        assert_non_null(q);
        assert_int_equal(md_stage_mac(test_secret(), "MDST READY v2", fz_auth()->head_nonce,
                                      fz_auth()->stage_nonce, q, n - MD_STAGE_MAC,
                                      q + n - MD_STAGE_MAC),
                         0);
        if (md_wire_get_ready(q, n, fz_auth(), &r, &e) == 0)
            assert_true(memchr(r.describe, 0, sizeof r.describe) && r.lo < r.hi &&
                        r.hi <= r.n_layer && r.idle_ms >= 1);
        else
            assert_true(e.msg[0]);
        free(q);
    }
    uint8_t nonce[MD_STAGE_NONCE];
    if (md_wire_get_challenge(p, n, nonce, &e) == 0)
        assert_true(n == 4 + MD_STAGE_NONCE);
    md_wire_auth a = *fz_auth();
    if (md_wire_hello_verify(p, n, &a, &e) == 0)
        assert_true(n >= MD_STAGE_NONCE + MD_STAGE_MAC);
    md_batch b;
    const float *h;
    if (md_wire_get_run(p, n, l, &b, &h, &e) == 0) {
        assert_true(b.n_tokens >= 1 && b.n_tokens <= l->max_tokens);
        assert_true(b.n_seqs >= 1 && b.n_seqs <= l->max_seqs);
        assert_true(b.n_logits >= 0 && b.n_logits <= l->max_seqs);
        assert_true(b.max_blocks >= 1 && b.max_blocks <= l->max_blocks);
        size_t T = (size_t)b.n_tokens, S = (size_t)b.n_seqs;
        fuzz_touch(b.tokens, 4 * T);
        fuzz_touch(b.tok_seq, 4 * T);
        fuzz_touch(b.tok_pos, 4 * T);
        fuzz_touch(b.slot, 4 * T);
        fuzz_touch(b.seq_len, 4 * S);
        fuzz_touch(b.block_table, 4 * S * (size_t)b.max_blocks);
        fuzz_touch(b.logit_rows, 4 * (size_t)b.n_logits);
        if (l->hidden)
            fuzz_touch(h, 4 * T * (size_t)l->hidden);
        else
            assert_null(h);
    } else {
        assert_true(e.msg[0]);
    }
    int code;
    char msg[128];
    if (md_wire_get_error(p, n, &code, msg, sizeof msg, &e) == 0)
        assert_true(code < 0 && strlen(msg) < sizeof msg);
    float out[8];
    if (md_wire_get_result(p, n, out, n / 4 <= 8 ? n / 4 : 8, &e) == 0)
        assert_true(n % 4 == 0 && n <= 32);
    free(p);
}

/* Frame f of n bytes as a receiver takes it: header, type and size limits, CRC, decoder. */
static void receive(const uint8_t *f, size_t n, const md_wire_limits *l) {
    if (n < MD_WIRE_HDR)
        return;
    uint8_t hdr[MD_WIRE_HDR];
    memcpy(hdr, f, sizeof hdr);
    md_wire_hdr h;
    md_err e = {0};
    if (md_wire_hdr_get(hdr, &h, &e) || md_wire_hdr_check(&h, 0xfe, l->max_payload, &e)) {
        assert_true(e.msg[0]);
        return;
    }
    if (h.len != n - MD_WIRE_HDR) /* a socket would wait for more, or read the rest later */
        return;
    uint8_t *p = fuzz_copy(f + MD_WIRE_HDR, (size_t)h.len);
    assert_non_null(p);
    if (md_wire_payload_check(&h, p, &e) == 0)
        decode_all(p, (size_t)h.len, l);
    free(p);
}

/* The valid frames the mutations start from, for a stage [lo, lo + 1) of a model of n_embd 8
 * and n_vocab 100. */
static void seed_frames(md_wire_buf *fr, int lo, md_wire_limits *l) {
    static const int32_t tok[3] = {1, 2, 3}, seq[3] = {0, 0, 1}, pos[3] = {0, 1, 0},
                         slot[3] = {0, 1, 16}, len[2] = {2, 1}, table[4] = {0, 1, 1, 2},
                         rows[2] = {1, 2};
    static const float hidden[3 * 8] = {1, 2, 3};
    md_batch b = {.n_tokens = 3,
                  .n_seqs = 2,
                  .tokens = tok,
                  .tok_seq = seq,
                  .tok_pos = pos,
                  .slot = slot,
                  .seq_len = len,
                  .block_table = table,
                  .max_blocks = 2,
                  .block_tokens = 16,
                  .logit_rows = rows,
                  .n_logits = 2};
    md_stage_config c = tiny_config(lo, lo + 1);
    c.max_tokens = 4;
    c.max_seqs = 2;
    c.max_blocks = 2;
    md_err e = {0};
    assert_int_equal(md_wire_limits_for(&c, 8, 100, l, &e), 0);
    md_wire_ready r = {.model_hash = 9,
                       .lo = lo,
                       .hi = lo + 1,
                       .n_layer = 2,
                       .n_embd = 8,
                       .n_vocab = 100,
                       .idle_ms = 60000};
    snprintf(r.describe, sizeof r.describe, "layers %d-%d on cpu", lo, lo);
    assert_int_equal(md_wire_put_hello(&fr[0], &c, 100, 8, fz_auth(), &e), 0);
    assert_int_equal(md_wire_put_ready(&fr[1], &r, fz_auth(), &e), 0);
    assert_int_equal(md_wire_put_run(&fr[2], 7, &b, lo ? hidden : NULL, l->hidden, &e), 0);
    float *o = md_wire_result_begin(&fr[3], 5, &e);
    for (int i = 0; i < 5; i++)
        o[i] = (float)i;
    md_wire_result_end(&fr[3], 7);
    assert_int_equal(md_wire_put_error(&fr[4], 7, MD_EINVAL, "token 3 is 900", &e), 0);
    assert_int_equal(md_wire_put_challenge(&fr[5], fz_auth()->stage_nonce, &e), 0);
}

static void test_mutated_frames_never_decode_into_nonsense(void **state) {
    long n_iter = fuzz_iters();
    for (int lo = 0; lo <= 1; lo++) {
        md_wire_buf fr[6] = {{0}};
        md_wire_limits l;
        seed_frames(fr, lo, &l);
        for (int k = 0; k < 6; k++) {
            for (long it = 0; it < n_iter; it++) {
                size_t cap = fr[k].len + 64, n = fr[k].len;
                uint8_t *f = malloc(cap);
                memcpy(f, fr[k].p, n);
                mutate(f, &n, cap);
                if (fuzz_rnd() & 1)
                    reseal(f, n);
                uint8_t *exact = fuzz_copy(f, n);
                assert_non_null(exact);
                receive(exact, n, &l);
                if (n >= MD_WIRE_HDR)
                    decode_all(exact + MD_WIRE_HDR, n - MD_WIRE_HDR, &l);
                free(exact);
                free(f);
            }
        }
        for (int k = 0; k < 6; k++)
            md_wire_buf_free(&fr[k]);
    }
}

/* What a fuzzing head sends once it has the server's CHALLENGE (a->stage_nonce set, a fresh
 * a->head_nonce): into out. */
typedef void (*build_fn)(md_wire_buf *out, const md_wire_auth *a, void *ctx);

/* One connection to the live server: take its CHALLENGE, send what build makes of it (in one
 * piece), shut the sending side, read what comes back until the server closes. Every frame
 * must be well formed; returns the type of the last one (0: none). */
static int converse(int port, build_fn build, void *ctx, uint64_t max_payload, md_wire_buf *in) {
    int fd;
    md_err e = {0};
    assert_int_equal(md_wire_connect("127.0.0.1", port, 2000, &fd, &e), 0);
    md_wire_hdr h;
    md_wire_auth a = {.secret = test_secret()};
    if (md_wire_recv_frame(fd, 1u << MD_WIRE_CHALLENGE, 0, md_wire_deadline(5000), NULL, &h, in,
                           NULL, &e) ||
        md_wire_get_challenge(in->p, in->len, a.stage_nonce, &e))
        fail_msg("the server's CHALLENGE: %s", e.msg);
    assert_int_equal(md_stage_nonce(a.head_nonce, &e), 0);
    md_wire_buf f = {0};
    build(&f, &a, ctx);
    if (f.len && md_wire_send(fd, f.p, f.len, md_wire_deadline(2000), &e))
        assert_non_null(strstr(e.msg, "failed")); /* the server may close before taking all */
    md_wire_buf_free(&f);
    shutdown(fd, SHUT_WR);
    int last = 0;
    for (;;) {
        int eof = 0;
        int rc = md_wire_recv_frame(fd, 0x3e, max_payload, md_wire_deadline(5000), NULL, &h, in,
                                    &eof, &e);
        if (rc) {
            if (!eof && !strstr(e.msg, "closed") && !strstr(e.msg, "reset"))
                fail_msg("answer of the server: %s", e.msg);
            break;
        }
        last = h.type;
    }
    close(fd);
    return last;
}

/* HELLO for c signed under a then, when run is not NULL, a RUN frame: into out. */
static void hello_then(md_wire_buf *out, const md_stage_config *c, const md_wire_auth *a,
                       const md_wire_buf *run) {
    md_err e = {0};
    assert_int_equal(md_wire_put_hello(out, c, 512, 128, a, &e), 0);
    if (run) {
        assert_int_equal(md_wire_buf_reserve(out, out->len + run->len, &e), 0);
        memcpy(out->p + out->len, run->p, run->len);
        out->len += run->len;
    }
}

/* The builders of the live fuzz. */
typedef struct {
    const md_stage_config *c;
    const md_wire_buf *run;
    size_t n_random; /* random bytes: how many */
    int mutate, resign;
} live_case;

static void build_case(md_wire_buf *out, const md_wire_auth *a, void *ctx) {
    live_case *k = ctx;
    md_err e = {0};
    if (!k->c) {
        assert_int_equal(md_wire_buf_reserve(out, k->n_random + 1, &e), 0);
        for (size_t i = 0; i < k->n_random; i++)
            out->p[i] = (uint8_t)fuzz_rnd();
        out->len = k->n_random;
        return;
    }
    hello_then(out, k->c, a, k->run);
    if (!k->mutate)
        return;
    size_t n = out->len;
    assert_int_equal(md_wire_buf_reserve(out, n + 64, &e), 0);
    mutate(out->p, &n, out->cap); /* not resealed unless resigned: random sizes are not asked */
    out->len = n;
    if (k->resign && n >= MD_WIRE_HDR + MD_STAGE_MAC) {
        uint8_t *p = out->p + MD_WIRE_HDR;
        size_t len = n - MD_WIRE_HDR;
        assert_int_equal(md_stage_mac(a->secret, "MDST HELLO v2", a->stage_nonce, NULL, p,
                                      len - MD_STAGE_MAC, p + len - MD_STAGE_MAC),
                         0);
        reseal(out->p, n);
    }
}

static void test_live_server_survives_hostile_heads(void **state) {
    test_server s;
    int port = test_server_start(&s, 300, 300);
    assert_true(port > 0);
    long n_iter = fuzz_iters() / 10;
    md_err e = {0};
    uint64_t hash;
    assert_int_equal(md_model_hash(TINY, &hash, &e), 0);
    md_wire_buf f = {0}, in = {0}, run = {0};
    md_wire_limits lim[2];
    md_stage_config cfg[2] = {tiny_config(0, 1), tiny_config(1, 2)};
    for (int k = 0; k < 2; k++) {
        cfg[k].model_hash = hash;
        assert_int_equal(md_wire_limits_for(&cfg[k], 128, 512, &lim[k], &e), 0);
    }
    /* random bytes, and mutated HELLOs (one in two signed again over the mutation) */
    for (long it = 0; it < n_iter; it++) {
        live_case k = {.n_random = fuzz_below(300)};
        if (it % 2 == 0)
            k = (live_case){.c = &cfg[it % 4 / 2], .mutate = 1, .resign = it % 4 == 0};
        int t = converse(port, build_case, &k, lim[1].max_payload, &in);
        assert_true(t == 0 || t == MD_WIRE_ERROR || t == MD_WIRE_READY);
    }
    /* HELLOs asking for what the server cannot serve: each answered with an ERROR */
    for (int k = 0; k < 7; k++) {
        md_stage_config c = cfg[0];
        switch (k) {
        case 0: c.model_hash ^= 1; break;
        case 1: c.hi = 3; break;
        case 2: c.n_ctx = 4096; break;  /* over the model's 512 */
        case 3: c.n_slots = 100; break; /* not whole blocks */
        case 4: c.tp = 3; break;        /* 4 heads do not split 3 ways */
        case 5: snprintf(c.model, sizeof c.model, "synthetic:nonesuch"); break;
        default: snprintf(c.model, sizeof c.model, "/nonexistent/model.gguf");
        }
        live_case lc = {.c = &c};
        int t = converse(port, build_case, &lc, 0, &in);
        if (t != MD_WIRE_ERROR)
            fail_msg("HELLO %d answered with frame type %d", k, t);
        assert_true(in.len > 8);
    }
    /* mutated RUNs after a good HELLO, resealed: they reach md_batch_check and, when they
     * pass it, the stage */
    int n_result = 0, n_error = 0;
    for (long it = 0; it < n_iter; it++) {
        int k = (int)(it % 2);
        tiny_batch tb;
        static const int start[2] = {0, 3};
        int n_new[2] = {1 + (int)fuzz_below(8), 1 + (int)fuzz_below(4)};
        tiny_batch_make(&tb, 2, start, n_new, (int)it);
        static float hidden[16 * 128];
        for (int i = 0; i < 16 * 128; i++)
            hidden[i] = (float)fuzz_below(1000) / 500.0f - 1.0f;
        assert_int_equal(md_wire_put_run(&run, 1, &tb.b, k ? hidden : NULL, lim[k].hidden, &e), 0);
        size_t n = run.len;
        assert_int_equal(md_wire_buf_reserve(&run, n + 64, &e), 0);
        if (it % 8) { /* one in eight goes as is */
            mutate(run.p, &n, run.cap);
            reseal(run.p, n);
        }
        run.len = n;
        live_case lc = {.c = &cfg[k], .run = &run};
        int t = converse(port, build_case, &lc, lim[k].max_payload, &in);
        /* READY last: no RUN came (cut to nothing), or the server closed on a header it
         * refused with the payload unread, and the reset overtook its ERROR */
        assert_true(t == MD_WIRE_RESULT || t == MD_WIRE_ERROR || t == MD_WIRE_READY);
        n_result += t == MD_WIRE_RESULT;
        n_error += t == MD_WIRE_ERROR;
    }
    print_message("live: %d results, %d errors from %ld mutated RUNs\n", n_result, n_error, n_iter);
    assert_true(n_result > 0 && n_error > 0);

    /* a head that stops mid-frame, and one that never says HELLO: dropped after the
     * server's 300 ms, and the server is free again */
    for (int k = 0; k < 2; k++) {
        int fd;
        assert_int_equal(md_wire_connect("127.0.0.1", port, 2000, &fd, &e), 0);
        md_wire_hdr h;
        int eof;
        md_wire_auth a = {.secret = test_secret()};
        assert_int_equal(md_wire_recv_frame(fd, 1u << MD_WIRE_CHALLENGE, 0, md_wire_deadline(2000),
                                            NULL, &h, &in, &eof, &e),
                         0);
        assert_int_equal(md_wire_get_challenge(in.p, in.len, a.stage_nonce, &e), 0);
        if (k == 0) {
            hello_then(&f, &cfg[0], &a, NULL);
            assert_int_equal(md_wire_send(fd, f.p, f.len - 3, md_wire_deadline(2000), &e), 0);
        }
        uint64_t t0 = md_mono_ns();
        int rc = md_wire_recv_frame(fd, 0x3e, 0, md_wire_deadline(5000), NULL, &h, &in, &eof, &e);
        uint64_t ms = (md_mono_ns() - t0) / 1000000;
        assert_true(rc == 0 && h.type == MD_WIRE_ERROR); /* "no signed HELLO within ..." */
        assert_true(ms >= 250 && ms < 3000);
        close(fd);
    }

    /* still serving: a real head gets a stage's answers, bit for bit a local one's */
    md_link *r, *l;
    static float a[TINY_SEQS * 512], b[TINY_SEQS * 512], h0[16 * 128];
    md_link_tcp_opts lo = test_link_opts(5000);
    if (md_link_tcp_open("127.0.0.1", port, &cfg[1], &lo, &r, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(md_link_local_open(&cfg[1], &l, &e), 0);
    tiny_batch tb;
    static const int start[2] = {0, 0}, n_new[2] = {4, 6};
    tiny_batch_make(&tb, 2, start, n_new, 1);
    for (int i = 0; i < 16 * 128; i++)
        h0[i] = (float)(i % 17) / 8.0f - 1.0f;
    assert_int_equal(l->ops->run(l, &tb.b, h0, a, &e), 0);
    if (r->ops->run(r, &tb.b, h0, b, &e))
        fail_msg("%s", e.msg);
    assert_memory_equal(a, b, 2 * 512 * sizeof(float));
    md_link_free(r);
    md_link_free(l);
    assert_int_equal(test_server_stop(&s), 0);
    md_wire_buf_free(&f);
    md_wire_buf_free(&in);
    md_wire_buf_free(&run);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_mutated_frames_never_decode_into_nonsense, seed_rng),
        cmocka_unit_test_setup(test_live_server_survives_hostile_heads, seed_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
