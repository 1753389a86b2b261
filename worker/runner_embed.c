/* runner_embed.c — the embedding runner (runner.h): /v1/embeddings lines on an embedding
 * model (engine/embedder.h). start() tokenizes and checks a line's inputs and queues it;
 * poll() embeds the queued lines' next inputs together, packed into the embedder's steps, up
 * to a budget of tokens a call that lasts about EMB_POLL_S at the rate measured so far
 * (EMB_POLL_MIN..EMB_POLL_TOKENS tokens; round-robin over the lines, a big line over several
 * polls) so that a worker serving a generation model beside it keeps stepping, and answers
 * each line whose inputs are all done with OpenAI's body (object "list", data[i] {object,
 * index, embedding}, usage). docs/embeddings.md, "Mixing with generation". */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/embedder.h"
#include "engine/weights/registry.h"
#include "worker/runner_impl.h"

#define EMB_POLL_TOKENS 16384 /* most tokens embedded per poll (at least one input) */
#define EMB_POLL_MIN 512      /* fewest, so that steps stay large enough to be efficient */
#define EMB_POLL_S 0.2 /* a poll's target duration: a generation step waits at most so long */

typedef struct {
    int used;
    void *tag;
    int n_in;
    int32_t **ids; /* [n_in] malloc'd each */
    int *lens;
    int tokens;
    int base64, dims;
    double start_ms;
    float *vecs; /* [n_in, dim]: inputs [0, done) embedded so far */
    int done;
    double embed_ms; /* time in the polls that embedded its inputs */
} emb_item;

/* One input picked for a poll: item, input index. */
typedef struct {
    int item, in;
} emb_pick;

typedef struct {
    md_embedder *m;
    char device[32];
    int cap, live;
    emb_item *items;
    unsigned long next; /* round-robin start, so no line waits behind newer ones forever */
    /* a poll's buffers, allocated at open (no allocation per poll): the picks, their ids and
     * lengths [EMB_POLL_TOKENS] (an input is at least one token), and the vectors out
     * [cap_out, dim], grown when a poll picks more inputs than it holds */
    emb_pick *sel;
    const int32_t **ids;
    int *lens;
    float *out;
    int cap_out;
    double tokens_per_s; /* measured over the last polls (moving average; 0: none yet) */
    long polls;          /* polls that embedded something (the worker's "steps") */
    double last_poll_s;  /* how long the last of them took */
} embed_runner;

static void item_free(emb_item *it) {
    for (int i = 0; i < it->n_in; i++)
        free(it->ids[i]);
    free(it->ids);
    free(it->lens);
    free(it->vecs);
    memset(it, 0, sizeof *it);
}

/* Free what wk_embed_open allocated (any of it NULL when it failed half-way). */
static void embed_close(void *self) {
    embed_runner *r = self;
    for (int i = 0; r->items && i < r->cap; i++)
        item_free(&r->items[i]);
    free(r->items);
    free(r->sel);
    free(r->ids);
    free(r->lens);
    free(r->out);
    md_embedder_close(r->m);
    free(r);
}

