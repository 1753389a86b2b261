/* graph_backend.c — CUDA-graph-like recording and replay over the CPU backend (see
 * graph_backend.h). Buffers are the CPU backend's own: the wrapper forwards them untouched. */
#include "unit/graph_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

enum {
    OP_EMBED,
    OP_MATMUL,
    OP_ADD_BIAS,
    OP_RMSNORM,
    OP_ROPE,
    OP_KV_WRITE,
    OP_ATTENTION,
    OP_SWIGLU,
    OP_ADD,
    OP_GATHER,
};
static const char *const op_names[] = {"embed", "matmul",    "add_bias", "rmsnorm", "rope",
                                       "kv_write", "attention", "swiglu", "add",     "gather_rows"};

/* One op call: what a kernel launch would freeze into a graph node. */
typedef struct {
    int op;
    const void *buf[5];
    md_tensor w;
    int i[6];
    float f;
    int64_t n;
} call;

#define MAX_KEYS 64
#define KEY_INTS 66 /* T, S, n_logits, then up to 63 per-sequence token counts (":all") */

typedef struct {
    int key[KEY_INTS];
    int seen;
    call *calls; /* the recording, once made */
    int n, cap;
} rec;

typedef struct {
    md_backend base;
    md_backend_ops ops; /* gb_ops, plus sample with ":sample" */
    md_backend *in;
    int all;       /* record prefill steps too */
    int fail_at;   /* make the fail_at-th recording fail (0 = never) */
    int n_records; /* recordings started */
    enum { M_OFF, M_EAGER, M_RECORD, M_REPLAY } mode;
    int recording_failed;
    rec recs[MAX_KEYS];
    int n_recs;
    rec *cur;
    int pos; /* replay position */
    int key[KEY_INTS];
    int keyable;
} gb;

static graph_backend_stats g_stats;

static gb *G(md_backend *be) {
    return (gb *)be;
}

static int violation(gb *g, md_err *e, const char *fmt, const char *what) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, what);
    if (g_stats.violations++ == 0)
        snprintf(g_stats.first_violation, sizeof g_stats.first_violation, "%s", msg);
    return md_errf(e, MD_EINVAL, "cpu-graph: %s", msg);
}

static int run_call(gb *g, const call *c, md_err *e) {
    md_backend *in = g->in;
    const md_backend_ops *o = in->ops;
    md_buf *const *b = (md_buf *const *)c->buf;
    switch (c->op) {
    case OP_EMBED: return o->embed(in, &c->w, b[0], e);
    case OP_MATMUL: return o->matmul(in, &c->w, b[0], b[1], c->i[0], e);
    case OP_ADD_BIAS: return o->add_bias(in, b[0], &c->w, c->i[0], e);
    case OP_RMSNORM: return o->rmsnorm(in, b[0], &c->w, b[1], c->i[0], c->i[1], c->f, e);
    case OP_ROPE: return o->rope(in, b[0], c->i[0], c->i[1], c->i[2], b[1], c->i[3], e);
    case OP_KV_WRITE: return o->kv_write(in, b[0], b[1], b[2], b[3], c->i[0], c->i[1], e);
    case OP_ATTENTION:
        return o->attention(in, b[0], b[1], b[2], b[3], c->i[0], c->i[1], c->i[2], c->i[3], c->f,
                            e);
    case OP_SWIGLU: return o->swiglu(in, b[0], b[1], b[2], c->n, e);
    case OP_ADD: return o->add(in, b[0], b[1], c->n, e);
    case OP_GATHER: return o->gather_rows(in, b[0], b[1], c->i[0], e);
    }
    return md_errf(e, MD_EINVAL, "cpu-graph: unknown op %d", c->op);
}

static int same_call(const call *a, const call *b) {
    return a->op == b->op && !memcmp(a->buf, b->buf, sizeof a->buf) &&
           a->w.buf == b->w.buf && a->w.offset == b->w.offset && a->w.type == b->w.type &&
           a->w.ne0 == b->w.ne0 && a->w.ne1 == b->w.ne1 && a->w.row_bytes == b->w.row_bytes &&
           !memcmp(a->i, b->i, sizeof a->i) && a->f == b->f && a->n == b->n;
}

