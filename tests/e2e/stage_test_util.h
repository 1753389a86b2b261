/* stage_test_util.h — shared by the stage link tests (test_stage_tcp.c, test_wire_fuzz.c):
 * md_stage_serve on 127.0.0.1 in a thread of the test, on a port the kernel picks, serving
 * synthetic:tiny to heads holding test_secret(), and the sizes and micro-batches of a stage
 * of synthetic:tiny (2 layers, n_embd 128, n_vocab 512). */
#ifndef MEDLEY_TESTS_STAGE_TEST_UTIL_H
#define MEDLEY_TESTS_STAGE_TEST_UTIL_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/shard/link.h"
#include "engine/shard/stage.h"
#include "engine/shard/stage_auth.h"
#include "engine/shard/stage_server.h"

#define TINY "synthetic:tiny"
#define TINY_BLOCK 16 /* block_tokens */
#define TINY_BLOCKS 4 /* per sequence: contexts of 64 */
#define TINY_SEQS 4

/* The secret the test servers and heads share. */
static inline const md_stage_secret *test_secret(void) {
    static md_stage_secret s;
    if (!s.len) {
        memcpy(s.key, "the stage tests' shared secret!!", 32);
        s.len = 32;
    }
    return &s;
}

/* Link options with the test secret and timeout_ms for the steps and the load. */
static inline md_link_tcp_opts test_link_opts(int timeout_ms) {
    return (md_link_tcp_opts){
        .secret = test_secret(), .timeout_ms = timeout_ms, .load_timeout_ms = timeout_ms};
}

static const char *const test_models[] = {TINY};

typedef struct {
    pthread_t th;
    volatile sig_atomic_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int port; /* 0 until listening, -1 when md_stage_serve failed */
    md_stage_server_opts o;
    int rc;
    md_err e;
} test_server;

static inline void test_server_listening(void *arg, int port) {
    test_server *s = arg;
    pthread_mutex_lock(&s->mu);
    s->port = port;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static inline void *test_server_main(void *arg) {
    test_server *s = arg;
    s->rc = md_stage_serve("127.0.0.1", 0, &s->o, &s->stop, &s->e);
    if (s->rc)
        test_server_listening(s, -1);
    return NULL;
}

/* Start a server (one CPU thread per stage, short timeouts); returns its port, or -1. */
static inline int test_server_start(test_server *s, int handshake_ms, int io_ms) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->o = (md_stage_server_opts){.device = "cpu",
                                  .n_threads = 1,
                                  .secret = test_secret(),
                                  .models = test_models,
                                  .n_models = 1,
                                  .handshake_ms = handshake_ms,
                                  .io_ms = io_ms,
                                  .on_listen = test_server_listening,
                                  .arg = s};
    if (pthread_create(&s->th, NULL, test_server_main, s))
        return -1;
    pthread_mutex_lock(&s->mu);
    while (s->port == 0)
        pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return s->port;
}

/* Stop it and wait for md_stage_serve to return; its status. */
static inline int test_server_stop(test_server *s) {
    s->stop = 1;
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    return s->rc;
}

/* A stage [lo, hi) of synthetic:tiny on one CPU thread. */
static inline md_stage_config tiny_config(int lo, int hi) {
    md_stage_config c = {.lo = lo,
                         .hi = hi,
                         .n_threads = 1,
                         .n_slots = TINY_SEQS * TINY_BLOCKS * TINY_BLOCK,
                         .max_tokens = 16,
                         .max_seqs = TINY_SEQS,
                         .max_blocks = TINY_BLOCKS,
                         .block_tokens = TINY_BLOCK,
                         .n_ctx = TINY_BLOCKS * TINY_BLOCK};
    snprintf(c.model, sizeof c.model, "%s", TINY);
    snprintf(c.device, sizeof c.device, "cpu");
    return c;
}

/* One micro-batch: sequence s (of n) takes n_new[s] tokens from position start[s]; sequence s
 * owns blocks s * TINY_BLOCKS ..; every sequence's last token wants logits. */
typedef struct {
    int32_t tokens[16], seq[16], pos[16], slot[16], len[TINY_SEQS], table[TINY_SEQS * TINY_BLOCKS],
        rows[TINY_SEQS];
    md_batch b;
} tiny_batch;

static inline void tiny_batch_make(tiny_batch *t, int n, const int *start, const int *n_new,
                                   int salt) {
    int T = 0;
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < TINY_BLOCKS; i++)
            t->table[s * TINY_BLOCKS + i] = s * TINY_BLOCKS + i;
        for (int k = 0; k < n_new[s]; k++, T++) {
            int p = start[s] + k;
            t->tokens[T] = (int32_t)((p * 31 + s * 97 + salt * 13) % 512);
            t->seq[T] = s;
            t->pos[T] = p;
            t->slot[T] = t->table[s * TINY_BLOCKS + p / TINY_BLOCK] * TINY_BLOCK + p % TINY_BLOCK;
        }
        t->len[s] = start[s] + n_new[s];
        t->rows[s] = T - 1;
    }
    t->b = (md_batch){.n_tokens = T,
                      .n_seqs = n,
                      .tokens = t->tokens,
                      .tok_seq = t->seq,
                      .tok_pos = t->pos,
                      .slot = t->slot,
                      .seq_len = t->len,
                      .block_table = t->table,
                      .max_blocks = TINY_BLOCKS,
                      .block_tokens = TINY_BLOCK,
                      .logit_rows = t->rows,
                      .n_logits = n};
}

#endif
