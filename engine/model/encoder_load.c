/* encoder_load.c — an encoder from GGUF metadata and tensors onto one backend: the table of
 * encoder architectures, hyperparameters (llama.cpp's `bert` keys), and each weight bound as a
 * backend buffer after its shape and type are checked. The forward pass is encoder.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/encoder.h"
#include "engine/weights/quant.h"

/* What differs between encoder architectures, one row each: the row of position 0 in the
 * position table (XLM-RoBERTa would be 2: padding_idx + 1) and whether token-type embeddings
 * exist. Rotary positions or a gated FFN (NomicBERT, ModernBERT) would add a column and a
 * branch in encoder.c. */
static const struct {
    const char *arch;
    int pos_offset;
    int token_types;
} enc_arches[] = {
    {"bert", 0, 1},
};

static int arch_row(const char *arch) {
    for (size_t i = 0; i < sizeof enc_arches / sizeof enc_arches[0]; i++)
        if (!strcmp(arch, enc_arches[i].arch))
            return (int)i;
    return -1;
}

int md_encoder_is(const gguf_file *gf) {
    const char *a;
    size_t n;
    char arch[32];
    if (gguf_get_str(gf, "general.architecture", &a, &n, NULL) || n >= sizeof arch)
        return 0;
    memcpy(arch, a, n);
    arch[n] = 0;
    return arch_row(arch) >= 0;
}

