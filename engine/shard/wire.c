/* wire.c — encoding and decoding the stage link's frames. See wire.h for the layout.
 *
 * Integers are written and read byte by byte (little-endian whatever the host); the int32
 * and float arrays of RUN and RESULT are copied or pointed at as they are, which is their
 * little-endian layout on the hosts medley runs on (GGUF weights are mapped the same way). */
#include "engine/shard/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "wire.c reads int32 and float arrays in place: little-endian hosts only");
_Static_assert(sizeof(float) == 4, "F32 payloads");

/* Bounds a HELLO's sizes must keep; far above any real model, low enough that products of
 * them stay far inside 64 bits. */
#define MAX_LAYERS 4096
#define MAX_THREADS 4096
#define MAX_SLOTS (1 << 30)
#define MAX_TOKENS (1 << 20)
#define MAX_BLOCKS (1 << 24)
#define MAX_BLOCK_TOKENS (1 << 16)
#define MAX_CTX (1 << 24)
#define MAX_VOCAB (1 << 24)
#define MAX_EMBD (1 << 20)
#define MAX_KV_TYPE 255

/* RUN's fixed part: n_tokens, n_seqs, n_logits, max_blocks, block_tokens, flags. */
#define RUN_HEAD 24
#define RUN_ARGMAX 1u /* flags: the last stage answers argmax ids (md_batch.argmax_only) */

const char *md_wire_type_name(int type) {
    static const char *names[] = {NULL,     "HELLO", "READY",     "RUN",
                                  "RESULT", "ERROR", "CHALLENGE", "PING"};
    return type >= MD_WIRE_HELLO && type <= MD_WIRE_TYPE_LAST ? names[type] : "unknown";
}

int md_wire_buf_reserve(md_wire_buf *b, size_t cap, md_err *e) {
    if (cap <= b->cap)
        return 0;
    size_t want = b->cap ? b->cap : 4096;
    while (want < cap)
        want = want > SIZE_MAX / 2 ? cap : want * 2;
    uint8_t *p = realloc(b->p, want);
    if (!p)
        return md_errf(e, MD_ENOMEM, "wire buffer: cannot allocate %zu bytes", want);
    b->p = p;
    b->cap = want;
    return 0;
}

void md_wire_buf_free(md_wire_buf *b) {
    free(b->p);
    *b = (md_wire_buf){0};
}

uint32_t md_wire_crc(const void *p, size_t n) {
    const uint8_t *q = p;
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, q, k);
        q += k;
        n -= k;
    }
    return (uint32_t)c;
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

void md_wire_hdr_put(uint8_t h[MD_WIRE_HDR], int type, uint32_t seq, uint64_t len, uint32_t crc) {
    put32(h, MD_WIRE_MAGIC);
    put16(h + 4, MD_WIRE_VERSION);
    put16(h + 6, (uint16_t)type);
    put64(h + 8, len);
    put32(h + 16, crc);
    put32(h + 20, seq);
    put32(h + 24, 0);
    put32(h + 28, md_wire_crc(h, 28));
}

int md_wire_hdr_get(const uint8_t h[MD_WIRE_HDR], md_wire_hdr *out, md_err *e) {
    uint32_t magic = get32(h);
    if (magic != MD_WIRE_MAGIC)
        return md_errf(e, MD_EFORMAT,
                       "not a medley stage frame: magic 0x%08x, expected 0x%08x (\"MDST\")", magic,
                       MD_WIRE_MAGIC);
    uint32_t hcrc = get32(h + 28), want = md_wire_crc(h, 28);
    if (hcrc != want)
        return md_errf(e, MD_EFORMAT, "frame header corrupt: CRC 0x%08x, computed 0x%08x", hcrc,
                       want);
    int version = get16(h + 4);
    if (version != MD_WIRE_VERSION)
        return md_errf(e, MD_EUNSUPP,
                       "stage frame version %d, this medley speaks version %d (run the same "
                       "medley release on the head and the stages)",
                       version, MD_WIRE_VERSION);
    int type = get16(h + 6);
    if (type < MD_WIRE_HELLO || type > MD_WIRE_TYPE_LAST)
        return md_errf(e, MD_EFORMAT, "frame of unknown type %d", type);
    if (get32(h + 24) != 0)
        return md_errf(e, MD_EFORMAT, "%s frame: reserved header bytes are 0x%08x, not 0",
                       md_wire_type_name(type), get32(h + 24));
    *out = (md_wire_hdr){
        .type = type, .seq = get32(h + 20), .len = get64(h + 8), .crc = get32(h + 16)};
    return 0;
}

