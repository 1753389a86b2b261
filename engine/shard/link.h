/* link.h — the head's connection to one pipeline stage, one interface whatever carries it
 * (docs/sharding.md "Transports"): a stage in this process (link_local.c: the hidden states
 * are host memory, copied onto the stage's backend), or in another process or host
 * (link_tcp.c: engine/shard/wire.h frames over TCP). The pipeline (engine/shard/pipeline.h) gives
 * every link a thread of its own and calls run() from it only.
 *
 * Failure: run() returns an error that names the stage and what happened (the peer closed,
 * a timeout, a malformed answer); the link is then broken and every later run() fails at
 * once. Never a hang: a TCP link waits at most the configured timeout for an answer. */
#ifndef MEDLEY_ENGINE_LINK_H
#define MEDLEY_ENGINE_LINK_H

#include "common/err.h"
#include "engine/shard/stage.h"
#include "engine/shard/stage_auth.h"

typedef struct md_link md_link;

typedef struct {
    const char *kind; /* "local", "tcp" */
    /* Run micro-batch b (checked by the head) through the stage: in [T, n_embd] (NULL for
     * the first stage), out [T, n_embd] or, for the last stage, [n_logits, n_vocab]. */
    int (*run)(md_link *l, const md_batch *b, const float *in, float *out, md_err *e);
    const char *(*describe)(md_link *l); /* "tcp://10.0.0.2:7701 layers 12-29 on cpu: ..." */
    void (*free)(md_link *l);
} md_link_ops;

struct md_link {
    const md_link_ops *ops;
};

/* A stage in this process. */
int md_link_local_open(const md_stage_config *c, md_link **out, md_err *e);

/* How the head talks to a `medley stage`: the secret both hold and how long it waits. */
typedef struct {
    const md_stage_secret *secret; /* required: the handshake is signed with it */
    int timeout_ms;                /* the connect and every step's answer (0 = 60000) */
    int load_timeout_ms; /* the CHALLENGE and the READY, while the stage loads (0 = 60000) */
} md_link_tcp_opts;

/* A stage served by `medley stage --listen` at host:port: connects, answers the stage's
 * CHALLENGE with a signed HELLO (engine/shard/wire.h, engine/shard/stage_auth.h) and waits for
 * a READY signed with the same secret. While the link is idle a thread of its own sends PING
 * every third of the stage's idle_ms, so a head with nothing to do keeps its stage. */
int md_link_tcp_open(const char *host, int port, const md_stage_config *c,
                     const md_link_tcp_opts *o, md_link **out, md_err *e);

void md_link_free(md_link *l);

#endif
