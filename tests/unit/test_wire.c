/* test_wire.c — the stage link's wire format (engine/shard/wire.h) and its socket half
 * (engine/shard/wire_io.h): every frame type survives encode + decode with every field intact;
 * hostile input is refused with a message naming the fault, never read past: random bytes,
 * every truncation of a RUN, every bit flip of a header, a flipped payload bit, another
 * version, lengths over the limits, counts that lie about the payload, a READY for another
 * model or other layers. Over a socketpair: a frame goes through whole, a peer that closes
 * mid-frame or goes silent is reported (within the deadline), a clean close is told apart.
 * Every decoded buffer is a malloc of its exact size, so ASan (scripts/test.sh) sees any
 * read past it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/dtype.h"
#include "common/util.h"
#include "engine/model/model.h"
#include "engine/shard/stage.h"
#include "engine/shard/wire.h"
#include "engine/weights/synth.h"
#include "engine/shard/wire_io.h"

/* The handshake every test frame is signed with: a fixed secret and nonces. */
static md_wire_auth *auth(void) {
    static md_stage_secret sec;
    static md_wire_auth a;
    if (!sec.len) {
        memcpy(sec.key, "a test secret of 32 bytes.......", 32);
        sec.len = 32;
        a.secret = &sec;
        memset(a.stage_nonce, 0x11, sizeof a.stage_nonce);
        memset(a.head_nonce, 0x22, sizeof a.head_nonce);
    }
    return &a;
}

/* A micro-batch of 2 sequences (3 + 2 tokens), 4 blocks of 16 slots per table row. */
typedef struct {
    int32_t tokens[5], tok_seq[5], tok_pos[5], slot[5], seq_len[2], table[8], rows[2];
    float hidden[5 * 8];
    md_batch b;
} batch_fix;

static void batch_fix_init(batch_fix *f) {
    static const int32_t tokens[5] = {7, 8, 9, 10, 11}, seq[5] = {0, 0, 0, 1, 1},
                         pos[5] = {0, 1, 2, 5, 6}, slot[5] = {0, 1, 2, 21, 22}, len[2] = {3, 7},
                         table[8] = {0, 5, 6, 7, 1, 2, 3, 4}, rows[2] = {2, 4};
    memcpy(f->tokens, tokens, sizeof tokens);
    memcpy(f->tok_seq, seq, sizeof seq);
    memcpy(f->tok_pos, pos, sizeof pos);
    memcpy(f->slot, slot, sizeof slot);
    memcpy(f->seq_len, len, sizeof len);
    memcpy(f->table, table, sizeof table);
    memcpy(f->rows, rows, sizeof rows);
    for (int i = 0; i < 40; i++)
        f->hidden[i] = (float)i * 0.25f - 3.0f;
    f->b = (md_batch){.n_tokens = 5,
                      .n_seqs = 2,
                      .tokens = f->tokens,
                      .tok_seq = f->tok_seq,
                      .tok_pos = f->tok_pos,
                      .slot = f->slot,
                      .seq_len = f->seq_len,
                      .block_table = f->table,
                      .max_blocks = 4,
                      .block_tokens = 16,
                      .logit_rows = f->rows,
                      .n_logits = 2};
}

static md_stage_config config(int lo, int hi) {
    md_stage_config c = {.model_hash = 0x0123456789abcdefull,
                         .lo = lo,
                         .hi = hi,
                         .n_threads = 3,
                         .tp = 1,
                         .n_slots = 256,
                         .kv_type = 1,
                         .max_tokens = 8,
                         .max_seqs = 4,
                         .max_blocks = 4,
                         .block_tokens = 16,
                         .n_ctx = 64,
                         .mem_cap = (size_t)5 << 30};
    snprintf(c.model, sizeof c.model, "synthetic:tiny");
    snprintf(c.device, sizeof c.device, "cpu:2");
    return c;
}

/* The payload of the frame in b, copied into a malloc of its exact size (caller frees). */
static uint8_t *payload_copy(const md_wire_buf *b, size_t *n) {
    *n = b->len - MD_WIRE_HDR;
    uint8_t *p = malloc(*n ? *n : 1);
    assert_non_null(p);
    memcpy(p, b->p + MD_WIRE_HDR, *n);
    return p;
}