/* Every compute op goes through here: run, record or check against the recording. */
static int issue(gb *g, const call *c, md_err *e) {
    switch (g->mode) {
    case M_OFF:
    case M_EAGER: return run_call(g, c, e);
    case M_RECORD: {
        rec *r = g->cur;
        if (g->fail_at && g->n_records == g->fail_at && r->n >= 20) {
            g->recording_failed = 1; /* an allocation inside a capture, say */
            return md_errf(e, MD_EINVAL, "cpu-graph: injected failure while recording");
        }
        if (r->n == r->cap) {
            int cap = r->cap ? 2 * r->cap : 256;
            call *nc = realloc(r->calls, (size_t)cap * sizeof *nc);
            if (!nc)
                return md_errf(e, MD_ENOMEM, "cpu-graph: out of memory");
            r->calls = nc;
            r->cap = cap;
        }
        r->calls[r->n++] = *c;
        return 0;
    }
    case M_REPLAY: {
        rec *r = g->cur;
        if (g->pos >= r->n)
            return violation(g, e, "replay: more ops than recorded (extra %s)", op_names[c->op]);
        if (!same_call(&r->calls[g->pos], c))
            return violation(g, e, "replay: %s differs from the recorded call (a stale kernel "
                                   "argument in a real graph)",
                             op_names[c->op]);
        g->pos++;
        return 0;
    }
    }
    return 0;
}

#define IN(be) (G(be)->in)

static void gb_free(md_backend *be) {
    gb *g = G(be);
    for (int i = 0; i < g->n_recs; i++)
        free(g->recs[i].calls);
    md_backend_free(g->in);
    free(g);
}
static const char *gb_describe(md_backend *be) {
    return IN(be)->ops->describe(IN(be));
}
static int gb_buf_alloc(md_backend *be, size_t bytes, md_buf **out, md_err *e) {
    return IN(be)->ops->buf_alloc(IN(be), bytes, out, e);
}
static int gb_buf_wrap(md_backend *be, const void *host, size_t bytes, md_buf **out, md_err *e) {
    return IN(be)->ops->buf_wrap(IN(be), host, bytes, out, e);
}
/* The wrapped backend's own weight layout (its repacked weights), so results match it. */
static int gb_weight_wrap(md_backend *be, const void *host, size_t bytes, int type, int64_t ne0,
                          int64_t ne1, void (*done)(void *, const void *, size_t), void *done_ctx,
                          md_buf **out, int *copied, md_err *e) {
    *copied = 0;
    if (!IN(be)->ops->weight_wrap)
        return IN(be)->ops->buf_wrap(IN(be), host, bytes, out, e);
    return IN(be)->ops->weight_wrap(IN(be), host, bytes, type, ne0, ne1, done, done_ctx, out,
                                    copied, e);
}
static void gb_buf_free(md_backend *be, md_buf *b) {
    IN(be)->ops->buf_free(IN(be), b);
}
static int in_step(gb *g, md_err *e, const char *what) {
    if (g->mode == M_RECORD || g->mode == M_REPLAY)
        return violation(g, e, "%s between step_begin and step_end", what);
    return 0;
}
static int gb_buf_upload(md_backend *be, md_buf *dst, size_t off, const void *src, size_t n,
                         md_err *e) {
    int rc = in_step(G(be), e, "buf_upload");
    return rc ? rc : IN(be)->ops->buf_upload(IN(be), dst, off, src, n, e);
}
static int gb_buf_download(md_backend *be, const md_buf *src, size_t off, void *dst, size_t n,
                           md_err *e) {
    int rc = in_step(G(be), e, "buf_download");
    return rc ? rc : IN(be)->ops->buf_download(IN(be), src, off, dst, n, e);
}
static int gb_buf_zero(md_backend *be, md_buf *b, size_t off, size_t n, md_err *e) {
    int rc = in_step(G(be), e, "buf_zero");
    return rc ? rc : IN(be)->ops->buf_zero(IN(be), b, off, n, e);
}
static int gb_reserve(md_backend *be, const md_reserve *r, md_err *e) {
    return IN(be)->ops->reserve(IN(be), r, e);
}
static int gb_sync(md_backend *be, md_err *e) {
    int rc = in_step(G(be), e, "sync");
    return rc ? rc : IN(be)->ops->sync(IN(be), e);
}
static int gb_check_fits(md_backend *be, size_t need, const char *what, md_err *e) {
    return IN(be)->ops->check_fits(IN(be), need, what, e);
}
static int gb_argmax(md_backend *be, const md_buf *x, int rows, int n, int32_t *out, md_err *e) {
    int rc = in_step(G(be), e, "argmax");
    return rc ? rc : IN(be)->ops->argmax(IN(be), x, rows, n, out, e);
}

