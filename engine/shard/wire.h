/* wire.h — the stage link's wire format (docs/sharding.md "Transports"): the frames a head
 * and a `medley stage` process exchange over TCP (engine/shard/link_tcp.c,
 * engine/shard/stage_server.c). Pure encoding and decoding over byte buffers, no sockets
 * (engine/shard/wire_io.h moves frames), so every decoder can be fed hostile bytes in a test.
 *
 * A frame is a 32-byte header and a payload, every integer little-endian:
 *
 *   off size
 *     0   4  magic 0x5453444D ("MDST" read as bytes)
 *     4   2  version (2)
 *     6   2  type: HELLO 1, READY 2, RUN 3, RESULT 4, ERROR 5, CHALLENGE 6, PING 7
 *     8   8  payload length in bytes
 *    16   4  CRC-32 (zlib) of the payload
 *    20   4  sequence number: the micro-batch number of a RUN, echoed by its RESULT or ERROR
 *    24   4  reserved, 0
 *    28   4  CRC-32 of bytes 0..27
 *
 * A conversation: stage -> CHALLENGE as soon as it accepts; head -> HELLO, signed with the
 * replica's secret over the CHALLENGE's nonce (engine/shard/stage_auth.h); stage -> READY,
 * signed too (or ERROR, and the stage closes); then head -> RUN, stage -> RESULT (or ERROR,
 * and the stage closes), as many times as the head likes, the head sending PING when it has
 * had nothing to send for a third of the READY's idle_ms. HELLO is at most MD_WIRE_HELLO_MAX;
 * READY, CHALLENGE and ERROR at most MD_WIRE_SMALL_MAX; PING is empty; RUN and RESULT are
 * bounded by what the HELLO's sizes allow (md_wire_limits), which both ends compute the same
 * way, so a receiver refuses an oversized frame from its header, before reading the payload.
 *
 * Payloads (i32 / u32 / u64 little-endian; str = u32 length + that many bytes, no NUL;
 * nonce and mac = 32 bytes; docs/sharding.md "Wire format" says the same field by field):
 *   CHALLENGE u32 scheme (1 = HMAC-SHA256), nonce stage_nonce
 *   HELLO   str model, u64 model_hash, i32 lo, hi, str device, i32 n_threads, tp, n_slots,
 *           kv_type, max_tokens, max_seqs, max_blocks, block_tokens, n_ctx, u64 mem_cap,
 *           i32 n_vocab, n_embd (what the head expects; 0 = unknown), nonce head_nonce,
 *           mac = HMAC-SHA256(secret, "MDST HELLO v2" | stage_nonce | the bytes before it)
 *   READY   u64 model_hash, i32 lo, hi, n_layer, n_embd, n_vocab, str describe, i32 idle_ms,
 *           mac = HMAC-SHA256(secret, "MDST READY v2" | head_nonce | stage_nonce | the
 *           bytes before it)
 *   RUN     i32 n_tokens T, n_seqs S, n_logits L, max_blocks B, block_tokens, flags (1 =
 *           argmax only: md_batch.argmax_only), then i32 arrays
 *           tokens, tok_seq, tok_pos, slot [T], seq_len [S], block_table [S * B],
 *           logit_rows [L], then, for a stage with lo > 0, F32 hidden [T, n_embd]
 *   RESULT  F32 [T, n_embd] (an inner stage) or [L, n_vocab] (the last), or [L] argmax ids
 *           as F32 (the last, for a RUN with flags 1)
 *   ERROR   i32 code (an MD_E* of common/err.h), str message
 *   PING    (empty)
 *
 * Errors: every decoder checks each count against the bytes it has and the limits it is
 * given and answers MD_EFORMAT with a sentence naming the frame and the field; nothing here
 * reads outside the buffer it is given. Ownership: md_wire_buf is the caller's (free with
 * md_wire_buf_free); decoded arrays point into the caller's payload buffer. */
#ifndef MEDLEY_ENGINE_WIRE_H
#define MEDLEY_ENGINE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/shard/stage.h"
#include "engine/shard/stage_auth.h"
#include "kernels/backend.h"

