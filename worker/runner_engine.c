/* runner_engine.c — the engine runner: a registered model loaded with md_engine_open (the
 * registry resolves the name; a job never names a path), chat template -> tokens ->
 * md_engine_submit; poll() is one md_engine_step() over every live sequence (continuous
 * batching), and finished sequences come back with their text, usage and timings, and the
 * logprob of each token of the text when the request asked for them (collected from the
 * steps' results: the engine keeps no logprobs). */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/engine.h"
#include "engine/weights/registry.h"
#include "engine/tokenizer/chat_tools.h"
#include "engine/tokenizer/tokenizer.h"
#include "worker/grammars.h"
#include "worker/runner_impl.h"
#include "worker/tool_calls.h"

typedef struct {
    int used;
    uint64_t seq;
    void *tag;
    int logprobs;
    /* (cap_lp) the generated tokens, their logprobs and how many alternatives the engine
     * listed at each, in order, when logprobs; kept between requests of the slot, room for
     * max_tokens made at start */
    int32_t *ids;
    float *lps;
    unsigned char *n_tops;
    int n_lp, cap_lp;
    /* (cap_top) token i's alternatives at [i * top_logprobs ..), when top_logprobs > 0:
     * their ids and logprobs, most likely first */
    int top_logprobs;
    int32_t *top_ids;
    float *top_lps;
    size_t cap_top;
    /* the constraint: its grammar cache entry (a reference held while the sequence runs,
     * NULL when none), whether the answer is a function call, the compile report */
    void *gentry;
    int tool_call, constrained, compile_cached;
    tok_tool_format tool_auto; /* "auto": the template's format its calls are read in */
    double compile_ms;
    char relaxed[512];
} eng_item;

typedef struct {
    md_engine *eng;
    tok_tokenizer *tok; /* owned by eng */
    int cap, live, n_ctx;
    char device[32];
    eng_item *items; /* (cap) */
    int *by_seq;     /* (cap) slots of the live items with logprobs, ascending seq id */
    int n_by_seq;
    wk_token_lp *lp; /* (cap_lp) the entries of the answer being reported */
    size_t cap_lp;
    wk_alt_lp *alt; /* (cap_alt) their alternatives, top_logprobs per entry */
    size_t cap_alt;
    char *piece; /* (piece_cap) streaming decode output while they are made */
    size_t piece_cap;
    long steps; /* md_engine_step calls, and how long the last one took (metrics) */
    double last_step_s;
} engine_runner;

/* A slot keeps buffers for more logprobs (or alternatives) than this only while its request
 * runs. */
#define LP_KEEP 4096