/* The step's key: decode steps (one token per sequence), or any step with ":all". */
static int gb_batch_prepare(md_backend *be, const md_batch *b, md_err *e) {
    gb *g = G(be);
    int rc = in_step(g, e, "batch_prepare");
    if (rc || (rc = IN(be)->ops->batch_prepare(IN(be), b, e)))
        return rc;
    memset(g->key, 0, sizeof g->key);
    g->key[0] = b->n_tokens;
    g->key[1] = b->n_seqs;
    g->key[2] = b->n_logits;
    g->keyable = b->n_tokens == b->n_seqs;
    if (!g->keyable && g->all && b->n_seqs <= KEY_INTS - 3) {
        g->keyable = 1;
        for (int t = 0; t < b->n_tokens; t++)
            g->key[3 + b->tok_seq[t]]++;
    }
    return 0;
}

static int gb_step_begin(md_backend *be, md_err *e) {
    gb *g = G(be);
    if (g->mode == M_RECORD || g->mode == M_REPLAY)
        return violation(g, e, "%s", "step_begin inside a step");
    g->mode = M_EAGER;
    g->cur = NULL;
    if (!g->keyable)
        return 0;
    rec *r = NULL;
    for (int i = 0; i < g->n_recs && !r; i++)
        if (!memcmp(g->recs[i].key, g->key, sizeof g->key))
            r = &g->recs[i];
    if (!r) {
        if (g->n_recs == MAX_KEYS)
            return 0;
        r = &g->recs[g->n_recs++];
        memcpy(r->key, g->key, sizeof g->key);
    }
    if (++r->seen < 2)
        return 0;
    g->cur = r;
    if (r->n > 0) {
        g->mode = M_REPLAY;
        g->pos = 0;
    } else {
        g->mode = M_RECORD;
        g->n_records++;
        g->recording_failed = 0;
    }
    return 0;
}

static int gb_step_end(md_backend *be, int failed, md_err *e) {
    gb *g = G(be);
    int mode = g->mode;
    rec *r = g->cur;
    g->mode = M_OFF;
    g->cur = NULL;
    if (mode == M_EAGER) {
        g_stats.eager_steps++;
        return 0;
    }
    if (mode == M_OFF)
        return violation(g, e, "%s", "step_end without step_begin");
    if (mode == M_RECORD && (failed || g->recording_failed)) {
        r->n = 0; /* dropped, as a failed capture is; recorded again next time */
        r->seen = 1;
        g_stats.reruns++;
        return MD_STEP_RERUN;
    }
    if (failed)
        return failed;
    if (mode == M_REPLAY && g->pos != r->n)
        return violation(g, e, "%s", "replay: fewer ops than recorded");
    for (int i = 0; i < r->n; i++) {
        int rc = run_call(g, &r->calls[i], e);
        if (rc)
            return rc;
    }
    if (mode == M_RECORD)
        g_stats.recorded++;
    else
        g_stats.replayed++;
    return 0;
}

