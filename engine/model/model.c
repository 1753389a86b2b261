/* model.c — the batched forward pass of a loaded model (model_load.c): one step of T tokens
 * from any number of sequences over the paged KV cache, with its KV and activation buffers.
 * The architectures differ only in flags of md_hparams (docs/models.md, "Architectures"). */
#include "engine/model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model_int.h"

size_t md_kv_bytes_per_token(const md_hparams *hp, int kv_type) {
    return (size_t)hp->n_layer * 2 *
           md_type_row_bytes(kv_type, (int64_t)hp->n_head_kv * hp->head_dim);
}

int md_kv_bufs_alloc(md_model *m, int n_slots, md_kv_bufs *kv, md_err *e) {
    return md_kv_bufs_alloc_type(m, n_slots, BE(m)->ops->kv_cache_type, kv, e);
}

int md_kv_bufs_alloc_type(md_model *m, int n_slots, int type, md_kv_bufs *kv, md_err *e) {
    memset(kv, 0, sizeof *kv);
    int L = m->hp.n_layer;
    kv->k = calloc((size_t)L, sizeof *kv->k);
    kv->v = calloc((size_t)L, sizeof *kv->v);
    kv->n_slots = n_slots;
    kv->type = type;
    if (!kv->k || !kv->v) {
        md_kv_bufs_free(m, kv);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    size_t bytes =
        (size_t)n_slots * md_type_row_bytes(kv->type, (int64_t)m->hp.n_head_kv * m->hp.head_dim);
    for (int l = m->lo; l < m->hi; l++) {
        int rc;
        if ((rc = CALL(m, buf_alloc, bytes, &kv->k[l], e)) ||
            (rc = CALL(m, buf_alloc, bytes, &kv->v[l], e))) {
            md_kv_bufs_free(m, kv);
            return md_errctx(e, "KV cache of %d slots: ", n_slots);
        }
    }
    return 0;
}

void md_kv_bufs_free(md_model *m, md_kv_bufs *kv) {
    for (int l = 0; kv->k && l < m->hp.n_layer; l++)
        if (kv->k[l])
            CALL(m, buf_free, kv->k[l]);
    for (int l = 0; kv->v && l < m->hp.n_layer; l++)
        if (kv->v[l])
            CALL(m, buf_free, kv->v[l]);
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

int md_fwd_alloc(md_model *m, int max_tokens, int max_logits, md_fwd *f, md_err *e) {
    memset(f, 0, sizeof *f);
    const md_hparams *hp = &m->hp;
    size_t T = (size_t)max_tokens, fl = sizeof(float);
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    size_t C = (size_t)hp->n_embd;
    struct {
        md_buf **b;
        size_t n;
    } want[] = {
        {&f->x, T * C},           {&f->xb, T * (C > qd ? C : qd)},
        {&f->q, T * qd},          {&f->k, T * kvd},
        {&f->v, T * kvd},         {&f->att, T * qd},
        {&f->hb, T * hp->n_ff},   {&f->hb2, T * hp->n_ff},
        {&f->xl, max_logits * C}, {&f->logits, (size_t)max_logits * hp->n_vocab},
    };
    f->max_tokens = max_tokens;
    f->max_logits = max_logits;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int rc = CALL(m, buf_alloc, want[i].n * fl, want[i].b, e);
        if (rc) {
            md_fwd_free(m, f);
            return md_errctx(e, "activation buffers for %d tokens: ", max_tokens);
        }
    }
    return 0;
}

void md_fwd_free(md_model *m, md_fwd *f) {
    md_buf *all[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->xl, f->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            CALL(m, buf_free, all[i]);
    memset(f, 0, sizeof *f);
}

static int forward_ops(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b, md_err *e);

/* batch_prepare, then (for a stage after the first) the hidden states entering layer lo. */
static int prepare(md_model *m, md_fwd *f, const md_batch *b, const float *in, md_err *e) {
    int T = b->n_tokens, rc;
    if (T > f->max_tokens || b->n_logits > f->max_logits)
        return md_errf(e, MD_ERANGE, "step of %d tokens / %d logits exceeds buffers of %d / %d", T,
                       b->n_logits, f->max_tokens, f->max_logits);
    if ((rc = CALL(m, batch_prepare, b, e)))
        return rc;
    if (m->lo > 0)
        return CALL(m, buf_upload, f->x, 0, in, (size_t)T * m->hp.n_embd * sizeof(float), e);
    return 0;
}

/* The device work of the pass, bracketed for step recording when the backend records. */
static int run_pass(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b, md_err *e) {
    const md_backend_ops *ops = BE(m)->ops;
    int rc;
    int record = ops->step_begin && ops->step_end;
    if (record && (rc = ops->step_begin(BE(m), e)))
        return rc;
    rc = forward_ops(m, f, kv, b, e);
    if (record) {
        md_err se = {0};
        int end = ops->step_end(BE(m), rc, &se);
        if (end == MD_STEP_RERUN) /* the recording was dropped: issue the ops again */
            rc = forward_ops(m, f, kv, b, e);
        else if (end < 0 && rc == 0) {
            if (e)
                *e = se;
            rc = end;
        }
    }
    return rc;
}

/* ids [rows] = the argmax of each logit row, downloaded row by row, for a backend without an
 * argmax op (test backends): the lowest index on ties, -1 for a row with a NaN. */
static int host_argmax(md_model *m, md_fwd *f, int rows, int32_t *ids, md_err *e) {
    int V = m->hp.n_vocab, rc = 0;
    float *row = malloc((size_t)V * sizeof *row);
    if (!row)
        return md_errf(e, MD_ENOMEM, "argmax: no memory for a row of %d logits", V);
    for (int r = 0; r < rows && rc == 0; r++) {
        if ((rc = CALL(m, buf_download, f->logits, (size_t)r * V * sizeof(float), row,
                       (size_t)V * sizeof(float), e)))
            break;
        int best = 0;
        for (int i = 0; i < V && best >= 0; i++)
            if (row[i] != row[i])
                best = -1;
            else if (row[i] > row[best])
                best = i;
        ids[r] = best;
    }
    free(row);
    return rc;
}

int md_model_forward_stage(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b,
                           const float *in, float *out, md_err *e) {
    int rc = prepare(m, f, b, in, e);
    if (rc || (rc = run_pass(m, f, kv, b, e)))
        return rc;
    if (!out || m->tp_rank > 0) /* a tensor-parallel rank other than 0 gives nothing back */
        return CALL(m, sync, e);
    if (m->hi < m->hp.n_layer)
        return CALL(m, buf_download, f->x, 0, out,
                    (size_t)b->n_tokens * m->hp.n_embd * sizeof(float), e);
    if (b->n_logits == 0)
        return CALL(m, sync, e);
    if (b->argmax_only) {                      /* ids as floats, exact below 2^24 */
        int32_t *ids = (int32_t *)(void *)out; /* same size as the floats they become */
        if ((rc = BE(m)->ops->argmax
                      ? CALL(m, argmax, f->logits, b->n_logits, m->hp.n_vocab, ids, e)
                      : host_argmax(m, f, b->n_logits, ids, e)))
            return rc;
        for (int i = 0; i < b->n_logits; i++) {
            float v = (float)ids[i];
            memcpy(&out[i], &v, sizeof v);
        }
        return 0;
    }
    return CALL(m, buf_download, f->logits, 0, out,
                (size_t)b->n_logits * m->hp.n_vocab * sizeof(float), e);
}

int md_model_forward(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b, float *logits,
                     md_err *e) {
    const md_hparams *hp = &m->hp;
    if (m->lo != 0 || m->hi != hp->n_layer)
        return md_errf(e, MD_EINVAL,
                       "md_model_forward on layers %d-%d of %d: a stage runs "
                       "through md_model_forward_stage",
                       m->lo, m->hi - 1, hp->n_layer);
    int rc = prepare(m, f, b, NULL, e);
    if (rc || (rc = run_pass(m, f, kv, b, e)))
        return rc;
    if (b->n_logits == 0)
        return CALL(m, sync, e);
    if (!logits)
        return 0; /* the caller reads f->logits itself (device argmax, a subset of rows) */
    if (f->hidden_only)
        return CALL(m, buf_download, f->xl, 0, logits,
                    (size_t)b->n_logits * hp->n_embd * sizeof(float), e);
    return CALL(m, buf_download, f->logits, 0, logits,
                (size_t)b->n_logits * hp->n_vocab * sizeof(float), e);
}

/* x [T, C] += in · wᵀ: fused into the product when the backend has matmul_n, else through
 * tmp and an add. With post_norm (Gemma 3) x += rmsnorm(in · wᵀ) · post_norm, through tmp. */
static int residual(md_model *m, int fused, const md_tensor *w, const md_tensor *post_norm,
                    md_buf *in, md_buf *tmp, md_buf *x, int T, md_err *e) {
    int rc;
    if (m->tp_n > 1) { /* a partial product: summed over the ranks before the add */
        if ((rc = CALL(m, matmul, w, in, tmp, T, e)) ||
            (rc = m->allreduce(m->allreduce_ctx, m->tp_rank, tmp, (int64_t)T * w->ne1, e)))
            return rc;
    } else if (fused && !post_norm)
        return BE(m)->ops->matmul_n(BE(m), 1, &w, in, &x, T, MD_MM_ACC, e);
    else if ((rc = CALL(m, matmul, w, in, tmp, T, e)))
        return rc;
    if (post_norm && (rc = CALL(m, rmsnorm, tmp, post_norm, tmp, T, (int)w->ne1, m->hp.eps, e)))
        return rc;
    return CALL(m, add, x, tmp, (int64_t)T * w->ne1, e);
}

/* The device work of one forward pass: embedding, layers, and the head on the rows that need
 * logits. Between step_begin and step_end: arguments depend on the step's shape only. */
static int forward_ops(md_model *m, md_fwd *f, md_kv_bufs *kv, const md_batch *b, md_err *e) {
    const md_hparams *hp = &m->hp;
    int T = b->n_tokens, C = hp->n_embd, F = hp->n_ff;
    int kvd = hp->n_head_kv * hp->head_dim;
    float scale = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim);
    int rc;
    if (m->lo == 0 && (rc = CALL(m, embed, &m->tok_embd, f->x, e)))
        return rc;
    const md_backend_ops *O = BE(m)->ops;
    /* Gemma: embeddings times sqrt(n_embd) (check_ops made sure the op is there) */
    if (m->lo == 0 && hp->embd_scale != 0 &&
        (rc = O->scale(BE(m), f->x, hp->embd_scale, (int64_t)T * C, e)))
        return rc;
    int fused = O->matmul_n && m->fused;
    for (int l = m->lo; l < m->hi; l++) {
        const md_layer *L = &m->layers[l];
        int swa = md_layer_is_swa(hp, l);
        const md_buf *inv = swa && m->inv_freq_swa ? m->inv_freq_swa : m->inv_freq;
        const md_tensor *pa = hp->post_norms ? &L->post_attn_norm : NULL;
        const md_tensor *pf = hp->post_norms ? &L->post_ffn_norm : NULL;
        /* attention block: x [T, C] += wo · attn(rope(wq·n(x)), rope(wk·n(x)), wv·n(x)) */
        if ((rc = CALL(m, rmsnorm, f->x, &L->attn_norm, f->xb, T, C, hp->eps, e)))
            return rc;
        if (fused) {
            const md_tensor *w[3] = {&L->wq, &L->wk, &L->wv};
            md_buf *y[3] = {f->q, f->k, f->v};
            rc = O->matmul_n(BE(m), 3, w, f->xb, y, T, MD_MM_SET, e);
        } else if (!(rc = CALL(m, matmul, &L->wq, f->xb, f->q, T, e)) &&
                   !(rc = CALL(m, matmul, &L->wk, f->xb, f->k, T, e)))
            rc = CALL(m, matmul, &L->wv, f->xb, f->v, T, e);
        if (rc)
            return rc;
        if (L->bq.buf && ((rc = CALL(m, add_bias, f->q, &L->bq, T, e)) ||
                          (rc = CALL(m, add_bias, f->k, &L->bk, T, e)) ||
                          (rc = CALL(m, add_bias, f->v, &L->bv, T, e))))
            return rc;
        /* QK-norm: q [T * n_head, head_dim] and k [T * n_head_kv, head_dim] rows normalized */
        if (hp->qk_norm && ((rc = CALL(m, rmsnorm, f->q, &L->q_norm, f->q, T * hp->n_head,
                                       hp->head_dim, hp->eps, e)) ||
                            (rc = CALL(m, rmsnorm, f->k, &L->k_norm, f->k, T * hp->n_head_kv,
                                       hp->head_dim, hp->eps, e))))
            return rc;
        if (fused && O->rope_kv)
            rc = O->rope_kv(BE(m), f->q, f->k, f->v, kv->k[l], kv->v[l], hp->n_head, hp->n_head_kv,
                            hp->head_dim, hp->rot_dims, inv, hp->rope_neox, kv->type, e);
        else if (!(rc = CALL(m, rope, f->q, hp->n_head, hp->head_dim, hp->rot_dims, inv,
                             hp->rope_neox, e)) &&
                 !(rc = CALL(m, rope, f->k, hp->n_head_kv, hp->head_dim, hp->rot_dims, inv,
                             hp->rope_neox, e)))
            rc = CALL(m, kv_write, f->k, f->v, kv->k[l], kv->v[l], kvd, kv->type, e);
        if (rc)
            return rc;
        if (swa)
            rc = O->attention_window(BE(m), f->q, kv->k[l], kv->v[l], f->att, hp->n_head,
                                     hp->n_head_kv, hp->head_dim, kv->type, scale, hp->n_swa, e);
        else
            rc = CALL(m, attention, f->q, kv->k[l], kv->v[l], f->att, hp->n_head, hp->n_head_kv,
                      hp->head_dim, kv->type, scale, e);
        if (rc || (rc = residual(m, fused, &L->wo, pa, f->att, f->xb, f->x, T, e)))
            return rc;
        /* feed-forward block: x += w_down · (act(w_gate·n(x)) * (w_up·n(x))), act silu or gelu */
        if ((rc = CALL(m, rmsnorm, f->x, &L->ffn_norm, f->xb, T, C, hp->eps, e)))
            return rc;
        if (fused) {
            const md_tensor *w[2] = {&L->w_gate, &L->w_up};
            md_buf *y[2] = {f->hb, f->hb2};
            rc = O->matmul_n(BE(m), 2, w, f->xb, y, T, hp->ffn_gelu ? MD_MM_SET : MD_MM_SWIGLU, e);
        } else if (!(rc = CALL(m, matmul, &L->w_gate, f->xb, f->hb, T, e)) &&
                   !(rc = CALL(m, matmul, &L->w_up, f->xb, f->hb2, T, e)) && !hp->ffn_gelu)
            rc = CALL(m, swiglu, f->hb, f->hb2, f->hb, (int64_t)T * F, e);
        if (!rc && hp->ffn_gelu)
            rc = O->geglu(BE(m), f->hb, f->hb2, f->hb, (int64_t)T * F, e);
        if (rc || (rc = residual(m, fused, &L->w_down, pf, f->hb, f->xb, f->x, T, e)))
            return rc;
    }
    if (b->n_logits == 0 || m->hi < hp->n_layer || m->tp_rank > 0)
        return 0;
    /* head only on the rows that need logits: xl [n_logits, C] -> logits [n_logits, V] */
    if ((rc = CALL(m, gather_rows, f->x, f->xl, C, e)) ||
        (rc = CALL(m, rmsnorm, f->xl, &m->out_norm, f->xl, b->n_logits, C, hp->eps, e)))
        return rc;
    return f->hidden_only ? 0 : CALL(m, matmul, &m->output, f->xl, f->logits, b->n_logits, e);
}