static int key_int(const gguf_file *gf, const char *arch, const char *key, int required, int lo,
                   int hi, int *out, md_err *e) {
    char k[128];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int rc = gguf_get_i64(gf, k, &v, e);
    if (rc == MD_ENOTFOUND && !required) {
        md_err_clear(e);
        return 0;
    }
    if (rc == MD_ENOTFOUND)
        return md_errf(e, MD_EFORMAT, "model metadata lacks %s", k);
    if (rc)
        return rc;
    if (v < lo || v > hi)
        return md_errf(e, MD_EFORMAT, "%s = %lld is outside %d..%d", k, (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

int md_enc_hparams_read(const gguf_file *gf, md_enc_hparams *hp, md_err *e) {
    memset(hp, 0, sizeof *hp);
    const char *a;
    size_t n;
    int rc = gguf_get_str(gf, "general.architecture", &a, &n, e);
    if (rc)
        return rc;
    snprintf(hp->arch, sizeof hp->arch, "%.*s", (int)(n < 31 ? n : 31), a);
    int row = arch_row(hp->arch);
    if (row < 0 || n >= sizeof hp->arch)
        return md_errf(e, MD_EUNSUPP, "architecture \"%s\" is not an encoder medley runs (bert is)",
                       hp->arch);
    hp->pos_offset = enc_arches[row].pos_offset;
    hp->pooling = -1;
    if ((rc = key_int(gf, hp->arch, "block_count", 1, 1, 1024, &hp->n_layer, e)) ||
        (rc = key_int(gf, hp->arch, "embedding_length", 1, 1, 65536, &hp->n_embd, e)) ||
        (rc = key_int(gf, hp->arch, "attention.head_count", 1, 1, 1024, &hp->n_head, e)) ||
        (rc = key_int(gf, hp->arch, "feed_forward_length", 1, 1, 1 << 20, &hp->n_ff, e)) ||
        (rc = key_int(gf, hp->arch, "context_length", 1, 1, 1 << 20, &hp->n_ctx, e)) ||
        (rc = key_int(gf, hp->arch, "pooling_type", 0, 0, 4, &hp->pooling, e)))
        return rc;
    if (hp->n_embd % hp->n_head)
        return md_errf(e, MD_EFORMAT, "width %d does not divide into %d heads", hp->n_embd,
                       hp->n_head);
    hp->head_dim = hp->n_embd / hp->n_head;
    hp->eps = 1e-12f;
    char k[128];
    snprintf(k, sizeof k, "%s.attention.layer_norm_epsilon", hp->arch);
    rc = gguf_get_f32(gf, k, &hp->eps, e);
    if (rc == MD_ENOTFOUND)
        md_err_clear(e);
    else if (rc)
        return rc;
    if (!(hp->eps > 0) || hp->eps > 1)
        return md_errf(e, MD_EFORMAT, "%s = %g is not usable", k, hp->eps);
    return 0;
}

/* Keep a host allocation until the encoder is freed (the CPU backend aliases wrapped memory). */
static int own(md_encoder *m, void *p, md_err *e) {
    void **o = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *o);
    if (!o) {
        free(p);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    m->owned = o;
    m->owned[m->n_owned++] = p;
    return 0;
}

/* Wrap host data as a backend buffer the encoder frees. */
static int wrap(md_encoder *m, const void *data, size_t bytes, md_buf **b, md_err *e) {
    md_buf **nb = realloc(m->bufs, (size_t)(m->n_bufs + 1) * sizeof *nb);
    if (!nb)
        return md_errf(e, MD_ENOMEM, "out of memory");
    m->bufs = nb;
    int rc = m->be->ops->buf_wrap(m->be, data, bytes, b, e);
    if (rc == 0)
        m->bufs[m->n_bufs++] = *b;
    return rc;
}

/* Bind tensor `name` of shape [ne0, ne1] (ne1 = 1: a vector, which must be F32). */
static int bind(md_encoder *m, const gguf_file *gf, const char *name, int64_t ne0, int64_t ne1,
                md_tensor *t, md_err *e) {
    memset(t, 0, sizeof *t);
    const gguf_tensor *g = gguf_find_tensor(gf, name);
    if (!g)
        return md_errf(e, MD_EFORMAT, "model lacks tensor %s", name);
    if (g->ne[0] != ne0 || g->ne[1] != ne1 || g->ne[2] != 1 || g->ne[3] != 1)
        return md_errf(e, MD_EFORMAT, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]",
                       name, (long long)g->ne[0], (long long)g->ne[1], (long long)ne0,
                       (long long)ne1);
    size_t rb = md_type_row_bytes(g->type, ne0);
    if (!md_type_supported(g->type) || rb == 0 || (ne1 == 1 && g->type != MD_TYPE_F32))
        return md_errf(e, MD_EUNSUPP, "tensor %s has type %s (%d), not supported here", name,
                       md_type_name(g->type) ? md_type_name(g->type) : "unknown", g->type);
    if (rb * (size_t)ne1 != g->n_bytes)
        return md_errf(e, MD_EFORMAT, "tensor %s holds %zu bytes, expected %zu", name, g->n_bytes,
                       rb * (size_t)ne1);
    const void *data = g->data;
    int type = g->type, rc;
    if (m->be->ops->weights_f32 && type != MD_TYPE_F32) { /* an exact backend: F32 copies */
        float *f = malloc((size_t)g->n_elements * sizeof *f);
        if (!f)
            return md_errf(e, MD_ENOMEM, "tensor %s: no memory to dequantize it", name);
        if ((rc = own(m, f, e)) || (rc = md_dequantize(type, data, f, g->n_elements, e)))
            return md_errctx(e, "tensor %s: ", name);
        data = f;
        type = MD_TYPE_F32;
        rb = (size_t)ne0 * sizeof(float);
    }
    if ((rc = wrap(m, data, rb * (size_t)ne1, &t->buf, e)))
        return rc;
    t->type = type;
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->row_bytes = rb;
    return 0;
}

/* Token type 0's row of token_types as an F32 vector (any stored type). */
static int bind_type0(md_encoder *m, const gguf_file *gf, md_err *e) {
    int C = m->hp.n_embd, rc;
    const gguf_tensor *g = gguf_find_tensor(gf, "token_types.weight");
    if (!g || g->ne[0] != C || g->ne[1] < 1 || g->ne[2] != 1 || g->ne[3] != 1 ||
        md_type_row_bytes(g->type, C) * (size_t)g->ne[1] != g->n_bytes)
        return md_errf(e, MD_EFORMAT, "tensor token_types.weight is %s, expected [%d, n_types]",
                       g ? "mis-shaped" : "missing", C);
    float *f = malloc((size_t)C * sizeof *f);
    if (!f)
        return md_errf(e, MD_ENOMEM, "out of memory");
    if ((rc = own(m, f, e)) || (rc = md_dequantize(g->type, g->data, f, C, e)) ||
        (rc = wrap(m, f, (size_t)C * sizeof *f, &m->type0.buf, e)))
        return md_errctx(e, "token_types.weight: ");
    m->type0.type = MD_TYPE_F32;
    m->type0.ne0 = C;
    m->type0.ne1 = 1;
    m->type0.row_bytes = (size_t)C * sizeof *f;
    return 0;
}

static int bind_layer(md_encoder *m, const gguf_file *gf, int l, md_err *e) {
    int C = m->hp.n_embd, F = m->hp.n_ff, rc = 0;
    md_enc_layer *L = &m->layers[l];
    struct {
        const char *name;
        int64_t ne0, ne1;
        md_tensor *t;
    } w[] = {
        {"attn_q.weight", C, C, &L->wq},
        {"attn_q.bias", C, 1, &L->bq},
        {"attn_k.weight", C, C, &L->wk},
        {"attn_k.bias", C, 1, &L->bk},
        {"attn_v.weight", C, C, &L->wv},
        {"attn_v.bias", C, 1, &L->bv},
        {"attn_output.weight", C, C, &L->wo},
        {"attn_output.bias", C, 1, &L->bo},
        {"attn_output_norm.weight", C, 1, &L->attn_norm_w},
        {"attn_output_norm.bias", C, 1, &L->attn_norm_b},
        {"ffn_up.weight", C, F, &L->w_up},
        {"ffn_up.bias", F, 1, &L->b_up},
        {"ffn_down.weight", F, C, &L->w_down},
        {"ffn_down.bias", C, 1, &L->b_down},
        {"layer_output_norm.weight", C, 1, &L->out_norm_w},
        {"layer_output_norm.bias", C, 1, &L->out_norm_b},
    };
    char name[96];
    for (size_t i = 0; i < sizeof w / sizeof w[0] && rc == 0; i++) {
        snprintf(name, sizeof name, "blk.%d.%s", l, w[i].name);
        rc = bind(m, gf, name, w[i].ne0, w[i].ne1, w[i].t, e);
    }
    return rc;
}

/* Every weight of the table row's layout. */
static int bind_all(md_encoder *m, const gguf_file *gf, md_err *e) {
    const md_enc_hparams *hp = &m->hp;
    int C = hp->n_embd, rc;
    const gguf_tensor *te = gguf_find_tensor(gf, "token_embd.weight");
    int64_t vocab = te ? te->ne[1] : 0;
    if (vocab < 1 || (hp->n_vocab && vocab != hp->n_vocab))
        return md_errf(e, MD_EFORMAT, "token_embd.weight is missing or has %lld rows, not %d",
                       (long long)vocab, hp->n_vocab);
    m->hp.n_vocab = (int)vocab;
    if ((rc = bind(m, gf, "token_embd.weight", C, vocab, &m->tok_embd, e)) ||
        (rc = bind(m, gf, "position_embd.weight", C, (int64_t)hp->n_ctx + hp->pos_offset,
                   &m->pos_embd, e)) ||
        (rc = bind(m, gf, "token_embd_norm.weight", C, 1, &m->embd_norm_w, e)) ||
        (rc = bind(m, gf, "token_embd_norm.bias", C, 1, &m->embd_norm_b, e)))
        return rc;
    if (enc_arches[arch_row(hp->arch)].token_types && (rc = bind_type0(m, gf, e)))
        return rc;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return md_errf(e, MD_ENOMEM, "out of memory");
    for (int l = 0; l < hp->n_layer; l++)
        if ((rc = bind_layer(m, gf, l, e)))
            return rc;
    return 0;
}

static void free_lins(md_encoder *m) {
    for (int l = 0; m->layers && m->be->ops->lin_free && l < m->hp.n_layer; l++) {
        md_enc_layer *L = &m->layers[l];
        md_lin **lins[] = {&L->lq, &L->lk, &L->lv, &L->lo, &L->l_up, &L->l_down};
        for (size_t i = 0; i < sizeof lins / sizeof lins[0]; i++) {
            m->be->ops->lin_free(m->be, *lins[i]);
            *lins[i] = NULL;
        }
    }
}

void md_encoder_free(md_encoder *m) {
    if (!m)
        return;
    md_buf *act[] = {m->x, m->xb, m->q, m->k, m->v, m->att, m->hb};
    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++)
        if (act[i])
            m->be->ops->buf_free(m->be, act[i]);
    free_lins(m);
    for (int i = 0; i < m->n_bufs; i++)
        m->be->ops->buf_free(m->be, m->bufs[i]);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->bufs);
    free(m->owned);
    free(m->layers);
    free(m);
}

