/* runner.c — see runner.h: picks the runner kind for a model and forwards calls. */
#include "worker/runner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/grammars.h"
#include "worker/runner_impl.h"

struct wk_runner {
    const wk_runner_ops *ops;
    void *self;
    wk_grammars *grammars; /* the compiled constraints of this runner's requests */
};

int wk_runner_open(const char *model, const wk_runner_opts *o, wk_runner **out, md_err *e) {
    *out = NULL;
    wk_runner *r = calloc(1, sizeof *r);
    if (!r)
        return md_errf(e, MD_ENOMEM, "out of memory");
    int rc = wk_grammars_new(WK_GRAMMARS_DEFAULT, &r->grammars, e);
    if (rc) {
        free(r);
        return rc;
    }
    if (!strcmp(model, "echo")) {
        r->ops = &wk_echo_ops;
        rc = wk_echo_open(o, &r->self, e);
    } else if (wk_embed_is(model, o->allow_path)) {
        r->ops = &wk_embed_ops;
        rc = wk_embed_open(model, o, &r->self, e);
    } else {
        r->ops = &wk_engine_ops;
        rc = wk_engine_open(model, o, &r->self, e);
    }
    if (rc) {
        wk_grammars_free(r->grammars);
        free(r);
        return md_errctx(e, "serving model '%s': ", model);
    }
    *out = r;
    return 0;
}

void wk_runner_close(wk_runner *r) {
    if (!r)
        return;
    r->ops->close(r->self); /* its sequences' grammar references first */
    wk_grammars_free(r->grammars);
    free(r);
}

const char *wk_runner_kind(const wk_runner *r) {
    return r->ops->kind;
}
const char *wk_runner_device(const wk_runner *r) {
    return r->ops->device(r->self);
}
int wk_runner_capacity(const wk_runner *r) {
    return r->ops->capacity(r->self);
}
int wk_runner_live(const wk_runner *r) {
    return r->ops->live(r->self);
}
int wk_runner_n_ctx(const wk_runner *r) {
    return r->ops->n_ctx(r->self);
}
int wk_runner_prepare(wk_runner *r, q_request *req, q_verr *ve) {
    int embed = !strcmp(r->ops->kind, "embed");
    if (req->embed != embed) { /* the url and the model's kind disagree */
        snprintf(ve->code, sizeof ve->code, "invalid_value");
        snprintf(ve->param, sizeof ve->param, "url");
        snprintf(ve->message, sizeof ve->message, "%s",
                 embed ? "this model is an embedding model: it answers /v1/embeddings lines only"
                       : "this model generates text: /v1/embeddings lines need an embedding model");
        ve->status = 400;
        return -1;
    }
    /* the check first: it says how an "auto" tool call is framed (req->con_markup) */
    if (r->ops->check && r->ops->check(r->self, req, ve))
        return -1;
    return wk_grammars_prepare(r->grammars, req, ve);
}
void wk_runner_release(wk_runner *r, q_request *req) {
    (void)r;
    wk_grammars_release(req->gentry);
    req->gentry = NULL;
    req->grammar = NULL;
}
int wk_runner_start(wk_runner *r, const q_request *req, void *tag, md_err *e) {
    return r->ops->start(r->self, req, tag, e);
}
int wk_runner_poll(wk_runner *r, int wait_ms, wk_done_fn done, void *ctx, md_err *e) {
    return r->ops->poll(r->self, wait_ms, done, ctx, e);
}
const char *wk_runner_partial(wk_runner *r, void *tag, size_t *len) {
    *len = 0;
    return r->ops->partial ? r->ops->partial(r->self, tag, len) : NULL;
}
void wk_runner_cancel(wk_runner *r, void *tag) {
    if (r->ops->cancel)
        r->ops->cancel(r->self, tag);
}
void wk_runner_get_stats(const wk_runner *r, wk_runner_stats *st) {
    memset(st, 0, sizeof *st);
    if (r->ops->stats)
        r->ops->stats(r->self, st);
}