int wk_embed_open(const char *model, const wk_runner_opts *o, void **self, md_err *e) {
    *self = NULL;
    char path[4096];
    int rc = md_model_resolve(model, o->allow_path, path, sizeof path, e);
    if (rc)
        return rc;
    embed_runner *r = calloc(1, sizeof *r);
    if (!r)
        return md_errf(e, MD_ENOMEM, "out of memory");
    md_embedder_opts eo = {o->device && strcmp(o->device, "auto") ? o->device : "cpu", o->n_threads,
                           0};
    if ((rc = md_embedder_open(path, &eo, &r->m, e))) {
        free(r);
        return rc;
    }
    if (o->embed_precision && strcmp(o->embed_precision, "f32")) {
        if (strcmp(o->embed_precision, "bf16")) {
            md_embedder_close(r->m);
            free(r);
            return md_errf(e, MD_EINVAL, "--embed-precision %s: f32 or bf16",
                           o->embed_precision);
        }
        if ((rc = md_embedder_set_bf16(r->m, 1, e))) {
            md_embedder_close(r->m);
            free(r);
            return rc;
        }
    }
    snprintf(r->device, sizeof r->device, "%s", eo.device);
    r->cap = o->max_seqs > 0 ? o->max_seqs : 256;
    r->items = calloc((size_t)r->cap, sizeof *r->items);
    r->sel = malloc((size_t)EMB_POLL_TOKENS * sizeof(emb_pick));
    r->ids = malloc((size_t)EMB_POLL_TOKENS * sizeof *r->ids);
    r->lens = malloc((size_t)EMB_POLL_TOKENS * sizeof *r->lens);
    if (!r->items || !r->sel || !r->ids || !r->lens) {
        embed_close(r);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    *self = r;
    return 0;
}

/* 1 when path names an encoder the embedding runner serves (opened to look, then closed). */
int wk_embed_is(const char *model, int allow_path) {
    char path[4096];
    md_err e = {0};
    if (md_model_resolve(model, allow_path, path, sizeof path, &e))
        return 0;
    return md_embedder_probe(path);
}

static int embed_capacity(void *self) {
    return ((embed_runner *)self)->cap;
}
static int embed_live(void *self) {
    return ((embed_runner *)self)->live;
}
static int embed_n_ctx(void *self) {
    return md_embedder_max_len(((embed_runner *)self)->m);
}
static const char *embed_device(void *self) {
    return ((embed_runner *)self)->device;
}

/* What only the model tells: `dimensions` (Matryoshka models only, at most the model's). */
static int embed_check(void *self, q_request *req, q_verr *ve) {
    embed_runner *r = self;
    int dim = md_embedder_dim(r->m), d = req->emb_dimensions;
    if (!d || d == dim)
        return 0;
    snprintf(ve->code, sizeof ve->code, "invalid_value");
    snprintf(ve->param, sizeof ve->param, "body.dimensions");
    ve->status = 400;
    if (!md_embedder_st(r->m)->matryoshka)
        snprintf(ve->message, sizeof ve->message,
                 "body.dimensions is %d: this model gives %d dimensions and was not trained "
                 "to be cut (no Matryoshka tag on its model card); leave dimensions out",
                 d, dim);
    else if (d > dim)
        snprintf(ve->message, sizeof ve->message,
                 "body.dimensions is %d: this model gives at most %d", d, dim);
    else
        return 0;
    return -1;
}

/* Input i's token ids into it (a copy; text tokenized with the model's special tokens), cut
 * to the model's limit when the line asks (medley.truncate), else refused naming the limit. */
static int take_input(embed_runner *r, const q_request *req, int i, emb_item *it, md_err *e) {
    const q_embed_input *in = &req->emb_in[i];
    int32_t *ids = NULL;
    int n = in->n_ids, max = md_embedder_max_len(r->m), V = md_embedder_n_vocab(r->m), rc;
    if (in->text) {
        if ((rc = md_embedder_tokenize(r->m, in->text, in->len, &ids, &n, e)))
            return md_errctx(e, "body.input[%d]: ", i);
    } else if ((ids = malloc((size_t)n * sizeof *ids)))
        memcpy(ids, in->ids, (size_t)n * sizeof *ids);
    it->ids[i] = ids;
    if (!ids)
        return md_errf(e, MD_ENOMEM, "out of memory");
    for (int k = 0; !in->text && k < n; k++)
        if (ids[k] >= V)
            return md_errf(e, MD_EINVAL,
                           "body.input[%d][%d] is %d: outside this model's vocabulary (0..%d)", i,
                           k, (int)ids[k], V - 1);
    if (n > max && !req->emb_truncate)
        return md_errf(e, MD_ERANGE,
                       "body.input[%d] is %d tokens; this model takes at most %d "
                       "(max_seq_length); set body.medley.truncate to true to cut it",
                       i, n, max);
    if (n > max && in->text) /* keep the template's closing token ([SEP]), as tokenizers cuts */
        ids[max - 1] = ids[n - 1];
    it->lens[i] = n > max ? max : n;
    it->tokens += it->lens[i];
    return 0;
}

static int embed_start(void *self, const q_request *req, void *tag, md_err *e) {
    embed_runner *r = self;
    emb_item *it = NULL;
    for (int i = 0; i < r->cap && !it; i++)
        if (!r->items[i].used)
            it = &r->items[i];
    if (!it)
        return md_errf(e, MD_ENOMEM, "embedding runner: all %d slots busy", r->cap);
    it->ids = calloc((size_t)req->n_emb_in, sizeof *it->ids);
    it->lens = calloc((size_t)req->n_emb_in, sizeof *it->lens);
    it->vecs = malloc((size_t)req->n_emb_in * md_embedder_dim(r->m) * sizeof *it->vecs);
    it->n_in = req->n_emb_in;
    if (!it->ids || !it->lens || !it->vecs) {
        item_free(it);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    for (int i = 0; i < req->n_emb_in; i++) {
        int rc = take_input(r, req, i, it, e);
        if (rc) {
            item_free(it);
            return rc;
        }
    }
    it->tag = tag;
    it->base64 = req->emb_base64;
    it->dims = req->emb_dimensions;
    it->start_ms = md_wall_s() * 1000.0;
    it->used = 1;
    r->live++;
    return 0;
}

/* Little-endian float32 bytes of v [n] as base64 (OpenAI's encoding_format "base64"). */
static json_t *base64_floats(const float *v, int n) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t nb = (size_t)n * 4, w = 0;
    unsigned char *b = malloc(nb);
    char *out = malloc((nb + 2) / 3 * 4 + 1);
    json_t *j = NULL;
    if (b && out) {
        for (int i = 0; i < n; i++) { /* explicit byte order: LE on every host */
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++)
                b[i * 4 + k] = (unsigned char)(u >> (8 * k));
        }
        for (size_t i = 0; i < nb; i += 3) {
            uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) |
                         (i + 2 < nb ? b[i + 2] : 0);
            out[w++] = tab[x >> 18 & 63];
            out[w++] = tab[x >> 12 & 63];
            out[w++] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
            out[w++] = i + 2 < nb ? tab[x & 63] : '=';
        }
        j = json_stringn(out, w);
    }
    free(b);
    free(out);
    return j;
}