/* The frame in b has a valid header of type and seq and a payload whose CRC matches. */
static void check_frame(const md_wire_buf *b, int type, uint32_t seq) {
    md_wire_hdr h;
    md_err e = {0};
    assert_true(b->len >= MD_WIRE_HDR);
    if (md_wire_hdr_get(b->p, &h, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(h.type, type);
    assert_int_equal(h.seq, seq);
    assert_int_equal(h.len, b->len - MD_WIRE_HDR);
    assert_int_equal(md_wire_payload_check(&h, b->p + MD_WIRE_HDR, &e), 0);
    assert_int_equal(md_wire_hdr_check(&h, 1u << type, h.len, &e), 0);
}

static void test_header_layout_is_the_documented_one(void **state) {
    uint8_t h[MD_WIRE_HDR];
    md_wire_hdr_put(h, MD_WIRE_RUN, 0x01020304u, 0x1122334455667788ull, 0xaabbccddu);
    /* "MDST", version 2, type 3, length, payload CRC, seq, reserved: little-endian */
    static const uint8_t want[28] = {'M',  'D',  'S',  'T',  2,    0,    3,    0,    0x88, 0x77,
                                     0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0xdd, 0xcc, 0xbb, 0xaa,
                                     4,    3,    2,    1,    0,    0,    0,    0};
    assert_memory_equal(h, want, 28);
    uint32_t crc = md_wire_crc(h, 28);
    assert_int_equal(h[28] | h[29] << 8 | h[30] << 16 | (uint32_t)h[31] << 24, crc);
    md_wire_hdr d;
    md_err e = {0};
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(d.type, MD_WIRE_RUN);
    assert_int_equal(d.seq, 0x01020304u);
    assert_true(d.len == 0x1122334455667788ull);
    assert_int_equal(d.crc, 0xaabbccddu);
    /* zlib's CRC-32 of "123456789" is the standard check value */
    assert_int_equal(md_wire_crc("123456789", 9), 0xcbf43926u);
}

static void test_hello_round_trips_every_field(void **state) {
    md_stage_config c = config(1, 2);
    md_wire_buf b = {0};
    md_err e = {0};
    assert_int_equal(md_wire_put_hello(&b, &c, 512, 128, auth(), &e), 0);
    check_frame(&b, MD_WIRE_HELLO, 0);
    size_t n;
    uint8_t *p = payload_copy(&b, &n);
    md_stage_config d;
    int vocab = 0, embd = 0;
    if (md_wire_get_hello(p, n, &d, &vocab, &embd, &e))
        fail_msg("%s", e.msg);
    assert_string_equal(d.model, c.model);
    assert_true(d.model_hash == c.model_hash);
    assert_int_equal(d.lo, 1);
    assert_int_equal(d.hi, 2);
    assert_string_equal(d.device, "cpu:2");
    assert_int_equal(d.n_threads, 3);
    assert_int_equal(d.tp, 1);
    assert_int_equal(d.n_slots, 256);
    assert_int_equal(d.kv_type, 1);
    assert_int_equal(d.max_tokens, 8);
    assert_int_equal(d.max_seqs, 4);
    assert_int_equal(d.max_blocks, 4);
    assert_int_equal(d.block_tokens, 16);
    assert_int_equal(d.n_ctx, 64);
    assert_true(d.mem_cap == c.mem_cap);
    assert_int_equal(vocab, 512);
    assert_int_equal(embd, 128);
    free(p);
    md_wire_buf_free(&b);
}

static void test_ready_error_result_round_trip(void **state) {
    md_wire_buf b = {0};
    md_err e = {0};
    md_wire_ready r = {.model_hash = 42,
                       .lo = 3,
                       .hi = 7,
                       .n_layer = 7,
                       .n_embd = 64,
                       .n_vocab = 1000,
                       .idle_ms = 60000};
    snprintf(r.describe, sizeof r.describe, "layers 3-7 on cpu: 2 threads, avx2");
    assert_int_equal(md_wire_put_ready(&b, &r, auth(), &e), 0);
    check_frame(&b, MD_WIRE_READY, 0);
    size_t n;
    uint8_t *p = payload_copy(&b, &n);
    md_wire_ready d;
    assert_int_equal(md_wire_get_ready(p, n, auth(), &d, &e), 0);
    assert_memory_equal(&d, &r, sizeof d);
    free(p);

    assert_int_equal(md_wire_put_error(&b, 9, MD_ENOMEM, "stage: 3 GiB over the cap", &e), 0);
    check_frame(&b, MD_WIRE_ERROR, 9);
    p = payload_copy(&b, &n);
    int code = 0;
    char msg[64];
    assert_int_equal(md_wire_get_error(p, n, &code, msg, sizeof msg, &e), 0);
    assert_int_equal(code, MD_ENOMEM);
    assert_string_equal(msg, "stage: 3 GiB over the cap");
    free(p);

    /* a code that is not one of ours becomes MD_EIO; a message is cut to the buffer */
    assert_int_equal(md_wire_put_error(&b, 1, 12345, "abcdefgh", &e), 0);
    p = payload_copy(&b, &n);
    assert_int_equal(md_wire_get_error(p, n, &code, msg, 4, &e), 0);
    assert_int_equal(code, MD_EIO);
    assert_string_equal(msg, "abc");
    free(p);

    float *out = md_wire_result_begin(&b, 6, &e);
    assert_non_null(out);
    assert_int_equal((uintptr_t)out % 4, 0);
    for (int i = 0; i < 6; i++)
        out[i] = (float)i / 3.0f;
    md_wire_result_end(&b, 77);
    check_frame(&b, MD_WIRE_RESULT, 77);
    p = payload_copy(&b, &n);
    float got[6];
    assert_int_equal(md_wire_get_result(p, n, got, 6, &e), 0);
    for (int i = 0; i < 6; i++)
        assert_true(got[i] == (float)i / 3.0f);
    assert_int_equal(md_wire_get_result(p, n, got, 5, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "expected 5 floats"));
    /* in place: out = the payload itself */
    assert_int_equal(md_wire_get_result(p, n, (float *)(void *)p, 6, &e), 0);
    assert_true(((float *)(void *)p)[5] == 5.0f / 3.0f);
    free(p);
    md_wire_buf_free(&b);
}

/* A RUN of fixture f encoded for a stage with lo (hidden states past the first stage). */
static void put_run(md_wire_buf *b, batch_fix *f, int lo, uint32_t seq, md_wire_limits *l) {
    md_stage_config c = config(lo, lo + 1);
    md_err e = {0};
    assert_int_equal(md_wire_limits_for(&c, 8, 100, l, &e), 0);
    assert_int_equal(md_wire_put_run(b, seq, &f->b, lo ? f->hidden : NULL, l->hidden, &e), 0);
}

static void check_batch_equal(const md_batch *a, const md_batch *b) {
    assert_int_equal(a->n_tokens, b->n_tokens);
    assert_int_equal(a->n_seqs, b->n_seqs);
    assert_int_equal(a->n_logits, b->n_logits);
    assert_int_equal(a->max_blocks, b->max_blocks);
    assert_int_equal(a->block_tokens, b->block_tokens);
    assert_int_equal(a->argmax_only, b->argmax_only);
    size_t T = (size_t)a->n_tokens, S = (size_t)a->n_seqs;
    assert_memory_equal(a->tokens, b->tokens, 4 * T);
    assert_memory_equal(a->tok_seq, b->tok_seq, 4 * T);
    assert_memory_equal(a->tok_pos, b->tok_pos, 4 * T);
    assert_memory_equal(a->slot, b->slot, 4 * T);
    assert_memory_equal(a->seq_len, b->seq_len, 4 * S);
    assert_memory_equal(a->block_table, b->block_table, 4 * S * (size_t)a->max_blocks);
    assert_memory_equal(a->logit_rows, b->logit_rows, 4 * (size_t)a->n_logits);
}

static void test_run_round_trips_with_and_without_hidden(void **state) {
    batch_fix f;
    batch_fix_init(&f);
    md_wire_buf b = {0};
    md_err e = {0};
    for (int lo = 0; lo <= 1; lo++) {
        md_wire_limits l;
        f.b.argmax_only = lo; /* the flag travels too */
        put_run(&b, &f, lo, 5 + (uint32_t)lo, &l);
        assert_int_equal(l.hidden, lo ? 8 : 0);
        check_frame(&b, MD_WIRE_RUN, 5 + (uint32_t)lo);
        size_t n;
        uint8_t *p = payload_copy(&b, &n);
        md_batch d;
        const float *hidden = (const float *)1;
        if (md_wire_get_run(p, n, &l, &d, &hidden, &e))
            fail_msg("%s", e.msg);
        check_batch_equal(&d, &f.b);
        if (lo)
            assert_memory_equal(hidden, f.hidden, sizeof f.hidden);
        else
            assert_null(hidden);
        /* the arrays point into the payload: no copy */
        assert_ptr_equal(d.tokens, (const int32_t *)(void *)(p + 24));
        free(p);
    }
    md_wire_buf_free(&b);
}

static void test_every_truncated_run_is_refused(void **state) {
    batch_fix f;
    batch_fix_init(&f);
    md_wire_buf b = {0};
    md_wire_limits l;
    put_run(&b, &f, 1, 1, &l);
    size_t n;
    uint8_t *full = payload_copy(&b, &n);
    for (size_t k = 0; k < n; k++) {
        uint8_t *p = malloc(k ? k : 1);
        memcpy(p, full, k);
        md_batch d;
        const float *h;
        md_err e = {0};
        assert_int_equal(md_wire_get_run(p, k, &l, &d, &h, &e), MD_EFORMAT);
        assert_true(strstr(e.msg, "RUN frame") != NULL);
        free(p);
    }
    /* and one byte too many (4, to keep the alignment) */
    uint8_t *p = malloc(n + 4);
    memcpy(p, full, n);
    memset(p + n, 0, 4);
    md_batch d;
    const float *h;
    md_err e = {0};
    assert_int_equal(md_wire_get_run(p, n + 4, &l, &d, &h, &e), MD_EFORMAT);
    free(p);
    free(full);
    md_wire_buf_free(&b);
}

/* Set the int32 at payload offset off of a RUN frame. */
static void poke32(uint8_t *p, size_t off, int32_t v) {
    uint32_t u = (uint32_t)v;
    for (int i = 0; i < 4; i++)
        p[off + (size_t)i] = (uint8_t)(u >> (8 * i));
}

static void test_run_counts_that_lie_are_refused(void **state) {
    batch_fix f;
    batch_fix_init(&f);
    md_wire_buf b = {0};
    md_wire_limits l;
    put_run(&b, &f, 1, 1, &l);
    size_t n;
    uint8_t *full = payload_copy(&b, &n);
    static const struct {
        size_t off; /* n_tokens 0, n_seqs 4, n_logits 8, max_blocks 12, block_tokens 16,
                       flags 20 */
        int32_t v;
        const char *says;
    } lies[] = {
        {0, 6, "need"},         /* more tokens than the payload holds */
        {0, 4, "need"},         /* fewer */
        {0, 9, "n_tokens = 9"}, /* over max_tokens 8 */
        {0, 0, "n_tokens = 0"},
        {0, -1, "n_tokens = -1"},
        {0, INT32_MIN, "n_tokens"},
        {4, 3, "need"},
        {4, 5, "n_seqs = 5"},
        {4, -7, "n_seqs"},
        {8, 3, "need"},
        {8, 5, "n_logits = 5"},
        {12, 3, "need"},
        {12, 1 << 30, "max_blocks"},
        {16, 0, "block_tokens = 0"},
        {16, INT32_MAX, "block_tokens"},
        {20, 2, "flags = 2"},
        {20, -1, "flags = -1"},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        uint8_t *p = malloc(n);
        memcpy(p, full, n);
        poke32(p, lies[i].off, lies[i].v);
        md_batch d;
        const float *h;
        md_err e = {0};
        int rc = md_wire_get_run(p, n, &l, &d, &h, &e);
        if (rc != MD_EFORMAT || !strstr(e.msg, lies[i].says))
            fail_msg("lie %zu (offset %zu = %d): rc %d, '%s'", i, lies[i].off, lies[i].v, rc,
                     e.msg);
        free(p);
    }
    /* a first stage's RUN read with an inner stage's limits: the hidden states are missing */
    md_wire_limits l0;
    put_run(&b, &f, 0, 1, &l0);
    free(full);
    full = payload_copy(&b, &n);
    md_batch d;
    const float *h;
    md_err e = {0};
    assert_int_equal(md_wire_get_run(full, n, &l, &d, &h, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "with hidden states"));
    /* a misaligned buffer is the caller's mistake, refused before any read */
    uint8_t *mis = malloc(n + 1);
    memcpy(mis + 1, full, n);
    assert_int_equal(md_wire_get_run(mis + 1, n, &l0, &d, &h, &e), MD_EINVAL);
    free(mis);
    free(full);
    md_wire_buf_free(&b);
}

static void test_every_header_bit_flip_is_caught(void **state) {
    md_wire_buf b = {0};
    md_err e = {0};
    assert_int_equal(md_wire_put_error(&b, 3, MD_EIO, "x", &e), 0);
    for (int bit = 0; bit < 8 * MD_WIRE_HDR; bit++) {
        uint8_t h[MD_WIRE_HDR];
        memcpy(h, b.p, sizeof h);
        h[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        md_wire_hdr d;
        int rc = md_wire_hdr_get(h, &d, &e);
        if (rc != MD_EFORMAT)
            fail_msg("bit %d flipped: rc %d", bit, rc);
        assert_true(strstr(e.msg, bit < 32 ? "magic" : "CRC") != NULL);
    }
    /* a flipped payload bit: the payload CRC */
    md_wire_hdr d;
    assert_int_equal(md_wire_hdr_get(b.p, &d, &e), 0);
    for (size_t bit = 0; bit < 8 * d.len; bit++) {
        b.p[MD_WIRE_HDR + bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_int_equal(md_wire_payload_check(&d, b.p + MD_WIRE_HDR, &e), MD_EFORMAT);
        assert_non_null(strstr(e.msg, "ERROR frame payload corrupt"));
        b.p[MD_WIRE_HDR + bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    md_wire_buf_free(&b);
}

/* A header with the given fields and a correct header CRC (bypassing md_wire_hdr_put). */
static void raw_header(uint8_t h[MD_WIRE_HDR], uint32_t magic, int version, int type, uint64_t len,
                       uint32_t reserved) {
    memset(h, 0, MD_WIRE_HDR);
    for (int i = 0; i < 4; i++)
        h[i] = (uint8_t)(magic >> (8 * i));
    h[4] = (uint8_t)version;
    h[5] = (uint8_t)(version >> 8);
    h[6] = (uint8_t)type;
    h[7] = (uint8_t)(type >> 8);
    for (int i = 0; i < 8; i++)
        h[8 + i] = (uint8_t)(len >> (8 * i));
    for (int i = 0; i < 4; i++)
        h[24 + i] = (uint8_t)(reserved >> (8 * i));
    uint32_t c = md_wire_crc(h, 28);
    for (int i = 0; i < 4; i++)
        h[28 + i] = (uint8_t)(c >> (8 * i));
}

static void test_other_versions_types_and_sizes_are_refused(void **state) {
    uint8_t h[MD_WIRE_HDR];
    md_wire_hdr d;
    md_err e = {0};
    raw_header(h, MD_WIRE_MAGIC, 1, MD_WIRE_RUN, 0, 0); /* the unauthenticated version */
    assert_int_equal(md_wire_hdr_get(h, &d, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "version 1"));
    raw_header(h, MD_WIRE_MAGIC, 0, MD_WIRE_RUN, 0, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), MD_EUNSUPP);
    raw_header(h, MD_WIRE_MAGIC, 2, 0, 0, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "unknown type 0"));
    raw_header(h, MD_WIRE_MAGIC, 2, 8, 0, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), MD_EFORMAT);
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_RUN, 0, 1);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "reserved"));
    raw_header(h, 0x4d445354u, 2, MD_WIRE_RUN, 0, 0); /* byte-swapped magic */
    assert_int_equal(md_wire_hdr_get(h, &d, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "magic"));

    /* lengths: RUN and RESULT by the handshake's limit, HELLO by MD_WIRE_HELLO_MAX, PING 0,
     * the others by MD_WIRE_SMALL_MAX */
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_RUN, 1001, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_RUN, 1001, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_RUN, 1000, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "RUN frame of 1001 bytes exceeds the limit of 1000"));
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_HELLO, MD_WIRE_HELLO_MAX + 1ull, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_HELLO, UINT64_MAX, &e), MD_EFORMAT);
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_ERROR, MD_WIRE_SMALL_MAX + 1ull, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_ERROR, UINT64_MAX, &e), MD_EFORMAT);
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_PING, 1, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_PING, UINT64_MAX, &e), MD_EFORMAT);
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_RESULT, UINT64_MAX, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_RESULT, MD_WIRE_PAYLOAD_MAX, &e),
                     MD_EFORMAT);
    /* a type the receiver does not expect now, whatever its length */
    raw_header(h, MD_WIRE_MAGIC, 2, MD_WIRE_RUN, 1u << 20, 0);
    assert_int_equal(md_wire_hdr_get(h, &d, &e), 0);
    assert_int_equal(md_wire_hdr_check(&d, 1u << MD_WIRE_HELLO, 0, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "unexpected RUN frame (expected HELLO)"));
    assert_int_equal(
        md_wire_hdr_check(&d, 1u << MD_WIRE_RESULT | 1u << MD_WIRE_ERROR, UINT64_MAX, &e),
        MD_EFORMAT);
    assert_non_null(strstr(e.msg, "expected RESULT or ERROR"));
}