int md_wire_hdr_check(const md_wire_hdr *h, unsigned allowed, uint64_t max_payload, md_err *e) {
    if (h->type < MD_WIRE_HELLO || h->type > MD_WIRE_TYPE_LAST || !(allowed & (1u << h->type))) {
        char list[96] = "";
        size_t used = 0;
        for (int t = MD_WIRE_HELLO; t <= MD_WIRE_TYPE_LAST; t++)
            if (allowed & (1u << t))
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                         used ? " or " : "", md_wire_type_name(t));
        return md_errf(e, MD_EFORMAT, "unexpected %s frame (expected %s)",
                       md_wire_type_name(h->type), used ? list : "none");
    }
    uint64_t limit = h->type == MD_WIRE_RUN || h->type == MD_WIRE_RESULT ? max_payload
                     : h->type == MD_WIRE_HELLO                          ? MD_WIRE_HELLO_MAX
                     : h->type == MD_WIRE_PING                           ? 0
                                                                         : MD_WIRE_SMALL_MAX;
    if (h->len > limit)
        return md_errf(e, MD_EFORMAT, "%s frame of %llu bytes exceeds the limit of %llu",
                       md_wire_type_name(h->type), (unsigned long long)h->len,
                       (unsigned long long)limit);
    return 0;
}

int md_wire_payload_check(const md_wire_hdr *h, const void *payload, md_err *e) {
    uint32_t c = md_wire_crc(payload, (size_t)h->len);
    if (c != h->crc)
        return md_errf(e, MD_EFORMAT, "%s frame payload corrupt: CRC 0x%08x, header says 0x%08x",
                       md_wire_type_name(h->type), c, h->crc);
    return 0;
}

static uint64_t run_bytes(uint64_t T, uint64_t S, uint64_t L, uint64_t B, uint64_t hidden) {
    return RUN_HEAD + 4 * (4 * T + S + S * B + L) + 4 * T * hidden;
}

int md_wire_limits_for(const md_stage_config *c, int n_embd, int n_vocab, md_wire_limits *l,
                       md_err *e) {
    if (c->max_tokens < 1 || c->max_tokens > MAX_TOKENS || c->max_seqs < 1 ||
        c->max_seqs > MAX_TOKENS || c->max_blocks < 1 || c->max_blocks > MAX_BLOCKS || n_embd < 1 ||
        n_embd > MAX_EMBD || n_vocab < 1 || n_vocab > MAX_VOCAB)
        return md_errf(e, MD_EINVAL,
                       "stage frame sizes out of range: max_tokens %d, max_seqs %d, max_blocks "
                       "%d, n_embd %d, n_vocab %d",
                       c->max_tokens, c->max_seqs, c->max_blocks, n_embd, n_vocab);
    uint64_t T = (uint64_t)c->max_tokens, S = (uint64_t)c->max_seqs;
    int hidden = c->lo > 0 ? n_embd : 0;
    uint64_t run = run_bytes(T, S, S, (uint64_t)c->max_blocks, (uint64_t)hidden);
    uint64_t hid = 4 * T * (uint64_t)n_embd, logits = 4 * S * (uint64_t)n_vocab;
    uint64_t max = run;
    if (hid > max)
        max = hid;
    if (logits > max)
        max = logits;
    if (max > MD_WIRE_PAYLOAD_MAX || max > SIZE_MAX)
        return md_errf(e, MD_ERANGE,
                       "stage frames would reach %llu bytes (max_tokens %d, max_seqs %d, n_embd "
                       "%d, n_vocab %d); the wire allows %llu",
                       (unsigned long long)max, c->max_tokens, c->max_seqs, n_embd, n_vocab,
                       (unsigned long long)MD_WIRE_PAYLOAD_MAX);
    *l = (md_wire_limits){.max_tokens = c->max_tokens,
                          .max_seqs = c->max_seqs,
                          .max_blocks = c->max_blocks,
                          .hidden = hidden,
                          .max_payload = max};
    return 0;
}