/* OpenAI's body for one line: vectors v [n_in, dim] (cut to it->dims and renormalised when a
 * Matryoshka model was asked for fewer); "model" is the worker's to set. */
static json_t *body_json(const emb_item *it, float *v, int dim) {
    int d = it->dims > 0 && it->dims < dim ? it->dims : dim;
    json_t *data = json_array();
    for (int i = 0; data && i < it->n_in; i++) {
        float *x = v + (size_t)i * dim;
        if (d < dim)
            md_l2_normalize(x, d);
        json_t *emb = NULL;
        if (it->base64)
            emb = base64_floats(x, d);
        else if ((emb = json_array()))
            for (int c = 0; c < d; c++)
                json_array_append_new(emb, json_real(x[c]));
        json_array_append_new(data, json_pack("{s:s, s:i, s:o*}", "object", "embedding", "index", i,
                                              "embedding", emb));
    }
    return json_pack("{s:s, s:o*, s:{s:i, s:i}}", "object", "list", "data", data, "usage",
                     "prompt_tokens", it->tokens, "total_tokens", it->tokens);
}

/* The inputs to embed this call: the lines' next inputs, from r->next round, until budget
 * tokens (at least one input), so a poll is bounded whatever a line holds. */
static int pick(embed_runner *r, emb_pick *sel, int max_sel, int budget) {
    int n = 0, tokens = 0;
    for (int k = 0; k < r->cap && n < max_sel; k++) {
        int i = (int)((r->next + (unsigned long)k) % (unsigned long)r->cap);
        emb_item *it = &r->items[i];
        for (int in = it->done; it->used && in < it->n_in && n < max_sel; in++) {
            if (n > 0 && tokens + it->lens[in] > budget)
                return n;
            sel[n++] = (emb_pick){i, in};
            tokens += it->lens[in];
        }
    }
    r->next++;
    return n;
}