static void test_limits_refuse_frames_too_large(void **state) {
    md_stage_config c = config(2, 3);
    md_wire_limits l;
    md_err e = {0};
    assert_int_equal(md_wire_limits_for(&c, 128, 512, &l, &e), 0);
    /* the largest of the RUN (with hidden), hidden out and logits out */
    uint64_t run = 20 + 4 * (4 * 8 + 4 + 4 * 4 + 4) + 4 * 8 * 128;
    uint64_t logits = 4 * 4 * 512;
    assert_true(l.max_payload == (run > logits ? run : logits));
    c.max_tokens = 1 << 20;
    assert_int_equal(md_wire_limits_for(&c, 1 << 20, 512, &l, &e), MD_ERANGE);
    assert_non_null(strstr(e.msg, "the wire allows"));
    c = config(0, 1);
    assert_int_equal(md_wire_limits_for(&c, 0, 512, &l, &e), MD_EINVAL);
}

/* A HELLO whose config breaks one bound is refused naming the field. */
static void test_hello_with_bad_fields_is_refused(void **state) {
    md_wire_buf b = {0};
    md_err e = {0};
    md_stage_config d;
    int v, m;
    struct {
        const char *says;
        md_stage_config c;
    } bad[6];
    for (int i = 0; i < 6; i++)
        bad[i].c = config(1, 2);
    bad[0].says = "empty layer range [1, 1)";
    bad[0].c.hi = 1;
    bad[1].says = "tp = 9";
    bad[1].c.tp = 9;
    bad[2].says = "max_tokens = 0";
    bad[2].c.max_tokens = 0;
    bad[3].says = "n_slots = -5";
    bad[3].c.n_slots = -5;
    bad[4].says = "no model named";
    bad[4].c.model[0] = '\0';
    bad[5].says = "lo = -1";
    bad[5].c.lo = -1;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(md_wire_put_hello(&b, &bad[i].c, 10, 10, auth(), &e), 0);
        size_t n;
        uint8_t *p = payload_copy(&b, &n);
        int rc = md_wire_get_hello(p, n, &d, &v, &m, &e);
        if (rc != MD_EFORMAT || !strstr(e.msg, bad[i].says))
            fail_msg("case %d: rc %d '%s'", i, rc, e.msg);
        free(p);
    }
    /* a model name holding a NUL byte, or longer than the field */
    md_stage_config c = config(1, 2);
    assert_int_equal(md_wire_put_hello(&b, &c, 10, 10, auth(), &e), 0);
    size_t n;
    uint8_t *p = payload_copy(&b, &n);
    p[4 + 3] = '\0'; /* inside "synthetic:tiny" */
    assert_int_equal(md_wire_get_hello(p, n, &d, &v, &m, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "model holds a NUL"));
    poke32(p, 0, 600);
    assert_int_equal(md_wire_get_hello(p, n, &d, &v, &m, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "model of 600 bytes"));
    poke32(p, 0, -1);
    assert_int_equal(md_wire_get_hello(p, n, &d, &v, &m, &e), MD_EFORMAT);
    free(p);
    /* an unterminated name in the caller's config is not sent */
    memset(c.device, 'x', sizeof c.device);
    assert_int_equal(md_wire_put_hello(&b, &c, 10, 10, auth(), &e), MD_EINVAL);
    md_wire_buf_free(&b);
}