/* Writing: the caller reserves the exact size first, so the puts cannot fail. */
typedef struct {
    uint8_t *p;
    size_t off;
} wr;

static void w32(wr *w, uint32_t v) {
    put32(w->p + w->off, v);
    w->off += 4;
}
static void w64(wr *w, uint64_t v) {
    put64(w->p + w->off, v);
    w->off += 8;
}
static void wi32(wr *w, int v) {
    w32(w, (uint32_t)v);
}
static void wbytes(wr *w, const void *src, size_t n) {
    if (n)
        memcpy(w->p + w->off, src, n);
    w->off += n;
}
static void wstr(wr *w, const char *s, size_t n) {
    w32(w, (uint32_t)n);
    wbytes(w, s, n);
}

/* Start a frame of payload n bytes in b; the payload goes at b->p + MD_WIRE_HDR. */
static int frame_begin(md_wire_buf *b, size_t n, wr *w, md_err *e) {
    *w = (wr){0};
    if (n > SIZE_MAX - MD_WIRE_HDR)
        return md_errf(e, MD_ERANGE, "stage frame of %zu bytes is too large", n);
    int rc = md_wire_buf_reserve(b, MD_WIRE_HDR + n, e);
    if (rc)
        return rc;
    b->len = MD_WIRE_HDR + n;
    *w = (wr){.p = b->p + MD_WIRE_HDR, .off = 0};
    return 0;
}

static void frame_end(md_wire_buf *b, int type, uint32_t seq) {
    size_t n = b->len - MD_WIRE_HDR;
    md_wire_hdr_put(b->p, type, seq, n, md_wire_crc(b->p + MD_WIRE_HDR, n));
}

/* A string field's bytes, bounded by its C field's size (a model or device name from a
 * md_stage_config is NUL-terminated within it). */
static size_t field_len(const char *s, size_t cap) {
    return strnlen(s, cap);
}

/* Sign the payload of the frame in b, whose last MD_STAGE_MAC bytes are the MAC's place, and
 * seal the frame as type. */
static int sign_frame(md_wire_buf *b, int type, const md_wire_auth *a, const char *label,
                      const uint8_t *n1, const uint8_t *n2, md_err *e) {
    size_t n = b->len - MD_WIRE_HDR - MD_STAGE_MAC;
    uint8_t *p = b->p + MD_WIRE_HDR;
    if (!a || !a->secret || md_stage_mac(a->secret, label, n1, n2, p, n, p + n))
        return md_errf(e, MD_EINVAL, "%s: no stage secret to sign it with",
                       md_wire_type_name(type));
    frame_end(b, type, 0);
    return 0;
}

int md_wire_put_challenge(md_wire_buf *b, const uint8_t nonce[MD_STAGE_NONCE], md_err *e) {
    wr w;
    int rc = frame_begin(b, 4 + MD_STAGE_NONCE, &w, e);
    if (rc)
        return rc;
    w32(&w, MD_WIRE_AUTH_HMAC_SHA256);
    wbytes(&w, nonce, MD_STAGE_NONCE);
    frame_end(b, MD_WIRE_CHALLENGE, 0);
    return 0;
}

int md_wire_put_ping(md_wire_buf *b, md_err *e) {
    wr w;
    int rc = frame_begin(b, 0, &w, e);
    if (rc)
        return rc;
    frame_end(b, MD_WIRE_PING, 0);
    return 0;
}

