/* pipeline.h — a sharded replica seen from its head (docs/sharding.md): the stages of a
 * model in layer order, each behind a link (engine/shard/link.h: in this process or over TCP), and
 * the micro-batch pipeline that runs one engine step through them.
 *
 * A step's tokens are cut into micro-batches of about equal token counts (a sequence's chunk
 * may be cut too: its first part reaches every stage before its second, so the second reads
 * the first's K/V). Every link has a thread; micro-batch k goes to stage i + 1 as soon as
 * stage i is done with it, while stage i takes micro-batch k + 1 — stage 2 works on
 * micro-batch 1 while stage 1 works on micro-batch 2. The step ends when the last stage has
 * given back the logits of every micro-batch; the engine then samples and lays out the next
 * step.
 *
 * Failure: the first error of any stage fails the step with that stage's reason; the pipeline
 * is then broken (every later step fails at once with the same reason) and the owner closes
 * it and opens a new one to re-form the replica.
 *
 * Ownership: md_pipe_open gives a pipeline the caller frees with md_pipe_close; it owns its
 * links and threads. One caller thread. */
#ifndef MEDLEY_ENGINE_PIPELINE_H
#define MEDLEY_ENGINE_PIPELINE_H

#include <stddef.h>

#include "common/err.h"
#include "engine/shard/link.h"
#include "engine/shard/stage.h"

/* One stage of a --stages SPEC: "[tcp://HOST:PORT/]DEVICE:LO-HI", layers LO to HI inclusive.
 * DEVICE may itself hold colons ("cuda:0:0-11") and name tensor-parallel ranks with '+'
 * ("cuda:0+cuda:1:0-29"). */
typedef struct {
    char host[256]; /* "" = in this process */
    int port;
    char device[64];
    int lo, hi; /* [lo, hi) */
} md_stage_spec;

/* Parse a comma list of stages. Checks the syntax and that the ranges follow each other from
 * layer 0 without gaps or overlaps (n_layer < 0: the last range is not checked against it).
 * MD_EINVAL naming the faulty part. */
int md_stages_parse(const char *spec, int n_layer, md_stage_spec *out, int max, int *n, md_err *e);

typedef struct md_pipe md_pipe;

typedef struct {
    int microbatches; /* micro-batches per step (0 = eight per stage, two with a GPU stage;
                         1 with one stage) */
    int timeout_ms;   /* a remote stage's answer (0 = the link's default, 60 s) */
    int tp;           /* tensor-parallel ranks of every local stage (0/1 = none) */
    size_t mem_cap;   /* each local stage's memory cap (0 = none) */
    int n_embd;       /* the model's width and vocabulary (md_model_shape_gf), which the */
    int n_vocab;      /* head has read from its open file already */
    /* a remote stage's READY, while it loads (0 = 60 s) */
    int load_timeout_ms;
    /* the remote stages' secret (engine/shard/stage_auth.h); NULL = $MEDLEY_STAGE_SECRET_FILE;
     * read only when a stage is remote */
    const char *secret_file;
} md_pipe_opts;

/* Open every stage: base holds the model and sizes (lo, hi and device come from sp). */
int md_pipe_open(const md_stage_spec *sp, int n, const md_stage_config *base, const md_pipe_opts *o,
                 md_pipe **out, md_err *e);
void md_pipe_close(md_pipe *p);

/* Run step b through every stage: logits [n_logits, n_vocab] (host) of b->logit_rows, or with
 * b->argmax_only their argmax ids as floats [n_logits]. */
int md_pipe_forward(md_pipe *p, const md_batch *b, float *logits, md_err *e);

int md_pipe_n_stages(const md_pipe *p);
const char *md_pipe_describe(md_pipe *p); /* one line per stage */

typedef struct {
    long steps, microbatches;
    size_t bytes_hidden; /* hidden states and logits carried between the head and its stages */
    size_t bytes_layout; /* step layouts sent */
    double forward_s;    /* wall time inside md_pipe_forward */
    double busy_s[MD_STAGE_MAX]; /* each stage's link busy (running a micro-batch) */
} md_pipe_stats;
void md_pipe_get_stats(const md_pipe *p, md_pipe_stats *st);

#endif