/* KV element types in HELLO (engine/shard/stage.h): F32, whose GGUF id 0 is also "the
 * backend's", has a code of its own (-1) that survives the frame; a stage sizes and a model
 * allocates the type asked for, F32 included; -2 is refused as out of range, as a stage from
 * before the F32 code refuses -1. Before, a head's F32 reached its stages as 0 and they ran
 * their backend's F16. */
static void test_hello_tells_f32_from_the_backends_kv_type(void **state) {
    assert_int_equal(md_stage_kv_code(MD_TYPE_F32), MD_STAGE_KV_F32);
    assert_int_equal(md_stage_kv_code(MD_TYPE_F16), MD_TYPE_F16);
    assert_int_equal(md_stage_kv_type(MD_STAGE_KV_F32, MD_TYPE_F16), MD_TYPE_F32);
    assert_int_equal(md_stage_kv_type(MD_STAGE_KV_BACKEND, MD_TYPE_F16), MD_TYPE_F16);
    assert_int_equal(md_stage_kv_type(MD_STAGE_KV_BACKEND, MD_TYPE_F32), MD_TYPE_F32);
    assert_int_equal(md_stage_kv_type(MD_TYPE_BF16, MD_TYPE_F32), MD_TYPE_BF16);
    md_wire_buf b = {0};
    md_err e = {0};
    md_stage_config d;
    int v, m;
    const int codes[] = {MD_STAGE_KV_BACKEND, MD_STAGE_KV_F32, MD_TYPE_F16, MD_TYPE_BF16};
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
        md_stage_config c = config(1, 2);
        c.kv_type = codes[i];
        assert_int_equal(md_wire_put_hello(&b, &c, 10, 10, auth(), &e), 0);
        size_t n;
        uint8_t *p = payload_copy(&b, &n);
        if (md_wire_get_hello(p, n, &d, &v, &m, &e))
            fail_msg("kv_type %d: %s", codes[i], e.msg);
        assert_int_equal(d.kv_type, codes[i]);
        free(p);
    }
    md_stage_config c = config(1, 2);
    c.kv_type = -2;
    assert_int_equal(md_wire_put_hello(&b, &c, 10, 10, auth(), &e), 0);
    size_t n;
    uint8_t *p = payload_copy(&b, &n);
    assert_int_equal(md_wire_get_hello(p, n, &d, &v, &m, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "kv_type = -2"));
    free(p);
    md_wire_buf_free(&b);
    /* a stage's KV slot of F32 is twice one of F16 */
    size_t w, kv32, kv16;
    if (md_stage_bytes("synthetic:tiny", 0, 1, MD_STAGE_KV_F32, &w, &kv32, &e) ||
        md_stage_bytes("synthetic:tiny", 0, 1, MD_TYPE_F16, &w, &kv16, &e))
        fail_msg("%s", e.msg);
    assert_true(kv32 == 2 * kv16);
    /* and a model on the cpu backend (whose own type is F16) allocates F32 when asked */
    void *img;
    size_t len;
    gguf_file *gf = NULL;
    md_backend *be = NULL;
    md_model *mod = NULL;
    md_kv_bufs kv;
    if (md_synth_build("synthetic:tiny", 1, &img, &len, &e) || gguf_open_mem(img, len, &gf, &e) ||
        md_backend_open("cpu", 1, &be, &e) || md_model_load(gf, be, &mod, &e) ||
        md_kv_bufs_alloc_type(mod, 16, MD_TYPE_F32, &kv, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(kv.type, MD_TYPE_F32);
    md_kv_bufs_free(mod, &kv);
    md_model_free(mod);
    md_backend_free(be);
    gguf_close(gf);
    md_synth_free(img, len);
}

static void test_ready_for_another_model_or_range_is_refused(void **state) {
    md_stage_config c = config(2, 4);
    md_wire_ready r = {.model_hash = c.model_hash,
                       .lo = 2,
                       .hi = 4,
                       .n_layer = 4,
                       .n_embd = 128,
                       .n_vocab = 512,
                       .idle_ms = 1000};
    md_err e = {0};
    const char *where = "tcp://10.0.0.2:7701 layers 2-3";
    assert_int_equal(md_wire_ready_check(&r, &c, 128, 512, where, &e), 0);
    md_wire_ready x = r;
    x.model_hash = 0xfeedull;
    assert_int_equal(md_wire_ready_check(&x, &c, 128, 512, where, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "000000000000feed"));
    assert_non_null(strstr(e.msg, "0123456789abcdef"));
    assert_non_null(strstr(e.msg, where));
    c.model_hash = 0; /* the head asked not to check */
    assert_int_equal(md_wire_ready_check(&x, &c, 128, 512, where, &e), 0);
    x = r;
    x.lo = 1;
    assert_int_equal(md_wire_ready_check(&x, &c, 128, 512, where, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "answered for layers 1-3, the head asked 2-3"));
    x = r;
    x.n_embd = 64;
    assert_int_equal(md_wire_ready_check(&x, &c, 128, 512, where, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "n_embd 64"));
    x = r;
    x.n_vocab = 511;
    assert_int_equal(md_wire_ready_check(&x, &c, 128, 512, where, &e), MD_EINVAL);
    assert_int_equal(md_wire_ready_check(&x, &c, 0, 0, where, &e), 0); /* unknown widths */
    /* a READY whose layers are not a range of its own model does not decode */
    md_wire_buf b = {0};
    x = r;
    x.n_layer = 3;
    assert_int_equal(md_wire_put_ready(&b, &x, auth(), &e), 0);
    size_t n;
    uint8_t *p = payload_copy(&b, &n);
    assert_int_equal(md_wire_get_ready(p, n, auth(), &x, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "layers [2, 4) of a 3-layer model"));
    free(p);
    md_wire_buf_free(&b);
}

/* The handshake's signatures: a HELLO verifies under its secret and the CHALLENGE's nonce
 * only — not under another secret, not replayed to another challenge, not with one byte
 * changed — and gives the head's nonce; a READY decodes only when signed for this head's
 * nonce and this stage's nonce with the same secret; the CHALLENGE round-trips. */
static void test_handshake_is_signed_and_checked(void **state) {
    md_stage_config c = config(1, 2);
    md_wire_buf b = {0};
    md_err e = {0};
    md_wire_auth head = *auth(), stage = {.secret = auth()->secret};
    memcpy(stage.stage_nonce, head.stage_nonce, sizeof stage.stage_nonce);
    assert_int_equal(md_wire_put_hello(&b, &c, 512, 128, &head, &e), 0);
    size_t n;
    uint8_t *p = payload_copy(&b, &n);
    if (md_wire_hello_verify(p, n, &stage, &e))
        fail_msg("%s", e.msg);
    assert_memory_equal(stage.head_nonce, head.head_nonce, MD_STAGE_NONCE);
    /* another secret; another challenge (a replay); a changed byte (the layers) */
    md_stage_secret other = *auth()->secret;
    other.key[0] ^= 1;
    md_wire_auth x = stage;
    x.secret = &other;
    assert_int_equal(md_wire_hello_verify(p, n, &x, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "authentication failed"));
    x = stage;
    x.stage_nonce[5] ^= 1;
    assert_int_equal(md_wire_hello_verify(p, n, &x, &e), MD_EINVAL);
    p[4 + strlen(c.model) + 8] ^= 1;
    assert_int_equal(md_wire_hello_verify(p, n, &stage, &e), MD_EINVAL);
    assert_int_equal(md_wire_hello_verify(p, 10, &stage, &e), MD_EINVAL);
    free(p);
    /* no secret: nothing is signed */
    md_wire_auth none = {0};
    assert_int_equal(md_wire_put_hello(&b, &c, 512, 128, &none, &e), MD_EINVAL);

    md_wire_ready r = {.lo = 1, .hi = 2, .n_layer = 2, .n_embd = 8, .n_vocab = 9, .idle_ms = 300};
    assert_int_equal(md_wire_put_ready(&b, &r, &stage, &e), 0);
    p = payload_copy(&b, &n);
    md_wire_ready d;
    assert_int_equal(md_wire_get_ready(p, n, &head, &d, &e), 0);
    assert_int_equal(d.idle_ms, 300);
    x = head;
    x.head_nonce[0] ^= 1; /* a READY made for another head's handshake */
    assert_int_equal(md_wire_get_ready(p, n, &x, &d, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "another secret"));
    x = head;
    x.secret = &other;
    assert_int_equal(md_wire_get_ready(p, n, &x, &d, &e), MD_EINVAL);
    free(p);

    uint8_t nonce[MD_STAGE_NONCE], got[MD_STAGE_NONCE];
    assert_int_equal(md_stage_nonce(nonce, &e), 0);
    assert_int_equal(md_wire_put_challenge(&b, nonce, &e), 0);
    check_frame(&b, MD_WIRE_CHALLENGE, 0);
    p = payload_copy(&b, &n);
    assert_int_equal(n, 4 + MD_STAGE_NONCE);
    assert_int_equal(md_wire_get_challenge(p, n, got, &e), 0);
    assert_memory_equal(got, nonce, MD_STAGE_NONCE);
    p[0] = 2; /* another scheme */
    assert_int_equal(md_wire_get_challenge(p, n, got, &e), MD_EUNSUPP);
    free(p);
    assert_int_equal(md_wire_put_ping(&b, &e), 0);
    check_frame(&b, MD_WIRE_PING, 0);
    assert_int_equal(b.len, MD_WIRE_HDR);
    md_wire_buf_free(&b);
}

/* The MAC is HMAC-SHA256(key, label | nonce | message) as docs/sharding.md writes it: the
 * value below is Python's hmac.new(b"Jefe", b"MDST HELLO v2" + bytes(32) + b"what do ya want
 * for nothing?", sha256) (the key and message of RFC 4231's test case 2), so a peer written
 * from the docs in any language agrees with this one. */
static void test_mac_is_the_documented_hmac_sha256(void **state) {
    md_stage_secret k = {.len = 4};
    memcpy(k.key, "Jefe", 4);
    static const uint8_t zero[MD_STAGE_NONCE] = {0};
    static const char msg[] = "what do ya want for nothing?";
    static const uint8_t want[MD_STAGE_MAC] = {0x34, 0x31, 0xda, 0xc3, 0xf6, 0x0c, 0x19, 0x61,
                                               0x76, 0xbd, 0x1b, 0x5a, 0x00, 0x6c, 0x92, 0xd9,
                                               0x70, 0xef, 0xa1, 0x5f, 0xc3, 0xf8, 0xab, 0x20,
                                               0x6c, 0x56, 0x19, 0x40, 0x8a, 0x0b, 0xdf, 0x81};
    uint8_t mac[MD_STAGE_MAC];
    assert_int_equal(
        md_stage_mac(&k, "MDST HELLO v2", zero, NULL, (const uint8_t *)msg, strlen(msg), mac), 0);
    assert_memory_equal(mac, want, MD_STAGE_MAC);
    assert_true(md_stage_mac_equal(mac, want));
    mac[31] ^= 1;
    assert_false(md_stage_mac_equal(mac, want));
    md_stage_secret none = {0};
    assert_int_equal(md_stage_mac(&none, "MDST HELLO v2", zero, NULL, NULL, 0, mac), -1);
}

/* The secret file: a trailing newline is not part of it; too short, missing and unset are
 * refused naming the file or the two ways to give it, never the bytes. */
static void test_secret_file_rules(void **state) {
    char path[] = "/tmp/medley-secret-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "0123456789abcdef0123\n", 21), 21);
    close(fd);
    md_stage_secret s;
    md_err e = {0};
    assert_int_equal(md_stage_secret_load(path, &s, &e), 0);
    assert_int_equal(s.len, 20);
    assert_memory_equal(s.key, "0123456789abcdef0123", 20);
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "short\n", 6), 6);
    close(fd);
    assert_int_equal(md_stage_secret_load(path, &s, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "holds 5 bytes"));
    assert_null(strstr(e.msg, "short"));
    unlink(path);
    assert_int_equal(md_stage_secret_load(path, &s, &e), MD_EIO);
    assert_non_null(strstr(e.msg, path));
    unsetenv(MD_STAGE_SECRET_ENV);
    assert_int_equal(md_stage_secret_from(NULL, "medley stage", &s, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "--secret-file"));
    assert_non_null(strstr(e.msg, MD_STAGE_SECRET_ENV));
}