int md_wire_put_hello(md_wire_buf *b, const md_stage_config *c, int n_vocab, int n_embd,
                      const md_wire_auth *a, md_err *e) {
    size_t lm = field_len(c->model, sizeof c->model), ld = field_len(c->device, sizeof c->device);
    if (lm == sizeof c->model || ld == sizeof c->device)
        return md_errf(e, MD_EINVAL, "HELLO: the model or device name is not NUL-terminated");
    wr w;
    int rc = frame_begin(b, 4 + lm + 8 + 8 + 4 + ld + 9 * 4 + 8 + 8 + MD_STAGE_NONCE + MD_STAGE_MAC,
                         &w, e);
    if (rc)
        return rc;
    wstr(&w, c->model, lm);
    w64(&w, c->model_hash);
    wi32(&w, c->lo);
    wi32(&w, c->hi);
    wstr(&w, c->device, ld);
    wi32(&w, c->n_threads);
    wi32(&w, c->tp);
    wi32(&w, c->n_slots);
    wi32(&w, c->kv_type);
    wi32(&w, c->max_tokens);
    wi32(&w, c->max_seqs);
    wi32(&w, c->max_blocks);
    wi32(&w, c->block_tokens);
    wi32(&w, c->n_ctx);
    w64(&w, (uint64_t)c->mem_cap);
    wi32(&w, n_vocab);
    wi32(&w, n_embd);
    wbytes(&w, a ? a->head_nonce : (const uint8_t[MD_STAGE_NONCE]){0}, MD_STAGE_NONCE);
    return sign_frame(b, MD_WIRE_HELLO, a, "MDST HELLO v2", a ? a->stage_nonce : NULL, NULL, e);
}

int md_wire_put_ready(md_wire_buf *b, const md_wire_ready *r, const md_wire_auth *a, md_err *e) {
    size_t ld = field_len(r->describe, sizeof r->describe - 1);
    wr w;
    int rc = frame_begin(b, 8 + 5 * 4 + 4 + ld + 4 + MD_STAGE_MAC, &w, e);
    if (rc)
        return rc;
    w64(&w, r->model_hash);
    wi32(&w, r->lo);
    wi32(&w, r->hi);
    wi32(&w, r->n_layer);
    wi32(&w, r->n_embd);
    wi32(&w, r->n_vocab);
    wstr(&w, r->describe, ld);
    wi32(&w, r->idle_ms);
    return sign_frame(b, MD_WIRE_READY, a, "MDST READY v2", a ? a->head_nonce : NULL,
                      a ? a->stage_nonce : NULL, e);
}

int md_wire_put_run(md_wire_buf *b, uint32_t seq, const md_batch *bt, const float *hidden,
                    int n_hidden, md_err *e) {
    if (bt->n_tokens < 0 || bt->n_seqs < 0 || bt->n_logits < 0 || bt->max_blocks < 0 ||
        n_hidden < 0 || (n_hidden > 0 && !hidden))
        return md_errf(e, MD_EINVAL,
                       "RUN: negative counts (n_tokens %d, n_seqs %d, n_logits %d, max_blocks "
                       "%d) or hidden states missing",
                       bt->n_tokens, bt->n_seqs, bt->n_logits, bt->max_blocks);
    size_t T = (size_t)bt->n_tokens, S = (size_t)bt->n_seqs, L = (size_t)bt->n_logits,
           B = (size_t)bt->max_blocks;
    wr w;
    int rc = frame_begin(b, (size_t)run_bytes(T, S, L, B, (uint64_t)n_hidden), &w, e);
    if (rc)
        return rc;
    wi32(&w, bt->n_tokens);
    wi32(&w, bt->n_seqs);
    wi32(&w, bt->n_logits);
    wi32(&w, bt->max_blocks);
    wi32(&w, bt->block_tokens);
    wi32(&w, bt->argmax_only ? (int32_t)RUN_ARGMAX : 0);
    wbytes(&w, bt->tokens, 4 * T);
    wbytes(&w, bt->tok_seq, 4 * T);
    wbytes(&w, bt->tok_pos, 4 * T);
    wbytes(&w, bt->slot, 4 * T);
    wbytes(&w, bt->seq_len, 4 * S);
    wbytes(&w, bt->block_table, 4 * S * B);
    wbytes(&w, bt->logit_rows, 4 * L);
    wbytes(&w, hidden, 4 * T * (size_t)n_hidden);
    frame_end(b, MD_WIRE_RUN, seq);
    return 0;
}