/* Answer item i: its body, or err when its inputs could not be embedded. */
static void finish(embed_runner *r, emb_item *it, const char *err, wk_done_fn done, void *ctx) {
    json_t *body = err ? NULL : body_json(it, it->vecs, md_embedder_dim(r->m));
    wk_result res = {.prompt_tokens = it->tokens,
                     .prefill_ms = it->embed_ms,
                     .first_token_ms = md_wall_s() * 1000.0 - it->start_ms,
                     .body = body,
                     .error = err    ? err
                              : body ? NULL
                                     : "out of memory for the answer"};
    done(ctx, it->tag, &res);
    json_decref(body);
    item_free(it);
    r->live--;
}

static int embed_poll(void *self, int wait_ms, wk_done_fn done, void *ctx, md_err *e) {
    embed_runner *r = self;
    (void)wait_ms;
    if (r->live == 0)
        return 0;
    int dim = md_embedder_dim(r->m), rc = 0;
    emb_pick *sel = r->sel;
    double want = r->tokens_per_s * EMB_POLL_S;
    int budget = r->tokens_per_s <= 0     ? EMB_POLL_MIN
                 : want > EMB_POLL_TOKENS ? EMB_POLL_TOKENS
                 : want < EMB_POLL_MIN    ? EMB_POLL_MIN
                                          : (int)want;
    int n = pick(r, sel, EMB_POLL_TOKENS, budget);
    if (n > r->cap_out) { /* grows to the most inputs one poll has picked, then stays */
        float *o = realloc(r->out, (size_t)n * dim * sizeof *o);
        if (o) {
            r->out = o;
            r->cap_out = n;
        } else {
            rc = md_errf(e, MD_ENOMEM, "embedding runner: out of memory for %d vectors", n);
        }
    }
    for (int k = 0; rc == 0 && k < n; k++) {
        r->ids[k] = r->items[sel[k].item].ids[sel[k].in];
        r->lens[k] = r->items[sel[k].item].lens[sel[k].in];
    }
    double t0 = md_wall_s() * 1000.0;
    if (rc == 0)
        rc = md_embedder_run(r->m, r->ids, r->lens, n, r->out, e);
    double ms = md_wall_s() * 1000.0 - t0;
    if (rc == 0 && n > 0) {
        r->polls++;
        r->last_poll_s = ms / 1e3;
        int tokens = 0;
        for (int k = 0; k < n; k++)
            tokens += r->lens[k];
        double rate = tokens / (ms > 0.01 ? ms / 1e3 : 1e-5);
        r->tokens_per_s = r->tokens_per_s > 0 ? 0.7 * r->tokens_per_s + 0.3 * rate : rate;
    }
    for (int k = 0; rc == 0 && k < n; k++) { /* picks of one item are consecutive inputs */
        emb_item *it = &r->items[sel[k].item];
        memcpy(it->vecs + (size_t)sel[k].in * dim, r->out + (size_t)k * dim,
               (size_t)dim * sizeof *r->out);
        it->done = sel[k].in + 1;
        if (k == 0 || sel[k - 1].item != sel[k].item)
            it->embed_ms += ms;
    }
    for (int i = 0; i < r->cap; i++) { /* finished lines answered; on an error, every picked one */
        emb_item *it = &r->items[i];
        int picked = 0;
        for (int k = 0; rc && k < n && !picked; k++)
            picked = sel[k].item == i;
        if (it->used && (picked || (rc == 0 && it->done == it->n_in)))
            finish(r, it, rc ? e->msg : NULL, done, ctx);
    }
    return 0; /* a failure was the picked lines' (inputs checked at start): they are answered
                 with it, and the device stays in service */
}

/* A poll that embedded is the embedding runner's step (medley_step_duration_seconds). */
static void embed_stats(void *self, wk_runner_stats *st) {
    const embed_runner *r = self;
    memset(st, 0, sizeof *st);
    st->steps = r->polls;
    st->last_step_s = r->last_poll_s;
}

const wk_runner_ops wk_embed_ops = {
    .kind = "embed",
    .capacity = embed_capacity,
    .live = embed_live,
    .n_ctx = embed_n_ctx,
    .device = embed_device,
    .start = embed_start,
    .poll = embed_poll,
    .close = embed_close,
    .check = embed_check,
    .stats = embed_stats,
};