static uint64_t rng = 0x5eed;
static uint64_t rnd(void) { /* splitmix64 */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void test_random_bytes_never_decode_into_nonsense(void **state) {
    md_stage_config c = config(1, 2);
    md_wire_limits l;
    md_err e = {0};
    assert_int_equal(md_wire_limits_for(&c, 8, 100, &l, &e), 0);
    for (int it = 0; it < 3000; it++) {
        size_t n = (size_t)(rnd() % 700);
        uint8_t *p = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++)
            p[i] = (uint8_t)rnd();
        if (n >= 20 && it % 2) /* plausible counts, so decoding gets past them */
            for (int k = 0; k < 5; k++)
                poke32(p, 4 * (size_t)k, (int32_t)(rnd() % 10));
        md_stage_config d;
        md_wire_ready r;
        md_batch bt;
        const float *h;
        int v, m, code;
        char msg[32];
        float out[4];
        if (md_wire_get_hello(p, n, &d, &v, &m, &e) == 0)
            assert_true(d.lo < d.hi && strlen(d.model) < sizeof d.model);
        if (md_wire_get_ready(p, n, auth(), &r, &e) == 0)
            assert_true(strlen(r.describe) < sizeof r.describe);
        if (md_wire_get_run(p, n, &l, &bt, &h, &e) == 0) {
            assert_true(bt.n_tokens >= 1 && bt.n_tokens <= 8);
            assert_true(bt.n_seqs >= 1 && bt.n_seqs <= 4);
        }
        if (md_wire_get_error(p, n, &code, msg, sizeof msg, &e) == 0)
            assert_true(code < 0);
        md_wire_get_result(p, n, out, 4, &e);
        if (n >= MD_WIRE_HDR) {
            md_wire_hdr hd;
            if (md_wire_hdr_get(p, &hd, &e) == 0)
                fail_msg("random header accepted at iteration %d", it);
        }
        free(p);
    }
}