static int gb_embed(md_backend *be, const md_tensor *w, md_buf *out, md_err *e) {
    call c = {.op = OP_EMBED, .w = *w, .buf = {out}};
    return issue(G(be), &c, e);
}
static int gb_matmul(md_backend *be, const md_tensor *w, const md_buf *x, md_buf *y, int T,
                     md_err *e) {
    call c = {.op = OP_MATMUL, .w = *w, .buf = {x, y}, .i = {T}};
    return issue(G(be), &c, e);
}
static int gb_add_bias(md_backend *be, md_buf *y, const md_tensor *bias, int T, md_err *e) {
    call c = {.op = OP_ADD_BIAS, .w = *bias, .buf = {y}, .i = {T}};
    return issue(G(be), &c, e);
}
static int gb_rmsnorm(md_backend *be, const md_buf *x, const md_tensor *w, md_buf *out, int T,
                      int C, float eps, md_err *e) {
    call c = {.op = OP_RMSNORM, .w = *w, .buf = {x, out}, .i = {T, C}, .f = eps};
    return issue(G(be), &c, e);
}
static int gb_rope(md_backend *be, md_buf *x, int n_heads, int head_dim, int rot_dims,
                   const md_buf *inv_freq, int neox, md_err *e) {
    call c = {.op = OP_ROPE, .buf = {x, inv_freq}, .i = {n_heads, head_dim, rot_dims, neox}};
    return issue(G(be), &c, e);
}
static int gb_kv_write(md_backend *be, const md_buf *k, const md_buf *v, md_buf *kc, md_buf *vc,
                       int kv_dim, int cache_type, md_err *e) {
    call c = {.op = OP_KV_WRITE, .buf = {k, v, kc, vc}, .i = {kv_dim, cache_type}};
    return issue(G(be), &c, e);
}
static int gb_attention(md_backend *be, const md_buf *q, const md_buf *kc, const md_buf *vc,
                        md_buf *out, int n_heads, int n_kv_heads, int head_dim, int cache_type,
                        float scale, md_err *e) {
    call c = {.op = OP_ATTENTION,
              .buf = {q, kc, vc, out},
              .i = {n_heads, n_kv_heads, head_dim, cache_type},
              .f = scale};
    return issue(G(be), &c, e);
}
static int gb_swiglu(md_backend *be, const md_buf *gate, const md_buf *up, md_buf *out, int64_t n,
                     md_err *e) {
    call c = {.op = OP_SWIGLU, .buf = {gate, up, out}, .n = n};
    return issue(G(be), &c, e);
}
static int gb_add(md_backend *be, md_buf *x, const md_buf *y, int64_t n, md_err *e) {
    call c = {.op = OP_ADD, .buf = {x, y}, .n = n};
    return issue(G(be), &c, e);
}
static int gb_gather_rows(md_backend *be, const md_buf *x, md_buf *out, int C, md_err *e) {
    call c = {.op = OP_GATHER, .buf = {x, out}, .i = {C}};
    return issue(G(be), &c, e);
}

static const md_backend_ops gb_ops = {
    .name = "cpu-graph",
    .free = gb_free,
    .describe = gb_describe,
    .buf_alloc = gb_buf_alloc,
    .buf_wrap = gb_buf_wrap,
    .weight_wrap = gb_weight_wrap,
    .buf_free = gb_buf_free,
    .buf_upload = gb_buf_upload,
    .buf_download = gb_buf_download,
    .buf_zero = gb_buf_zero,
    .reserve = gb_reserve,
    .batch_prepare = gb_batch_prepare,
    .embed = gb_embed,
    .matmul = gb_matmul,
    .add_bias = gb_add_bias,
    .rmsnorm = gb_rmsnorm,
    .rope = gb_rope,
    .kv_write = gb_kv_write,
    .attention = gb_attention,
    .swiglu = gb_swiglu,
    .add = gb_add,
    .gather_rows = gb_gather_rows,
    .sync = gb_sync,
    .check_fits = gb_check_fits,
    .argmax = gb_argmax,
    .step_begin = gb_step_begin,
    .step_end = gb_step_end,
};