/* The backend's ops the forward pass needs beyond the mandatory ones. */
static int check_ops(const md_backend_ops *o, md_err *e) {
    const char *missing = !o->layernorm       ? "layernorm"
                          : !o->gelu_erf      ? "gelu_erf"
                          : !o->embed_add     ? "embed_add"
                          : !o->attention_enc ? "attention_enc"
                                              : NULL;
    if (missing)
        return md_errf(e, MD_EUNSUPP,
                       "the %s backend has no %s op: encoder models run on cpu and cuda", o->name,
                       missing);
    return 0;
}

/* Each layer's six products prepared by the backend (none when it has no lin ops: then the
 * forward pass uses matmul, add_bias, gelu_erf and add). */
static int prepare_lins(md_encoder *m, int bf16, md_err *e) {
    const md_backend_ops *o = m->be->ops;
    free_lins(m);
    m->bf16 = 0;
    if (!o->lin_prepare || !o->lin || !o->lin_free)
        return bf16 ? md_errf(e, MD_EUNSUPP, "the %s backend has no BF16 encoder products",
                              o->name)
                    : 0;
    int f = bf16 ? MD_LIN_BF16 : 0, rc = 0;
    for (int l = 0; l < m->hp.n_layer && rc == 0; l++) {
        md_enc_layer *L = &m->layers[l];
        if ((rc = o->lin_prepare(m->be, &L->wq, &L->bq, f, &L->lq, e)) ||
            (rc = o->lin_prepare(m->be, &L->wk, &L->bk, f, &L->lk, e)) ||
            (rc = o->lin_prepare(m->be, &L->wv, &L->bv, f, &L->lv, e)) ||
            (rc = o->lin_prepare(m->be, &L->wo, &L->bo, f, &L->lo, e)) ||
            (rc = o->lin_prepare(m->be, &L->w_up, &L->b_up, f, &L->l_up, e)) ||
            (rc = o->lin_prepare(m->be, &L->w_down, &L->b_down, f, &L->l_down, e)))
            md_errctx(e, "layer %d: ", l);
    }
    if (rc)
        free_lins(m);
    m->bf16 = rc == 0 && bf16;
    return rc;
}