#define MD_WIRE_MAGIC 0x5453444Du
#define MD_WIRE_VERSION 2
#define MD_WIRE_HDR 32
#define MD_WIRE_SMALL_MAX 65536u                        /* READY, ERROR, CHALLENGE payloads */
#define MD_WIRE_HELLO_MAX 4096u                         /* a HELLO payload */
#define MD_WIRE_PAYLOAD_MAX (4ull * 1024 * 1024 * 1024) /* any RUN or RESULT */
#define MD_WIRE_MSG_MAX 1024                            /* an ERROR's message, bytes */
#define MD_WIRE_DESC_MAX 256 /* a READY's describe string, bytes with the NUL */

enum {
    MD_WIRE_HELLO = 1,
    MD_WIRE_READY = 2,
    MD_WIRE_RUN = 3,
    MD_WIRE_RESULT = 4,
    MD_WIRE_ERROR = 5,
    MD_WIRE_CHALLENGE = 6,
    MD_WIRE_PING = 7,
};
#define MD_WIRE_TYPE_LAST MD_WIRE_PING
#define MD_WIRE_AUTH_HMAC_SHA256 1 /* CHALLENGE scheme */

/* The handshake's secret and nonces: the stage's from its CHALLENGE, the head's from its
 * HELLO. Signing and checking HELLO and READY need all three. */
typedef struct {
    const md_stage_secret *secret;
    uint8_t stage_nonce[MD_STAGE_NONCE];
    uint8_t head_nonce[MD_STAGE_NONCE];
} md_wire_auth;

/* "HELLO", "READY", ...; "unknown" for anything else. */
const char *md_wire_type_name(int type);

/* A decoded header. */
typedef struct {
    int type;
    uint32_t seq;
    uint64_t len; /* payload bytes */
    uint32_t crc; /* of the payload */
} md_wire_hdr;

/* A growable byte buffer; frames are built in it (header at 0, payload at MD_WIRE_HDR) and
 * payloads received into it. Grows only, so a link that has seen its largest step no longer
 * allocates. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} md_wire_buf;

int md_wire_buf_reserve(md_wire_buf *b, size_t cap, md_err *e);
void md_wire_buf_free(md_wire_buf *b);

/* CRC-32 (zlib's) of n bytes, any n. */
uint32_t md_wire_crc(const void *p, size_t n);

/* Header: md_wire_hdr_put writes the 32 bytes; md_wire_hdr_get checks magic, header CRC,
 * version, reserved bytes and type (MD_EFORMAT naming the first fault, MD_EUNSUPP for another
 * version); md_wire_hdr_check then refuses a type outside `allowed` (a mask of 1 << type) and
 * a length over its type's limit (max_payload for RUN and RESULT, MD_WIRE_HELLO_MAX for HELLO,
 * 0 for PING, MD_WIRE_SMALL_MAX for the others); md_wire_payload_check compares the payload's CRC.
 */
void md_wire_hdr_put(uint8_t h[MD_WIRE_HDR], int type, uint32_t seq, uint64_t len, uint32_t crc);
int md_wire_hdr_get(const uint8_t h[MD_WIRE_HDR], md_wire_hdr *out, md_err *e);
int md_wire_hdr_check(const md_wire_hdr *h, unsigned allowed, uint64_t max_payload, md_err *e);
int md_wire_payload_check(const md_wire_hdr *h, const void *payload, md_err *e);

/* What a RUN and a RESULT may hold once the HELLO fixed the sizes. */
typedef struct {
    int max_tokens, max_seqs, max_blocks;
    int hidden; /* floats per token a RUN carries: n_embd for a stage with lo > 0, else 0 */
    uint64_t max_payload; /* the largest RUN or RESULT payload */
} md_wire_limits;

/* Limits of a stage c of a model of n_embd and n_vocab; MD_ERANGE when its frames would
 * exceed MD_WIRE_PAYLOAD_MAX. */
int md_wire_limits_for(const md_stage_config *c, int n_embd, int n_vocab, md_wire_limits *l,
                       md_err *e);

/* Encoders: the whole frame into b (b->len = MD_WIRE_HDR + payload), growing it when needed
 * (MD_ENOMEM). */
