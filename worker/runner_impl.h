/* runner_impl.h — the table behind a wk_runner (runner.h); private to worker/. */
#ifndef MEDLEY_WORKER_RUNNER_IMPL_H
#define MEDLEY_WORKER_RUNNER_IMPL_H

#include "worker/runner.h"

typedef struct {
    const char *kind;
    int (*capacity)(void *self);
    int (*live)(void *self);
    int (*n_ctx)(void *self);
    const char *(*device)(void *self);
    int (*start)(void *self, const q_request *req, void *tag, md_err *e);
    int (*poll)(void *self, int wait_ms, wk_done_fn done, void *ctx, md_err *e);
    void (*close)(void *self);
    void (*stats)(void *self, wk_runner_stats *st); /* NULL: nothing counted */
    /* What only the model can tell about a request (runner.h wk_runner_prepare); NULL:
     * nothing to check. 0, or -1 with ve filled. May set req->con_markup (how an "auto"
     * tool call is framed in this model's template). */
    int (*check)(void *self, q_request *req, q_verr *ve);
    /* runner.h wk_runner_partial / wk_runner_cancel; NULL: nothing streamed / no cancel */
    const char *(*partial)(void *self, void *tag, size_t *len);
    void (*cancel)(void *self, void *tag);
} wk_runner_ops;

int wk_echo_open(const wk_runner_opts *o, void **self, md_err *e);
extern const wk_runner_ops wk_echo_ops;
/* Engine runner: MD_EUNSUPP when this build has no inference engine. */
int wk_engine_open(const char *model, const wk_runner_opts *o, void **self, md_err *e);
extern const wk_runner_ops wk_engine_ops;

/* Embedding runner (runner_embed.c): /v1/embeddings on an encoder model. wk_embed_is: 1 when
 * the model resolves to one (the runner kind to open for it). */
int wk_embed_is(const char *model, int allow_path);
int wk_embed_open(const char *model, const wk_runner_opts *o, void **self, md_err *e);
extern const wk_runner_ops wk_embed_ops;

#endif