int md_wire_put_error(md_wire_buf *b, uint32_t seq, int code, const char *msg, md_err *e) {
    size_t lm = strnlen(msg, MD_WIRE_MSG_MAX);
    wr w;
    int rc = frame_begin(b, 4 + 4 + lm, &w, e);
    if (rc)
        return rc;
    wi32(&w, code);
    wstr(&w, msg, lm);
    frame_end(b, MD_WIRE_ERROR, seq);
    return 0;
}

float *md_wire_result_begin(md_wire_buf *b, size_t n, md_err *e) {
    wr w;
    if (n > (SIZE_MAX - MD_WIRE_HDR) / 4) {
        md_errf(e, MD_ERANGE, "RESULT of %zu floats is too large", n);
        return NULL;
    }
    if (frame_begin(b, 4 * n, &w, e))
        return NULL;
    return (float *)(void *)w.p; /* malloc'd + 32: aligned for float */
}

void md_wire_result_end(md_wire_buf *b, uint32_t seq) {
    frame_end(b, MD_WIRE_RESULT, seq);
}

/* Reading: every field checked against what is left. */
typedef struct {
    const uint8_t *p;
    size_t n, off;
    const char *frame; /* "HELLO", ... for messages */
    md_err *e;
} rd;

static int need(rd *r, const char *field, size_t k) {
    if (k > r->n - r->off)
        return md_errf(r->e, MD_EFORMAT,
                       "%s frame cut short: %s needs %zu bytes at offset %zu, the payload has %zu",
                       r->frame, field, k, r->off, r->n);
    return 0;
}

static int rd_u32(rd *r, const char *field, uint32_t *v) {
    int rc = need(r, field, 4);
    if (rc)
        return rc;
    *v = get32(r->p + r->off);
    r->off += 4;
    return 0;
}

static int rd_u64(rd *r, const char *field, uint64_t *v) {
    int rc = need(r, field, 8);
    if (rc)
        return rc;
    *v = get64(r->p + r->off);
    r->off += 8;
    return 0;
}

/* An int32 field that must lie in [lo, hi]. */
static int rd_int(rd *r, const char *field, int lo, int hi, int *v) {
    uint32_t u;
    int rc = rd_u32(r, field, &u);
    if (rc)
        return rc;
    int32_t x = (int32_t)u;
    if (x < lo || x > hi)
        return md_errf(r->e, MD_EFORMAT, "%s frame: %s = %d is outside %d..%d", r->frame, field,
                       (int)x, lo, hi);
    *v = x;
    return 0;
}

/* A string field into dst (cap bytes with the NUL); no NUL bytes inside. */
static int rd_str(rd *r, const char *field, char *dst, size_t cap) {
    uint32_t len;
    int rc = rd_u32(r, field, &len);
    if (rc)
        return rc;
    if (len >= cap)
        return md_errf(r->e, MD_EFORMAT, "%s frame: %s of %u bytes, at most %zu allowed", r->frame,
                       field, len, cap - 1);
    if ((rc = need(r, field, len)))
        return rc;
    if (memchr(r->p + r->off, 0, len))
        return md_errf(r->e, MD_EFORMAT, "%s frame: %s holds a NUL byte", r->frame, field);
    memcpy(dst, r->p + r->off, len);
    dst[len] = '\0';
    r->off += len;
    return 0;
}

static int rd_end(rd *r) {
    if (r->off != r->n)
        return md_errf(r->e, MD_EFORMAT, "%s frame: %zu bytes left over after its last field",
                       r->frame, r->n - r->off);
    return 0;
}