int md_wire_put_challenge(md_wire_buf *b, const uint8_t nonce[MD_STAGE_NONCE], md_err *e);
/* Signed with a's secret over a->stage_nonce, carrying a->head_nonce. */
int md_wire_put_hello(md_wire_buf *b, const md_stage_config *c, int n_vocab, int n_embd,
                      const md_wire_auth *a, md_err *e);
typedef struct {
    uint64_t model_hash;
    int lo, hi, n_layer, n_embd, n_vocab;
    char describe[MD_WIRE_DESC_MAX];
    int idle_ms; /* the stage drops a head silent for longer; it pings at a third of it */
} md_wire_ready;
/* Signed with a's secret over both nonces. */
int md_wire_put_ready(md_wire_buf *b, const md_wire_ready *r, const md_wire_auth *a, md_err *e);
int md_wire_put_ping(md_wire_buf *b, md_err *e);
/* hidden [T, n_hidden] F32, or NULL with n_hidden 0 (a first stage). */
int md_wire_put_run(md_wire_buf *b, uint32_t seq, const md_batch *bt, const float *hidden,
                    int n_hidden, md_err *e);
int md_wire_put_error(md_wire_buf *b, uint32_t seq, int code, const char *msg, md_err *e);
/* RESULT in two steps, so a stage writes its output straight into the frame:
 * md_wire_result_begin sizes b for n floats and returns where they go (4-byte aligned);
 * md_wire_result_end writes the header once they are there. */
float *md_wire_result_begin(md_wire_buf *b, size_t n, md_err *e);
void md_wire_result_end(md_wire_buf *b, uint32_t seq);

/* Decoders over a payload of n bytes (its CRC already checked). */

/* A CHALLENGE's nonce; MD_EUNSUPP for a scheme other than HMAC-SHA256. */
int md_wire_get_challenge(const uint8_t *p, size_t n, uint8_t nonce[MD_STAGE_NONCE], md_err *e);
/* Whether HELLO payload p was signed with a's secret over a->stage_nonce: 0 (and the head's
 * nonce into a->head_nonce), else MD_EINVAL "authentication failed: ...". Reads no field but
 * the last 64 bytes, so nothing a stranger sends is looked at before this passes. */
int md_wire_hello_verify(const uint8_t *p, size_t n, md_wire_auth *a, md_err *e);
/* c and the head's n_vocab, n_embd from a HELLO (its nonce and MAC are skipped: check them
 * with md_wire_hello_verify first). Checks every size against sane bounds (layers, threads,
 * slots, token counts) and that the strings fit c's fields. */
int md_wire_get_hello(const uint8_t *p, size_t n, md_stage_config *c, int *n_vocab, int *n_embd,
                      md_err *e);
/* A READY, its MAC checked against a (MD_EINVAL: signed with another secret, or for another
 * handshake), its layers a range of its n_layer. */
int md_wire_get_ready(const uint8_t *p, size_t n, const md_wire_auth *a, md_wire_ready *r,
                      md_err *e);
/* The READY r a stage at `where` ("tcp://h:p layers 0-3") answered to a HELLO of c (and the
 * head's n_embd, n_vocab, 0 = unknown) against what was asked: model hash (when c's is not
 * 0), layers, widths. MD_EINVAL saying what differs. */
int md_wire_ready_check(const md_wire_ready *r, const md_stage_config *c, int n_embd, int n_vocab,
                        const char *where, md_err *e);
/* A RUN: counts within l, the payload exactly as long as they say. The arrays of *bt and
 * *hidden (NULL when l->hidden is 0) point into p, which must be 4-byte aligned (a malloc'd
 * receive buffer is; MD_EINVAL otherwise). bt is not yet checked against the stage
 * (md_batch_check). */
int md_wire_get_run(const uint8_t *p, size_t n, const md_wire_limits *l, md_batch *bt,
                    const float **hidden, md_err *e);
/* A RESULT of exactly n_out floats into out (out may be p itself: nothing is then copied). */
int md_wire_get_result(const uint8_t *p, size_t n, float *out, size_t n_out, md_err *e);
/* An ERROR: its code (a negative MD_E*, else MD_EIO) and message into msg (NUL-terminated,
 * cut to msgsz). */
int md_wire_get_error(const uint8_t *p, size_t n, int *code, char *msg, size_t msgsz, md_err *e);

#endif
