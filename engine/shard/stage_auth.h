/* stage_auth.h — how a head and a `medley stage` prove to each other that they hold the same
 * secret (docs/sharding.md "Authentication"): the secret file, the nonces and the HMAC-SHA256
 * (OpenSSL's libcrypto) of the handshake frames of engine/shard/wire.h.
 *
 * The stage opens every connection with a CHALLENGE carrying a fresh random nonce; the head's
 * HELLO carries its own nonce and, last, HMAC-SHA256(secret, "MDST HELLO v2" | stage nonce |
 * the HELLO payload before the MAC); the stage's READY ends with HMAC-SHA256(secret, "MDST
 * READY v2" | head nonce | stage nonce | the READY payload before the MAC). A peer without the
 * secret cannot make a HELLO the stage accepts, nor replay one (the stage's nonce is new each
 * time), and a stage without it cannot make a READY the head accepts. What follows the
 * handshake (RUN, RESULT) is checked by CRC only: the secret keeps strangers off the port, it
 * does not protect a connection from someone on the path (docs/sharding.md says what to run
 * over networks one does not control).
 *
 * Ownership: md_stage_secret is a value (no heap); wipe it with md_stage_secret_clear. */
#ifndef MEDLEY_ENGINE_STAGE_AUTH_H
#define MEDLEY_ENGINE_STAGE_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MD_STAGE_NONCE 32      /* bytes of a nonce */
#define MD_STAGE_MAC 32        /* bytes of an HMAC-SHA256 */
#define MD_STAGE_SECRET_MIN 16 /* bytes: a shorter secret file is refused */
#define MD_STAGE_SECRET_MAX 1024
/* The environment variable naming the secret file when no flag does. */
#define MD_STAGE_SECRET_ENV "MEDLEY_STAGE_SECRET_FILE"

typedef struct {
    uint8_t key[MD_STAGE_SECRET_MAX];
    size_t len; /* 0: none loaded */
} md_stage_secret;

/* Read the secret from path: the file's bytes, trailing whitespace (a final newline) dropped,
 * MD_STAGE_SECRET_MIN..MD_STAGE_SECRET_MAX bytes left. MD_EIO when it cannot be read,
 * MD_EINVAL when too short or long; the message names the file, never its content. */
int md_stage_secret_load(const char *path, md_stage_secret *s, md_err *e);

/* path, or when NULL/empty $MEDLEY_STAGE_SECRET_FILE; MD_ENOTFOUND naming both ways to give one
 * when neither is set. `who` starts the message ("medley stage", "stage tcp://h:p"). */
int md_stage_secret_from(const char *path, const char *who, md_stage_secret *s, md_err *e);

void md_stage_secret_clear(md_stage_secret *s);

/* MD_STAGE_NONCE random bytes from the kernel (getrandom). MD_EIO if it has none to give. */
int md_stage_nonce(uint8_t out[MD_STAGE_NONCE], md_err *e);

/* HMAC-SHA256(secret, label | a | b | msg): a and b are nonces (b may be NULL). 0, or -1 when
 * it could not be computed (no secret, no memory): the caller then fails the handshake. */
int md_stage_mac(const md_stage_secret *s, const char *label, const uint8_t *a, const uint8_t *b,
                 const uint8_t *msg, size_t n, uint8_t out[MD_STAGE_MAC]);

/* 1 when the two MACs are equal, compared in constant time. */
int md_stage_mac_equal(const uint8_t *x, const uint8_t *y);

#endif