int md_wire_get_hello(const uint8_t *p, size_t n, md_stage_config *c, int *n_vocab, int *n_embd,
                      md_err *e) {
    rd r = {.p = p, .n = n, .frame = "HELLO", .e = e};
    md_stage_config x = {0};
    uint64_t cap;
    int vocab, embd, rc;
    if ((rc = rd_str(&r, "model", x.model, sizeof x.model)) ||
        (rc = rd_u64(&r, "model_hash", &x.model_hash)) ||
        (rc = rd_int(&r, "lo", 0, MAX_LAYERS - 1, &x.lo)) ||
        (rc = rd_int(&r, "hi", 1, MAX_LAYERS, &x.hi)) ||
        (rc = rd_str(&r, "device", x.device, sizeof x.device)) ||
        (rc = rd_int(&r, "n_threads", 0, MAX_THREADS, &x.n_threads)) ||
        (rc = rd_int(&r, "tp", 0, MD_TP_MAX, &x.tp)) ||
        (rc = rd_int(&r, "n_slots", 1, MAX_SLOTS, &x.n_slots)) ||
        (rc = rd_int(&r, "kv_type", MD_STAGE_KV_F32, MAX_KV_TYPE, &x.kv_type)) ||
        (rc = rd_int(&r, "max_tokens", 1, MAX_TOKENS, &x.max_tokens)) ||
        (rc = rd_int(&r, "max_seqs", 1, MAX_TOKENS, &x.max_seqs)) ||
        (rc = rd_int(&r, "max_blocks", 1, MAX_BLOCKS, &x.max_blocks)) ||
        (rc = rd_int(&r, "block_tokens", 1, MAX_BLOCK_TOKENS, &x.block_tokens)) ||
        (rc = rd_int(&r, "n_ctx", 1, MAX_CTX, &x.n_ctx)) || (rc = rd_u64(&r, "mem_cap", &cap)) ||
        (rc = rd_int(&r, "n_vocab", 0, MAX_VOCAB, &vocab)) ||
        (rc = rd_int(&r, "n_embd", 0, MAX_EMBD, &embd)) ||
        (rc = need(&r, "head_nonce and mac", MD_STAGE_NONCE + MD_STAGE_MAC)))
        return rc;
    r.off += MD_STAGE_NONCE + MD_STAGE_MAC;
    if ((rc = rd_end(&r)))
        return rc;
    if (x.hi <= x.lo)
        return md_errf(e, MD_EFORMAT, "HELLO frame: empty layer range [%d, %d)", x.lo, x.hi);
    if (!x.model[0])
        return md_errf(e, MD_EFORMAT, "HELLO frame: no model named");
    if (cap > SIZE_MAX)
        return md_errf(e, MD_EFORMAT, "HELLO frame: mem_cap %llu does not fit this host",
                       (unsigned long long)cap);
    x.mem_cap = (size_t)cap;
    *c = x;
    *n_vocab = vocab;
    *n_embd = embd;
    return 0;
}

int md_wire_get_challenge(const uint8_t *p, size_t n, uint8_t nonce[MD_STAGE_NONCE], md_err *e) {
    rd r = {.p = p, .n = n, .frame = "CHALLENGE", .e = e};
    uint32_t scheme;
    int rc;
    if ((rc = rd_u32(&r, "scheme", &scheme)))
        return rc;
    if (scheme != MD_WIRE_AUTH_HMAC_SHA256)
        return md_errf(e, MD_EUNSUPP,
                       "CHALLENGE frame: authentication scheme %u, this medley knows %d "
                       "(HMAC-SHA256)",
                       scheme, MD_WIRE_AUTH_HMAC_SHA256);
    if ((rc = need(&r, "nonce", MD_STAGE_NONCE)))
        return rc;
    memcpy(nonce, p + r.off, MD_STAGE_NONCE);
    r.off += MD_STAGE_NONCE;
    return rd_end(&r);
}