int md_encoder_set_bf16(md_encoder *m, int on, md_err *e) {
    int rc = prepare_lins(m, on, e);
    if (rc && on) {
        md_err ignore = {0};
        prepare_lins(m, 0, &ignore); /* back to F32, as the header promises */
    }
    return rc;
}

int md_encoder_load(const gguf_file *gf, md_backend *be, int max_tokens, md_encoder **out,
                    md_err *e) {
    *out = NULL;
    int rc;
    if (max_tokens < 1)
        return md_errf(e, MD_EINVAL, "encoder steps of %d tokens", max_tokens);
    if ((rc = check_ops(be->ops, e)))
        return rc;
    md_encoder *m = calloc(1, sizeof *m);
    if (!m)
        return md_errf(e, MD_ENOMEM, "out of memory");
    m->be = be;
    if ((rc = md_enc_hparams_read(gf, &m->hp, e)) || (rc = bind_all(m, gf, e))) {
        md_encoder_free(m);
        return rc;
    }
    const md_enc_hparams *hp = &m->hp;
    int C = hp->n_embd, F = hp->n_ff;
    md_reserve r = {.max_tokens = max_tokens,
                    .max_seqs = max_tokens,
                    .max_cols = F > C ? F : C,
                    .max_ctx = hp->n_ctx > C ? hp->n_ctx : C,
                    .n_heads = hp->n_head,
                    .enc_head_dim = hp->head_dim};
    size_t T = (size_t)max_tokens, fl = sizeof(float);
    md_buf **act[] = {&m->x, &m->xb, &m->q, &m->k, &m->v, &m->att, &m->hb};
    if ((rc = be->ops->reserve(be, &r, e)))
        goto fail;
    if ((rc = prepare_lins(m, 0, e))) {
        md_encoder_free(m);
        return rc;
    }
    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++)
        if ((rc = be->ops->buf_alloc(be, T * (size_t)(i == 6 ? F : C) * fl, act[i], e)))
            goto fail;
    m->max_tokens = max_tokens;
    *out = m;
    return 0;
fail:
    md_encoder_free(m);
    return md_errctx(e, "encoder buffers for %d tokens: ", max_tokens);
}