/* ":sample": the backend draws sampled, penalised and logprob rows itself, with the engine's
 * own row sampler (smp_sample_row), as a device would; the logits never leave the "device"
 * for those rows. */
static int gb_sample(md_backend *be, const md_buf *x, int rows, int n, const md_sample_params *p,
                     const md_sample_pen *pen, int n_pen, int32_t *out, float *logprob,
                     int32_t *top_tok, float *top_lp, md_err *e) {
    int rc = in_step(G(be), e, "sample");
    if (rc)
        return rc;
    float *l = malloc((size_t)rows * n * sizeof *l);
    smp_scratch *sc = smp_scratch_new(n);
    if (!l || !sc) {
        free(l);
        smp_scratch_free(sc);
        return md_errf(e, MD_ENOMEM, "cpu-graph: out of memory");
    }
    rc = IN(be)->ops->buf_download(IN(be), x, 0, l, (size_t)rows * n * sizeof *l, e);
    for (int r = 0; rc == 0 && r < rows; r++) {
        float *row = l + (size_t)r * n;
        int nan = 0;
        for (int i = 0; i < n; i++)
            nan |= row[i] != row[i];
        if (p[r].pen_off < 0 || p[r].pen_n < 0 || p[r].pen_off + p[r].pen_n > n_pen) {
            rc = md_errf(e, MD_EINVAL, "cpu-graph: row %d names entries outside the %d given", r,
                         n_pen);
            break;
        }
        /* the constraint first: the "raw" row of the logprobs is the constrained one */
        md_sample_params pr = p[r];
        if (!nan)
            smp_constrain(&pr, row, n);
        pr.mask = NULL;
        pr.bias = NULL;
        pr.n_bias = 0;
        if (top_tok) { /* from the raw row, before the penalties */
            int32_t *tt = top_tok + (size_t)r * MD_SAMPLE_TOP;
            float *tl = top_lp + (size_t)r * MD_SAMPLE_TOP;
            int m = nan || p[r].n_top <= 0 ? 0 : smp_top_logprobs(row, n, p[r].n_top, tt, tl);
            for (int j = m; j < MD_SAMPLE_TOP; j++) {
                tt[j] = -1;
                tl[j] = 0;
            }
            g_stats.top_rows += m > 0;
        }
        float lp = 0;
        out[r] = nan ? -1 : smp_sample_row(&pr, pen, row, n, sc, logprob ? &lp : NULL);
        if (logprob)
            logprob[r] = lp;
        g_stats.sampled_rows += p[r].temperature > 0;
        g_stats.penalised_rows += p[r].pen_n > 0;
    }
    free(l);
    smp_scratch_free(sc);
    return rc;
}

static int gb_open(const char *device, int n_threads, md_backend **out, md_err *e) {
    gb *g = calloc(1, sizeof *g);
    if (!g)
        return md_errf(e, MD_ENOMEM, "cpu-graph: out of memory");
    g->ops = gb_ops;
    for (const char *p = strchr(device, ':'); p; p = strchr(p + 1, ':')) {
        if (!strncmp(p + 1, "all", 3))
            g->all = 1;
        else if (!strncmp(p + 1, "sample", 6))
            g->ops.sample = gb_sample;
        else if (!strncmp(p + 1, "fail=", 5))
            g->fail_at = atoi(p + 6);
        else {
            free(g);
            return md_errf(e, MD_EINVAL, "cpu-graph: unknown option in \"%s\"", device);
        }
    }
    int rc = md_backend_cpu_open(n_threads, &g->in, e);
    if (rc) {
        free(g);
        return rc;
    }
    g->ops.kv_cache_type = g->in->ops->kv_cache_type; /* the wrapped backend's cache */
    g->base.ops = &g->ops;
    *out = &g->base;
    return 0;
}

int graph_backend_register(md_err *e) {
    return md_backend_register("cpu-graph", gb_open, e);
}

void graph_backend_get_stats(graph_backend_stats *out) {
    *out = g_stats;
}

void graph_backend_reset_stats(void) {
    memset(&g_stats, 0, sizeof g_stats);
}