/* Whether the last MD_STAGE_MAC bytes of p[0..n) are the MAC of the rest under a. */
static int mac_ok(const uint8_t *p, size_t n, const md_wire_auth *a, const char *label,
                  const uint8_t *n1, const uint8_t *n2) {
    uint8_t want[MD_STAGE_MAC];
    if (!a || !a->secret || n < MD_STAGE_MAC ||
        md_stage_mac(a->secret, label, n1, n2, p, n - MD_STAGE_MAC, want))
        return 0;
    return md_stage_mac_equal(want, p + n - MD_STAGE_MAC);
}

int md_wire_hello_verify(const uint8_t *p, size_t n, md_wire_auth *a, md_err *e) {
    if (n < MD_STAGE_NONCE + MD_STAGE_MAC ||
        !mac_ok(p, n, a, "MDST HELLO v2", a ? a->stage_nonce : NULL, NULL))
        return md_errf(e, MD_EINVAL,
                       "authentication failed: the HELLO is not signed with this stage's secret "
                       "over its challenge");
    memcpy(a->head_nonce, p + n - MD_STAGE_MAC - MD_STAGE_NONCE, MD_STAGE_NONCE);
    return 0;
}

int md_wire_get_ready(const uint8_t *p, size_t n, const md_wire_auth *a, md_wire_ready *out,
                      md_err *e) {
    if (!mac_ok(p, n, a, "MDST READY v2", a ? a->head_nonce : NULL, a ? a->stage_nonce : NULL))
        return md_errf(e, MD_EINVAL,
                       "READY frame not signed with the head's stage secret for this handshake "
                       "(the stage holds another secret)");
    rd r = {.p = p, .n = n - MD_STAGE_MAC, .frame = "READY", .e = e};
    md_wire_ready x = {0};
    int rc;
    if ((rc = rd_u64(&r, "model_hash", &x.model_hash)) ||
        (rc = rd_int(&r, "lo", 0, MAX_LAYERS - 1, &x.lo)) ||
        (rc = rd_int(&r, "hi", 1, MAX_LAYERS, &x.hi)) ||
        (rc = rd_int(&r, "n_layer", 1, MAX_LAYERS, &x.n_layer)) ||
        (rc = rd_int(&r, "n_embd", 1, MAX_EMBD, &x.n_embd)) ||
        (rc = rd_int(&r, "n_vocab", 1, MAX_VOCAB, &x.n_vocab)) ||
        (rc = rd_str(&r, "describe", x.describe, sizeof x.describe)) ||
        (rc = rd_int(&r, "idle_ms", 1, 86400000, &x.idle_ms)) || (rc = rd_end(&r)))
        return rc;
    if (x.hi <= x.lo || x.hi > x.n_layer)
        return md_errf(e, MD_EFORMAT, "READY frame: layers [%d, %d) of a %d-layer model", x.lo,
                       x.hi, x.n_layer);
    *out = x;
    return 0;
}

int md_wire_ready_check(const md_wire_ready *r, const md_stage_config *c, int n_embd, int n_vocab,
                        const char *where, md_err *e) {
    if (c->model_hash && r->model_hash != c->model_hash)
        return md_errf(
            e, MD_EINVAL, "stage %s answered with model hash %016llx, the head's %s is %016llx",
            where, (unsigned long long)r->model_hash, c->model, (unsigned long long)c->model_hash);
    if (r->lo != c->lo || r->hi != c->hi)
        return md_errf(e, MD_EINVAL, "stage %s answered for layers %d-%d, the head asked %d-%d",
                       where, r->lo, r->hi - 1, c->lo, c->hi - 1);
    if ((n_embd && r->n_embd != n_embd) || (n_vocab && r->n_vocab != n_vocab))
        return md_errf(e, MD_EINVAL,
                       "stage %s has n_embd %d and n_vocab %d, the head's model %d and %d", where,
                       r->n_embd, r->n_vocab, n_embd, n_vocab);
    return 0;
}

/* An int32 array of k entries at r's offset, in place. */
static int rd_arr(rd *r, const char *field, size_t k, const int32_t **out) {
    if (k > (r->n - r->off) / 4)
        return md_errf(r->e, MD_EFORMAT,
                       "%s frame cut short: %s needs %zu entries at offset %zu, the payload has "
                       "%zu bytes",
                       r->frame, field, k, r->off, r->n);
    *out = (const int32_t *)(const void *)(r->p + r->off);
    r->off += 4 * k;
    return 0;
}