int wk_engine_open(const char *model, const wk_runner_opts *o, void **self, md_err *e) {
    *self = NULL;
    char path[4096];
    int rc = md_model_resolve(model, o->allow_path, path, sizeof path, e);
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
    cfg.chat_template = o->chat_template;
    cfg.max_seqs = o->max_seqs > 0 ? o->max_seqs : 0; /* 0: the device's default */
    cfg.stages = o->stages && *o->stages ? o->stages : NULL;
    cfg.model_name = model;
    cfg.tp = o->tp;
    cfg.stage_mem_cap = o->mem_cap;
    if ((rc = md_engine_open(&cfg, &r->eng, e))) {
        free(r);
        return rc;
    }
    r->cap = md_engine_max_seqs(r->eng);
    r->tok = md_engine_tokenizer(r->eng);
    r->n_ctx = md_engine_n_ctx(r->eng);
    /* device type for output lines: "cpu", or "cuda" for cuda:N (the worker's device, also
     * when the model runs as stages) */
    const char *d = o->device && *o->device ? o->device : "cpu";
    size_t n = strcspn(d, ":");
    snprintf(r->device, sizeof r->device, "%.*s", (int)n, d);
    r->items = calloc((size_t)r->cap, sizeof *r->items);
    r->by_seq = calloc((size_t)r->cap, sizeof *r->by_seq);
    r->piece_cap = tok_max_piece_len(r->tok) + 16; /* tokenizer.h: nothing cut */
    r->piece = malloc(r->piece_cap);
    if (!r->items || !r->by_seq || !r->piece) {
        free(r->items);
        free(r->by_seq);
        free(r->piece);
        md_engine_close(r->eng);
        free(r);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    *self = r;
    return 0;
}

static void lp_free(eng_item *it) {
    free(it->ids);
    free(it->lps);
    free(it->n_tops);
    free(it->top_ids);
    free(it->top_lps);
    it->ids = NULL;
    it->lps = NULL;
    it->n_tops = NULL;
    it->top_ids = NULL;
    it->top_lps = NULL;
    it->cap_lp = 0;
    it->cap_top = 0;
}

static void engine_close(void *self) {
    engine_runner *r = self;
    md_engine_close(r->eng);
    for (int i = 0; i < r->cap; i++) {
        lp_free(&r->items[i]);
        wk_grammars_release(r->items[i].gentry);
    }
    free(r->items);
    free(r->by_seq);
    free(r->lp);
    free(r->alt);
    free(r->piece);
    free(r);
}

/* Room for n logprob entries with top alternatives each in slot it and in the runner's
 * reporting buffers, so that the step loop and report() never allocate. On failure the
 * buffers that did grow are kept (their capacities stay the old ones). */
static int lp_reserve(engine_runner *r, eng_item *it, int n, int top, md_err *e) {
    if (n > it->cap_lp) {
        int32_t *ids = realloc(it->ids, (size_t)n * sizeof *ids);
        if (ids)
            it->ids = ids;
        float *lps = ids ? realloc(it->lps, (size_t)n * sizeof *lps) : NULL;
        if (lps)
            it->lps = lps;
        unsigned char *nt = lps ? realloc(it->n_tops, (size_t)n) : NULL;
        if (nt)
            it->n_tops = nt;
        if (!nt)
            return md_errf(e, MD_ENOMEM, "out of memory for %d logprobs", n);
        it->cap_lp = n;
    }
    size_t m = (size_t)n * (size_t)top;
    if (m > it->cap_top) {
        int32_t *ids = realloc(it->top_ids, m * sizeof *ids);
        if (ids)
            it->top_ids = ids;
        float *lps = ids ? realloc(it->top_lps, m * sizeof *lps) : NULL;
        if (lps)
            it->top_lps = lps;
        if (!lps)
            return md_errf(e, MD_ENOMEM, "out of memory for %d tokens' %d top logprobs", n, top);
        it->cap_top = m;
    }
    if ((size_t)n > r->cap_lp) {
        wk_token_lp *lp = realloc(r->lp, (size_t)n * sizeof *lp);
        if (!lp)
            return md_errf(e, MD_ENOMEM, "out of memory for %d logprobs", n);
        r->lp = lp;
        r->cap_lp = (size_t)n;
    }
    if (m > r->cap_alt) {
        wk_alt_lp *alt = realloc(r->alt, m * sizeof *alt);
        if (!alt)
            return md_errf(e, MD_ENOMEM, "out of memory for %d tokens' %d top logprobs", n, top);
        r->alt = alt;
        r->cap_alt = m;
    }
    return 0;
}

/* Position in by_seq of the item running seq, or where it would go. */
static int by_seq_find(const engine_runner *r, uint64_t seq) {
    int lo = 0, hi = r->n_by_seq;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (r->items[r->by_seq[mid]].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
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

static int verr(q_verr *ve, const char *code, const char *param, const char *msg) {
    snprintf(ve->code, sizeof ve->code, "%s", code);
    snprintf(ve->param, sizeof ve->param, "%s", param);
    snprintf(ve->message, sizeof ve->message, "%s", msg);
    ve->status = 400;
    return -1;
}

/* What only this model can tell (runner.h wk_runner_prepare). */
static int engine_check(void *self, q_request *req, q_verr *ve) {
    engine_runner *r = self;
    int n_vocab = tok_n_vocab(r->tok);
    for (int i = 0; i < req->n_bias; i++)
        if (req->bias_ids[i] >= n_vocab) {
            char msg[160];
            snprintf(msg, sizeof msg,
                     "body.logit_bias names token %d; this model's vocabulary has %d tokens "
                     "(0..%d)",
                     (int)req->bias_ids[i], n_vocab, n_vocab - 1);
            return verr(ve, "invalid_value", "body.logit_bias", msg);
        }
    if (req->tool_choice == Q_TOOLS_AUTO) {
        /* "auto" lets the model choose between text and calls, told apart by the template's
         * own tool-call markup (engine/tokenizer/chat_tools.h) */
        const tok_tool_markup *m = tok_tool_markup_of(tok_tool_format_of(r->tok));
        if (m) {
            req->con_markup = m;
            /* Llama 3 names the arguments "parameters": the call schema says so too */
            if (strcmp(m->args_key, "arguments") && wk_tools_rename_args(req, m->args_key))
                return verr(ve, "server_error", "body.tools", "out of memory");
            return 0;
        }
        return verr(ve, "unsupported_value", "body.tool_choice",
                    "body.tool_choice is \"auto\" (the default when body.tools is given), which "
                    "needs the model's own tool-call format; this model's chat template defines "
                    "none (a ChatML model trained on Hermes-style <tool_call> markup can be "
                    "served with --chat-template hermes): use \"required\" or {\"type\": "
                    "\"function\", \"function\": {\"name\": ...}}, or \"none\"");
    }
    return 0;
}

static int engine_start(void *self, const q_request *req, void *tag, md_err *e) {
    engine_runner *r = self;
    if (r->live >= r->cap)
        return md_errf(e, MD_ENOMEM, "engine runner is full (%d sequences)", r->cap);
    char *prompt = NULL;
    int rc;
    if (req->chat) {
        tok_chat_msg msgs[Q_MAX_MSGS + 1];
        char *sys = NULL;
        int n = 0;
        int from = 0;
        if (req->tool_choice == Q_TOOLS_REQUIRED || req->tool_choice == Q_TOOLS_NAMED) {
            /* one system turn: the tools first, then the line's own system text */
            const char *own = !strcmp(req->msgs[0].role, "system") ? req->msgs[0].content : NULL;
            if ((rc = wk_tools_system_text(req, own, &sys, e)))
                return rc;
            msgs[n++] = (tok_chat_msg){"system", sys};
            from = own ? 1 : 0;
        }
        for (int i = from; i < req->n_msgs; i++) {
            msgs[n].role = req->msgs[i].role;
            msgs[n++].content = req->msgs[i].content;
        }
        if (req->con_lazy && req->con_markup) { /* "auto": the template's own tool format */
            json_t *tools = wk_tools_array(req);
            rc = tools ? tok_chat_apply_tools(r->tok, msgs, n, tools, &prompt, e)
                       : md_errf(e, MD_ENOMEM, "out of memory describing the tools");
            json_decref(tools);
        } else {
            rc = tok_chat_apply(r->tok, msgs, n, 1, &prompt, e);
        }
        free(sys);
        if (rc)
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
    eng_item *it = NULL;
    for (int i = 0; i < r->cap && !it; i++)
        if (!r->items[i].used)
            it = &r->items[i];
    if (req->logprobs && (rc = lp_reserve(r, it, req->max_tokens, req->top_logprobs, e))) {
        free(ids);
        return rc;
    }
    md_sampling s;
    md_sampling_default(&s);
    s.temperature = (float)req->temperature;
    s.top_p = (float)req->top_p;
    s.top_k = req->top_k;
    s.min_p = (float)req->min_p;
    s.repetition_penalty = (float)req->repetition_penalty;
    s.presence_penalty = (float)req->presence_penalty;
    s.frequency_penalty = (float)req->frequency_penalty;
    s.logprobs = req->logprobs;
    s.top_logprobs = req->top_logprobs;
    s.max_tokens = req->max_tokens;
    s.stop = req->n_stop ? req->stop : NULL;
    if (req->has_seed) {
        s.seed = (uint64_t)req->seed;
    } else {
        char hex[17];
        md_random_hex(hex, sizeof hex, 16);
        s.seed = strtoull(hex, NULL, 16);
    }
    s.grammar = req->grammar;
    if (req->con_lazy && req->grammar) { /* "auto": free text until the template's markup */
        const tok_tool_markup *m = req->con_markup;
        s.grammar_trigger = m->trigger;
        s.grammar_trigger_anchored = m->anchored;
    }
    md_logit_bias *bias = NULL;
    if (req->n_bias) {
        bias = malloc((size_t)req->n_bias * sizeof *bias);
        if (!bias) {
            free(ids);
            return md_errf(e, MD_ENOMEM, "out of memory for %d logit_bias entries", req->n_bias);
        }
        for (int i = 0; i < req->n_bias; i++)
            bias[i] = (md_logit_bias){req->bias_ids[i], req->bias[i]};
        s.logit_bias = bias;
        s.n_logit_bias = req->n_bias;
    }
    uint64_t seq = 0;
    rc = md_engine_submit(r->eng, ids, n_ids, &s, &seq, e); /* copies the biases */
    free(ids);
    free(bias);
    if (rc)
        return rc;
    wk_grammars_hold(req->gentry);
    it->gentry = req->gentry;
    it->tool_call = req->con == Q_CON_JSON_SCHEMA && !strcmp(req->con_param, "body.tools");
    it->tool_auto = req->con_lazy && req->con_markup ? tok_tool_format_of(r->tok) : TOK_TOOLS_NONE;
    it->constrained = req->con != Q_CON_NONE;
    it->compile_cached = req->compile_cached;
    it->compile_ms = req->compile_ms;
    snprintf(it->relaxed, sizeof it->relaxed, "%s", req->relaxed);
    it->used = 1;
    it->seq = seq;
    it->tag = tag;
    it->logprobs = req->logprobs;
    it->top_logprobs = req->logprobs ? req->top_logprobs : 0;
    it->n_lp = 0;
    if (it->logprobs) {
        int at = by_seq_find(r, seq);
        memmove(r->by_seq + at + 1, r->by_seq + at, (size_t)(r->n_by_seq - at) * sizeof *r->by_seq);
        r->by_seq[at] = (int)(it - r->items);
        r->n_by_seq++;
    }
    r->live++;
    return 0;
}

/* The logprob entries of a finished sequence's text into r->lp; returns how many. The
 * engine's streaming decode is replayed to learn where each token's text begins (a token
 * holding part of a character adds nothing until the character completes). Left out: a
 * final end-of-generation token, and, when a stop string cut the text, the tokens that
 * begin at or after the cut (the text shows none of their bytes). */
static int lp_entries(engine_runner *r, const eng_item *it, const char *text, md_finish f) {
    int n = it->n_lp;
    if (n > 0 && f == MD_FINISH_STOP && tok_is_eog(r->tok, it->ids[n - 1]))
        n--;
    tok_stream ts;
    tok_stream_init(&ts);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t len;
        const char *p = tok_piece(r->tok, it->ids[i], 0, &len);
        size_t at = (size_t)i * (size_t)it->top_logprobs;
        r->lp[i] = (wk_token_lp){.bytes = p,
                                 .n_bytes = len,
                                 .text_offset = off,
                                 .logprob = it->lps[i],
                                 .top = it->top_logprobs ? r->alt + at : NULL,
                                 .n_top = it->n_tops[i]};
        for (int j = 0; j < it->n_tops[i]; j++) {
            size_t tl;
            const char *tp = tok_piece(r->tok, it->top_ids[at + j], 0, &tl);
            r->alt[at + j] = (wk_alt_lp){tp, tl, it->top_lps[at + j]};
        }
        off += tok_stream_push(r->tok, &ts, it->ids[i], r->piece, r->piece_cap);
    }
    size_t text_len = strlen(text);
    if (off > text_len) /* the decoder gave more than the text holds: a stop string cut it */
        while (n > 0 && r->lp[n - 1].text_offset >= text_len)
            n--;
    return n;
}

static void report(engine_runner *r, eng_item *it, int step_failed, wk_done_fn done, void *ctx) {
    md_seq_stats st = {0};
    md_seq_get_stats(r->eng, it->seq, &st);
    md_finish f = md_seq_finish(r->eng, it->seq);
    const char *text = md_seq_text(r->eng, it->seq);
    text = text ? text : "";
    wk_result res = {.text = text,
                     .finish_reason = f == MD_FINISH_LENGTH ? "length" : "stop",
                     .prompt_tokens = st.prompt_tokens,
                     .completion_tokens = st.completion_tokens,
                     .prefill_ms = st.prefill_ms,
                     .decode_ms = st.decode_ms,
                     .first_token_ms = st.queue_ms + st.prefill_ms,
                     .device_lost = step_failed && f == MD_FINISH_ERROR};
    res.constrained = it->constrained;
    res.compile_cached = it->compile_cached;
    res.compile_ms = it->compile_ms;
    res.schema_relaxed = it->relaxed;
    wk_calls calls = {0};
    if (it->tool_call && f == MD_FINISH_STOP) {
        /* the grammar made the calls (validation refuses stop strings with a constraint
         * other than "auto"); text that does not parse stays content */
        if (wk_calls_read(&calls, text, it->tool_auto)) {
            res.text = calls.content;
            res.calls = calls.calls;
            res.n_calls = calls.n;
            res.finish_reason = "tool_calls";
        }
    }
    if (f == MD_FINISH_ERROR || f == MD_FINISH_CANCELLED) {
        const char *why = md_seq_error(r->eng, it->seq);
        res.error = why && *why ? why : "the engine stopped this sequence";
    } else if (it->logprobs) {
        res.logprobs = 1;
        res.top_logprobs = it->top_logprobs;
        res.lp = r->lp;
        res.n_lp = lp_entries(r, it, text, f);
    }
    if (it->logprobs) {
        int at = by_seq_find(r, it->seq);
        memmove(r->by_seq + at, r->by_seq + at + 1,
                (size_t)(r->n_by_seq - at - 1) * sizeof *r->by_seq);
        r->n_by_seq--;
    }
    void *tag = it->tag;
    done(ctx, tag, &res);
    wk_calls_free(&calls);
    md_engine_release(r->eng, it->seq);
    wk_grammars_release(it->gentry); /* after the engine let go of the sequence's matcher */
    it->gentry = NULL;
    if (it->cap_lp > LP_KEEP || it->cap_top > LP_KEEP)
        lp_free(it);
    it->used = 0;
    r->live--;
}

/* Each new token of a sequence that wants logprobs, with its logprob and alternatives, onto
 * its item. */
static void collect_logprobs(engine_runner *r, const md_step_result *res) {
    for (int k = 0; k < res->n_tokens && r->n_by_seq > 0; k++) {
        const md_step_token *t = &res->tokens[k];
        int at = by_seq_find(r, t->seq_id);
        if (at == r->n_by_seq || r->items[r->by_seq[at]].seq != t->seq_id)
            continue;
        eng_item *it = &r->items[r->by_seq[at]];
        if (it->n_lp < it->cap_lp) { /* max_tokens bounds the tokens of a sequence */
            /* the engine lists at most what was asked; fewer when fewer are finite */
            int m = t->n_top < it->top_logprobs ? t->n_top : it->top_logprobs;
            it->n_tops[it->n_lp] = (unsigned char)(m > 0 ? m : 0);
            if (m > 0) {
                size_t at = (size_t)it->n_lp * (size_t)it->top_logprobs;
                memcpy(it->top_ids + at, t->top_token, (size_t)m * sizeof *it->top_ids);
                memcpy(it->top_lps + at, t->top_logprob, (size_t)m * sizeof *it->top_lps);
            }
            it->ids[it->n_lp] = t->token;
            it->lps[it->n_lp++] = t->logprob;
        }
    }
}

static int engine_poll(void *self, int wait_ms, wk_done_fn done, void *ctx, md_err *e) {
    engine_runner *r = self;
    if (r->live == 0)
        return 0;
    md_step_result res;
    /* A failed step (device lost) fails the sequences that were running: they are reported
     * finished with the reason and device_lost set (the worker hands them back, they are not
     * the requests' fault); the waiting ones are untouched and run at a later step. */
    uint64_t t0 = md_mono_ns();
    int rc = md_engine_step(r->eng, &res, e);
    r->last_step_s = (double)(md_mono_ns() - t0) / 1e9;
    r->steps++;
    collect_logprobs(r, &res);
    for (int k = 0; k < res.n_finished; k++)
        for (int i = 0; i < r->cap; i++)
            if (r->items[i].used && r->items[i].seq == res.finished[k]) {
                report(r, &r->items[i], rc != 0, done, ctx);
                break;
            }
    return rc;
}

static eng_item *find_tag(engine_runner *r, void *tag) {
    for (int i = 0; i < r->cap; i++)
        if (r->items[i].used && r->items[i].tag == tag)
            return &r->items[i];
    return NULL;
}

/* The engine's text of the sequence so far (stop string cut, valid UTF-8). */
static const char *engine_partial(void *self, void *tag, size_t *len) {
    engine_runner *r = self;
    eng_item *it = find_tag(r, tag);
    const char *text = it ? md_seq_text(r->eng, it->seq) : NULL;
    *len = text ? strlen(text) : 0;
    return text;
}

/* The engine reports it finished (cancelled) at the next step; report() answers it with an
 * error. */
static void engine_cancel(void *self, void *tag) {
    engine_runner *r = self;
    eng_item *it = find_tag(r, tag);
    if (it)
        md_engine_cancel(r->eng, it->seq);
}

static void engine_stats(void *self, wk_runner_stats *out) {
    engine_runner *r = self;
    md_engine_stats st;
    md_engine_get_stats(r->eng, &st);
    out->steps = r->steps;
    out->last_step_s = r->last_step_s;
    out->preemptions = st.preemptions;
    out->kv_blocks = st.kv_blocks;
    out->kv_blocks_free = st.kv_blocks_free;
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
    .stats = engine_stats,
    .check = engine_check,
    .partial = engine_partial,
    .cancel = engine_cancel,
};