/* Over a socketpair: a frame whole; a partial frame then close; silence (deadline); a clean
 * close before a frame. */
static void test_frames_over_a_socket(void **state) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    md_wire_buf b = {0}, in = {0};
    md_err e = {0};
    md_stage_config c = config(0, 1);
    assert_int_equal(md_wire_put_hello(&b, &c, 512, 128, auth(), &e), 0);
    assert_int_equal(md_wire_send(sv[0], b.p, b.len, md_wire_deadline(1000), &e), 0);
    md_wire_hdr h;
    int eof = -1;
    if (md_wire_recv_frame(sv[1], 1u << MD_WIRE_HELLO, 0, md_wire_deadline(1000), NULL, &h, &in,
                           &eof, &e))
        fail_msg("%s", e.msg);
    assert_int_equal(eof, 0);
    assert_int_equal(in.len, b.len - MD_WIRE_HDR);
    assert_memory_equal(in.p, b.p + MD_WIRE_HDR, in.len);

    /* silence: the deadline, not a hang */
    uint64_t t0 = md_mono_ns();
    assert_int_equal(md_wire_recv_frame(sv[1], 1u << MD_WIRE_HELLO, 0, md_wire_deadline(150), NULL,
                                        &h, &in, &eof, &e),
                     MD_EIO);
    uint64_t ms = (md_mono_ns() - t0) / 1000000;
    assert_true(ms >= 140 && ms < 2000);
    assert_non_null(strstr(e.msg, "timed out"));
    assert_int_equal(eof, 0);

    /* a stop flag ends a wait without a deadline */
    volatile sig_atomic_t stop = 1;
    assert_int_equal(md_wire_recv_frame(sv[1], 1u << MD_WIRE_HELLO, 0, 0, &stop, &h, &in, &eof, &e),
                     MD_ECANCEL);

    /* half a frame, then the peer closes */
    assert_int_equal(md_wire_send(sv[0], b.p, MD_WIRE_HDR + 5, md_wire_deadline(1000), &e), 0);
    close(sv[0]);
    assert_int_equal(md_wire_recv_frame(sv[1], 1u << MD_WIRE_HELLO, 0, md_wire_deadline(1000), NULL,
                                        &h, &in, &eof, &e),
                     MD_EIO);
    assert_non_null(strstr(e.msg, "closed by the peer (5 of"));
    assert_int_equal(eof, 0);
    /* then nothing more: a clean close at a frame boundary */
    assert_int_equal(md_wire_recv_frame(sv[1], 1u << MD_WIRE_HELLO, 0, md_wire_deadline(1000), NULL,
                                        &h, &in, &eof, &e),
                     MD_EIO);
    assert_int_equal(eof, 1);
    /* sending to a closed peer is an error, not SIGPIPE */
    assert_int_equal(md_wire_send(sv[1], b.p, b.len, md_wire_deadline(1000), &e), MD_EIO);
    close(sv[1]);
    md_wire_buf_free(&b);
    md_wire_buf_free(&in);
}