int md_wire_get_run(const uint8_t *p, size_t n, const md_wire_limits *l, md_batch *bt,
                    const float **hidden, md_err *e) {
    if ((uintptr_t)p % 4)
        return md_errf(e, MD_EINVAL, "RUN payload at %p is not 4-byte aligned", (const void *)p);
    rd r = {.p = p, .n = n, .frame = "RUN", .e = e};
    md_batch x = {0};
    int rc;
    if ((rc = rd_int(&r, "n_tokens", 1, l->max_tokens, &x.n_tokens)) ||
        (rc = rd_int(&r, "n_seqs", 1, l->max_seqs, &x.n_seqs)) ||
        (rc = rd_int(&r, "n_logits", 0, l->max_seqs, &x.n_logits)) ||
        (rc = rd_int(&r, "max_blocks", 1, l->max_blocks, &x.max_blocks)) ||
        (rc = rd_int(&r, "block_tokens", 1, MAX_BLOCK_TOKENS, &x.block_tokens)) ||
        (rc = rd_int(&r, "flags", 0, (int)RUN_ARGMAX, &x.argmax_only)))
        return rc;
    size_t T = (size_t)x.n_tokens, S = (size_t)x.n_seqs;
    uint64_t want =
        run_bytes(T, S, (uint64_t)x.n_logits, (uint64_t)x.max_blocks, (uint64_t)l->hidden);
    if (want != n)
        return md_errf(e, MD_EFORMAT,
                       "RUN frame of %zu bytes, its counts (n_tokens %d, n_seqs %d, n_logits %d, "
                       "max_blocks %d%s) need %llu",
                       n, x.n_tokens, x.n_seqs, x.n_logits, x.max_blocks,
                       l->hidden ? ", with hidden states" : "", (unsigned long long)want);
    if ((rc = rd_arr(&r, "tokens", T, &x.tokens)) || (rc = rd_arr(&r, "tok_seq", T, &x.tok_seq)) ||
        (rc = rd_arr(&r, "tok_pos", T, &x.tok_pos)) || (rc = rd_arr(&r, "slot", T, &x.slot)) ||
        (rc = rd_arr(&r, "seq_len", S, &x.seq_len)) ||
        (rc = rd_arr(&r, "block_table", S * (size_t)x.max_blocks, &x.block_table)) ||
        (rc = rd_arr(&r, "logit_rows", (size_t)x.n_logits, &x.logit_rows)))
        return rc;
    const int32_t *h = NULL;
    if (l->hidden && (rc = rd_arr(&r, "hidden", T * (size_t)l->hidden, &h)))
        return rc;
    if ((rc = rd_end(&r)))
        return rc;
    *bt = x;
    *hidden = (const float *)(const void *)h;
    return 0;
}

int md_wire_get_result(const uint8_t *p, size_t n, float *out, size_t n_out, md_err *e) {
    if (n_out > SIZE_MAX / 4 || n != 4 * n_out)
        return md_errf(e, MD_EFORMAT, "RESULT frame of %zu bytes, expected %zu floats", n, n_out);
    if ((const void *)p != (const void *)out)
        memcpy(out, p, n);
    return 0;
}

int md_wire_get_error(const uint8_t *p, size_t n, int *code, char *msg, size_t msgsz, md_err *e) {
    rd r = {.p = p, .n = n, .frame = "ERROR", .e = e};
    char m[MD_WIRE_MSG_MAX + 1];
    uint32_t c;
    int rc;
    if ((rc = rd_u32(&r, "code", &c)) || (rc = rd_str(&r, "message", m, sizeof m)) ||
        (rc = rd_end(&r)))
        return rc;
    int32_t k = (int32_t)c;
    *code = k < 0 && k >= MD_ECANCEL ? k : MD_EIO;
    if (msgsz)
        snprintf(msg, msgsz, "%s", m);
    return 0;
}
