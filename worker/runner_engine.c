/* runner_engine.c — the engine runner: a registered model loaded with md_engine_open (the
 * registry resolves the name; a job never names a path), chat template -> tokens ->
 * md_engine_submit; poll() is one md_engine_step() over every live sequence (continuous
 * batching), and finished sequences come back with their text, usage and timings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/engine.h"
#include "engine/registry.h"
#include "engine/tokenizer.h"
#include "worker/runner_impl.h"

typedef struct {
    int used;
    uint64_t seq;
    void *tag;
} eng_item;

typedef struct {
    md_engine *eng;
    tok_tokenizer *tok; /* owned by eng */
    int cap, live, n_ctx;
    char device[32];
    eng_item *items; /* (cap) */
} engine_runner;

int wk_engine_open(const char *model, const wk_runner_opts *o, void **self, md_err *e) {
    *self = NULL;
    char path[4096];
    int rc = md_model_resolve(model, 0, path, sizeof path, e);
    if (rc)
        return rc;
    engine_runner *r = calloc(1, sizeof *r);
    if (!r)
        return md_errf(e, MD_ENOMEM, "out of memory");
    md_engine_config cfg = {0};
    cfg.model_path = path;
    cfg.device = o->device;
    cfg.n_threads = o->n_threads;
    cfg.kv_type = o->kv_type;
    cfg.bf16_weights = o->bf16_weights;
    cfg.max_seqs = o->max_seqs > 0 ? o->max_seqs : 0; /* 0: the device's default */
    if ((rc = md_engine_open(&cfg, &r->eng, e))) {
        free(r);
        return rc;
    }
    r->cap = md_engine_max_seqs(r->eng);
    r->tok = md_engine_tokenizer(r->eng);
    r->n_ctx = md_engine_n_ctx(r->eng);
    /* device type for output lines: "cpu", or "cuda" for cuda:N */
    const char *d = o->device && *o->device ? o->device : "cpu";
    size_t n = strcspn(d, ":");
    snprintf(r->device, sizeof r->device, "%.*s", (int)n, d);
    r->items = calloc((size_t)r->cap, sizeof *r->items);
    if (!r->items) {
        md_engine_close(r->eng);
        free(r);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    *self = r;
    return 0;
}

static void engine_close(void *self) {
    engine_runner *r = self;
    md_engine_close(r->eng);
    free(r->items);
    free(r);
}

static int engine_capacity(void *self) {
    return ((engine_runner *)self)->cap;
}
static int engine_live(void *self) {
    return ((engine_runner *)self)->live;
}
static int engine_n_ctx(void *self) {
    return ((engine_runner *)self)->n_ctx;
}
static const char *engine_device(void *self) {
    return ((engine_runner *)self)->device;
}

static int engine_start(void *self, const wk_request *req, void *tag, md_err *e) {
    engine_runner *r = self;
    if (r->live >= r->cap)
        return md_errf(e, MD_ENOMEM, "engine runner is full (%d sequences)", r->cap);
    char *prompt = NULL;
    int rc;
    if (req->chat) {
        tok_chat_msg msgs[WK_MAX_MSGS];
        for (int i = 0; i < req->n_msgs; i++) {
            msgs[i].role = req->msgs[i].role;
            msgs[i].content = req->msgs[i].content;
        }
        if ((rc = tok_chat_apply(r->tok, msgs, req->n_msgs, 1, &prompt, e)))
            return rc;
    }
    const char *text = req->chat ? prompt : req->prompt;
    int32_t *ids = NULL;
    int n_ids = 0;
    /* Special tokens are parsed only in the template's own markup: for /v1/completions the
     * prompt is user text, and "<|im_start|>" typed by a user stays text. */
    rc = tok_encode(r->tok, text, strlen(text), tok_add_bos(r->tok), req->chat, &ids, &n_ids, e);
    free(prompt);
    if (rc)
        return rc;
    if ((long)n_ids + req->max_tokens > r->n_ctx) {
        free(ids);
        return md_errf(e, MD_ERANGE,
                       "This model's maximum context length is %d tokens. However, you requested "
                       "%ld tokens (%d in the messages, %d in the completion).",
                       r->n_ctx, (long)n_ids + req->max_tokens, n_ids, req->max_tokens);
    }
    md_sampling s;
    md_sampling_default(&s);
    s.temperature = (float)req->temperature;
    s.top_p = (float)req->top_p;
    s.max_tokens = req->max_tokens;
    s.stop = req->n_stop ? req->stop : NULL;
    if (req->has_seed) {
        s.seed = (uint64_t)req->seed;
    } else {
        char hex[17];
        md_random_hex(hex, sizeof hex, 16);
        s.seed = strtoull(hex, NULL, 16);
    }
    uint64_t seq = 0;
    rc = md_engine_submit(r->eng, ids, n_ids, &s, &seq, e);
    free(ids);
    if (rc)
        return rc;
    eng_item *it = NULL;
    for (int i = 0; i < r->cap && !it; i++)
        if (!r->items[i].used)
            it = &r->items[i];
    it->used = 1;
    it->seq = seq;
    it->tag = tag;
    r->live++;
    return 0;
}

static void report(engine_runner *r, eng_item *it, int step_failed, wk_done_fn done, void *ctx) {
    md_seq_stats st = {0};
    md_seq_get_stats(r->eng, it->seq, &st);
    md_finish f = md_seq_finish(r->eng, it->seq);
    const char *text = md_seq_text(r->eng, it->seq);
    wk_result res = {.text = text ? text : "",
                     .finish_reason = f == MD_FINISH_LENGTH ? "length" : "stop",
                     .prompt_tokens = st.prompt_tokens,
                     .completion_tokens = st.completion_tokens,
                     .prefill_ms = st.prefill_ms,
                     .decode_ms = st.decode_ms,
                     .device_lost = step_failed && f == MD_FINISH_ERROR};
    if (f == MD_FINISH_ERROR || f == MD_FINISH_CANCELLED) {
        const char *why = md_seq_error(r->eng, it->seq);
        res.error = why && *why ? why : "the engine stopped this sequence";
    }
    void *tag = it->tag;
    done(ctx, tag, &res);
    md_engine_release(r->eng, it->seq);
    it->used = 0;
    r->live--;
}

static int engine_poll(void *self, int wait_ms, wk_done_fn done, void *ctx, md_err *e) {
    engine_runner *r = self;
    if (r->live == 0)
        return 0;
    md_step_result res;
    /* A failed step (device lost) fails the sequences that were running: they are reported
     * finished with the reason and device_lost set (the worker hands them back, they are not
     * the requests' fault); the waiting ones are untouched and run at a later step. */
    int rc = md_engine_step(r->eng, &res, e);
    for (int k = 0; k < res.n_finished; k++)
        for (int i = 0; i < r->cap; i++)
            if (r->items[i].used && r->items[i].seq == res.finished[k]) {
                report(r, &r->items[i], rc != 0, done, ctx);
                break;
            }
    return rc;
}

const wk_runner_ops wk_engine_ops = {
    .kind = "engine",
    .capacity = engine_capacity,
    .live = engine_live,
    .n_ctx = engine_n_ctx,
    .device = engine_device,
    .start = engine_start,
    .poll = engine_poll,
    .close = engine_close,
};