static void test_connect_and_listen(void **state) {
    int lfd, port = 0;
    md_err e = {0};
    if (md_wire_listen("127.0.0.1", 0, &lfd, &port, &e))
        fail_msg("%s", e.msg);
    assert_true(port > 0);
    int cfd;
    if (md_wire_connect("127.0.0.1", port, 1000, &cfd, &e))
        fail_msg("%s", e.msg);
    int afd = -1;
    char peer[64];
    for (int i = 0; i < 100 && afd < 0; i++)
        if (md_wire_accept(lfd, &afd, peer, sizeof peer, &e))
            usleep(10000);
    assert_true(afd >= 0);
    assert_non_null(strstr(peer, "127.0.0.1:"));
    close(afd);
    close(cfd);
    close(lfd);
    /* nobody listens there any more */
    assert_int_equal(md_wire_connect("127.0.0.1", port, 1000, &cfd, &e), MD_EIO);
    assert_non_null(strstr(e.msg, "refused"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_layout_is_the_documented_one),
        cmocka_unit_test(test_hello_round_trips_every_field),
        cmocka_unit_test(test_ready_error_result_round_trip),
        cmocka_unit_test(test_run_round_trips_with_and_without_hidden),
        cmocka_unit_test(test_every_truncated_run_is_refused),
        cmocka_unit_test(test_run_counts_that_lie_are_refused),
        cmocka_unit_test(test_every_header_bit_flip_is_caught),
        cmocka_unit_test(test_other_versions_types_and_sizes_are_refused),
        cmocka_unit_test(test_handshake_is_signed_and_checked),
        cmocka_unit_test(test_mac_is_the_documented_hmac_sha256),
        cmocka_unit_test(test_secret_file_rules),
        cmocka_unit_test(test_limits_refuse_frames_too_large),
        cmocka_unit_test(test_hello_with_bad_fields_is_refused),
        cmocka_unit_test(test_hello_tells_f32_from_the_backends_kv_type),
        cmocka_unit_test(test_ready_for_another_model_or_range_is_refused),
        cmocka_unit_test(test_random_bytes_never_decode_into_nonsense),
        cmocka_unit_test(test_frames_over_a_socket),
        cmocka_unit_test(test_connect_and_listen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
