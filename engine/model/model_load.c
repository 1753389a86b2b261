/* model_load.c — a model from GGUF onto one backend: llama-family and Gemma 3
 * hyperparameters from the metadata (md_hparams_read), then the weights of a layer range and
 * one tensor-parallel rank's share of them bound as backend buffers (quantized matrices
 * recoded where the backend lacks their type, F32 copies for an exact backend), and the RoPE
 * tables. The architectures differ only in flags of md_hparams (docs/models.md,
 * "Architectures"). The forward pass is model.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/model/model_int.h"
#include "engine/weights/quant.h"

static int get_int(const gguf_file *gf, const char *arch, const char *key, int required,
                   int64_t *out, md_err *e) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int rc = gguf_get_i64(gf, k, out, e);
    if (rc == MD_ENOTFOUND && !required) {
        md_err_clear(e);
        return 0;
    }
    if (rc == MD_ENOTFOUND)
        return md_errf(e, MD_EFORMAT, "model metadata lacks %s", k);
    return rc;
}

static int get_f32(const gguf_file *gf, const char *arch, const char *key, float *out, md_err *e) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int rc = gguf_get_f32(gf, k, out, e);
    if (rc == MD_ENOTFOUND) {
        md_err_clear(e);
        return 0;
    }
    return rc;
}

int md_layer_is_swa(const md_hparams *hp, int l) {
    if (hp->n_swa <= 0)
        return 0;
    if (hp->swa_pattern < 0)
        return l >= 0 && l < MD_MAX_LAYERS && (hp->swa_layers[l / 64] >> (l % 64) & 1);
    return hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1;
}

/* The sliding layers from key k's per-layer array (llama.cpp's form for a model whose layers
 * do not repeat one period: element l true when layer l slides): booleans, one per layer. */
static int read_swa_layers(const gguf_file *gf, const char *k, md_hparams *hp, md_err *e) {
    gguf_vtype et;
    uint64_t n = 0;
    const void *data = NULL;
    int rc = gguf_get_arr(gf, k, &et, &n, e);
    if (rc)
        return rc;
    if (et != GGUF_T_BOOL)
        return md_errf(e, MD_EFORMAT, "%s is an array of %s: expected booleans, one per layer", k,
                       gguf_vtype_name(et));
    if (n != (uint64_t)hp->n_layer)
        return md_errf(e, MD_EFORMAT, "%s has %llu elements for %d layers: expected one per layer",
                       k, (unsigned long long)n, hp->n_layer);
    if ((rc = gguf_arr_data(gf, k, &data, e)))
        return rc;
    memset(hp->swa_layers, 0, sizeof hp->swa_layers);
    for (int l = 0; l < hp->n_layer; l++) /* the reader checked each is 0 or 1 */
        hp->swa_layers[l / 64] |= (uint64_t)((const uint8_t *)data)[l] << (l % 64);
    hp->swa_pattern = -1;
    return 0;
}

/* What Qwen3, Gemma 3 and a sliding-window Mistral add to the llama layout, as llama.cpp reads
 * them (docs/models.md "Architectures"): Qwen3 normalizes q and k per head; Gemma 3 also scales
 * its embeddings by sqrt(n_embd), normalizes each block's output, gates its FFN with gelu, and
 * slides a window on five layers of six (RoPE base 10000 there, rope.freq_base elsewhere). */
static int read_arch_extras(const gguf_file *gf, md_hparams *hp, int gemma3, int qwen3, md_err *e) {
    int64_t swa = 0, pattern = gemma3 ? 6 : 0;
    int rc;
    if ((rc = get_int(gf, hp->arch, "attention.sliding_window", 0, &swa, e)))
        return rc;
    if (swa < 0 || swa > 1 << 24)
        return md_errf(e, MD_EFORMAT, "%s.attention.sliding_window %lld is not usable", hp->arch,
                       (long long)swa);
    hp->n_swa = (int)swa;
    hp->qk_norm = qwen3 || gemma3;
    if (!gemma3)
        return 0; /* llama / mistral with a window: every layer slides (Mistral v0.1) */
    char k[128];
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", hp->arch);
    int64_t ki = gguf_find_key(gf, k);
    if (ki >= 0 && gguf_kv_type(gf, ki) == GGUF_T_ARRAY) {
        if ((rc = read_swa_layers(gf, k, hp, e)))
            return rc;
    } else {
        if ((rc = get_int(gf, hp->arch, "attention.sliding_window_pattern", 0, &pattern, e)))
            return rc;
        if (pattern < 0 || pattern > MD_MAX_LAYERS)
            return md_errf(e, MD_EFORMAT, "%s %lld is not usable", k, (long long)pattern);
        hp->swa_pattern = (int)pattern;
    }
    hp->rope_theta_swa = 10000.0f;
    if ((rc = get_f32(gf, hp->arch, "rope.freq_base_swa", &hp->rope_theta_swa, e)))
        return rc;
    if (!(hp->rope_theta_swa > 1.0f))
        return md_errf(e, MD_EFORMAT, "%s.rope.freq_base_swa %g is not usable", hp->arch,
                       hp->rope_theta_swa);
    float softcap = 0;
    if ((rc = get_f32(gf, hp->arch, "final_logit_softcapping", &softcap, e)))
        return rc;
    if (softcap != 0)
        return md_errf(e, MD_EUNSUPP,
                       "%s.final_logit_softcapping %g: logit soft-capping is not supported",
                       hp->arch, softcap);
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->post_norms = 1;
    hp->ffn_gelu = 1;
    /* llama.cpp: 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(n_embd / n_head),
     * its query_pre_attn_scalar */
    if (hp->n_layer == 62)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    return 0;
}

int md_hparams_read(const gguf_file *gf, md_hparams *hp, md_err *e) {
    memset(hp, 0, sizeof *hp);
    const char *a;
    size_t alen;
    int rc = gguf_get_str(gf, "general.architecture", &a, &alen, e);
    if (rc)
        return rc;
    if (alen >= sizeof hp->arch)
        return md_errf(e, MD_EUNSUPP, "architecture name too long");
    memcpy(hp->arch, a, alen);
    hp->arch[alen] = 0;
    int gemma3 = !strcmp(hp->arch, "gemma3"), qwen3 = !strcmp(hp->arch, "qwen3");
    if (strcmp(hp->arch, "llama") && strcmp(hp->arch, "mistral") && strcmp(hp->arch, "qwen2") &&
        !qwen3 && !gemma3)
        return md_errf(e, MD_EUNSUPP,
                       "architecture \"%s\" is not supported (llama, mistral, qwen2, qwen3, "
                       "gemma3 are)",
                       hp->arch);
    int64_t n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_ctx = 0;
    int64_t key_len = 0, rot = 0, vocab = 0;
    if ((rc = get_int(gf, hp->arch, "block_count", 1, &n_layer, e)) ||
        (rc = get_int(gf, hp->arch, "embedding_length", 1, &n_embd, e)) ||
        (rc = get_int(gf, hp->arch, "attention.head_count", 1, &n_head, e)) ||
        (rc = get_int(gf, hp->arch, "feed_forward_length", 1, &n_ff, e)) ||
        (rc = get_int(gf, hp->arch, "context_length", 1, &n_ctx, e)) ||
        (rc = get_int(gf, hp->arch, "attention.head_count_kv", 0, &n_head_kv, e)) ||
        (rc = get_int(gf, hp->arch, "attention.key_length", 0, &key_len, e)) ||
        (rc = get_int(gf, hp->arch, "rope.dimension_count", 0, &rot, e)) ||
        (rc = get_int(gf, hp->arch, "vocab_size", 0, &vocab, e)))
        return rc;
    if (n_head_kv == 0)
        n_head_kv = n_head;
    if (n_layer < 1 || n_layer > MD_MAX_LAYERS || n_embd < 1 || n_embd > 65536 || n_head < 1 ||
        n_head > 1024 || n_head_kv < 1 || n_head % n_head_kv || n_ff < 1 || n_ff > 1 << 20 ||
        n_ctx < 1 || n_ctx > 1 << 24)
        return md_errf(e, MD_EFORMAT,
                       "implausible hyperparameters: %lld layers, width %lld, %lld/%lld heads, "
                       "ffn %lld, context %lld",
                       (long long)n_layer, (long long)n_embd, (long long)n_head,
                       (long long)n_head_kv, (long long)n_ff, (long long)n_ctx);
    hp->head_dim = key_len ? (int)key_len : (int)(n_embd / n_head);
    if (hp->head_dim < 2 || hp->head_dim > 1024 || hp->head_dim % 2 ||
        (!key_len && n_embd % n_head))
        return md_errf(e, MD_EFORMAT, "head dimension %d is not usable", hp->head_dim);
    hp->n_layer = (int)n_layer;
    hp->n_embd = (int)n_embd;
    hp->n_head = (int)n_head;
    hp->n_head_kv = (int)n_head_kv;
    hp->n_ff = (int)n_ff;
    hp->n_ctx_train = (int)n_ctx;
    hp->n_vocab = (int)vocab;
    hp->rot_dims = rot ? (int)rot : hp->head_dim;
    if (hp->rot_dims < 2 || hp->rot_dims > hp->head_dim || hp->rot_dims % 2)
        return md_errf(e, MD_EFORMAT, "rope.dimension_count %d does not fit head dimension %d",
                       hp->rot_dims, hp->head_dim);
    hp->rope_neox = !strcmp(hp->arch, "qwen2") || qwen3 || gemma3;
    /* An HF directory (engine/weights/hf_model.h) keeps q/k in the rotate-half layout for every
     * arch. */
    int neox = 0;
    if (gguf_get_bool(gf, "medley.rope.neox", &neox, NULL) == 0 && neox)
        hp->rope_neox = 1;
    hp->rope.theta = 10000.0f;
    hp->rope.linear_scale = 1.0f;
    hp->eps = gemma3 ? 1e-6f : 1e-5f;
    if ((rc = get_f32(gf, hp->arch, "rope.freq_base", &hp->rope.theta, e)) ||
        (rc = get_f32(gf, hp->arch, "attention.layer_norm_rms_epsilon", &hp->eps, e)))
        return rc;
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", hp->arch);
    const char *st;
    size_t stlen;
    if (gguf_get_str(gf, k, &st, &stlen, NULL) == 0 && stlen == 6 && !memcmp(st, "linear", 6)) {
        float f = 1.0f;
        if ((rc = get_f32(gf, hp->arch, "rope.scaling.factor", &f, e)))
            return rc;
        if (!(f > 0) || f > 1e4f)
            return md_errf(e, MD_EFORMAT, "rope.scaling.factor %g is not usable", f);
        hp->rope.linear_scale = f;
    }
    if (!(hp->rope.theta > 1.0f) || !(hp->eps > 0) || hp->eps > 1.0f)
        return md_errf(e, MD_EFORMAT, "rope.freq_base %g or rms epsilon %g is not usable",
                       hp->rope.theta, hp->eps);
    return read_arch_extras(gf, hp, gemma3, qwen3, e);
}

/* Keep a host allocation until the model is freed (the CPU backend aliases wrapped memory). */
static int own(md_model *m, void *p, md_err *e) {
    void **o = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *o);
    if (!o) {
        free(p);
        return md_errf(e, MD_ENOMEM, "out of memory");
    }
    m->owned = o;
    m->owned[m->n_owned++] = p;
    return 0;
}

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of g (ne0 columns per row) as host memory of
 * *type: the file's blocks copied when the columns fall on block boundaries, else F32. */
static int slice(md_model *m, const gguf_tensor *g, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                 const void **data, size_t *bytes, int *type, md_err *e) {
    int bs = md_type_block(g->type);
    size_t rb = md_type_row_bytes(g->type, g->ne[0]);
    if (bs > 0 && c0 % bs == 0 && nc % bs == 0 && !BE(m)->ops->weights_f32) {
        size_t nrb = md_type_row_bytes(g->type, nc), off = md_type_row_bytes(g->type, c0);
        char *p = malloc(nrb * (size_t)nr);
        if (!p)
            return md_errf(e, MD_ENOMEM, "tensor %s: no memory for its slice", g->name);
        for (int64_t r = 0; r < nr; r++)
            memcpy(p + nrb * (size_t)r, (const char *)g->data + rb * (size_t)(r0 + r) + off, nrb);
        *data = p;
        *bytes = nrb * (size_t)nr;
        return own(m, p, e);
    }
    float *row = malloc((size_t)g->ne[0] * sizeof *row);
    float *p = malloc((size_t)nc * (size_t)nr * sizeof *p);
    int rc = 0;
    for (int64_t r = 0; r < nr && row && p && rc == 0; r++)
        if ((rc = md_dequantize(g->type, (const char *)g->data + rb * (size_t)(r0 + r), row,
                                g->ne[0], e)) == 0)
            memcpy(p + (size_t)nc * r, row + c0, (size_t)nc * sizeof *p);
    free(row);
    if (!row || !p || rc) {
        free(p);
        return rc ? md_errctx(e, "tensor %s: ", g->name)
                  : md_errf(e, MD_ENOMEM, "tensor %s: no memory for its slice", g->name);
    }
    *data = p;
    *bytes = (size_t)nc * (size_t)nr * sizeof *p;
    *type = MD_TYPE_F32;
    return own(m, p, e);
}

/* 1 when the backend multiplies weights of type t as the file stores them. Without a backend
 * (md_model_check) the types some backend loads count: the portable ones, Q5_0, which a
 * backend without its product gets recoded, and Q5_K, which the CPU multiplies and a backend
 * without it refuses at load (no exact recoding into a portable type at its size). */
static int backend_has_type(const md_model *m, int t) {
    if (!BE(m))
        return md_type_supported(t) || t == MD_TYPE_Q5_0 || t == MD_TYPE_Q5_K;
    if (t == MD_TYPE_Q5_K && BE(m)->ops->weights_f32)
        return 1; /* an exact backend: dequantized to F32 at load, as every type there */
    return md_type_supported(t) || (t >= 0 && t < 64 && (BE(m)->ops->extra_weight_types >> t & 1));
}

/* *out = g recoded from Q5_0 to Q8_0 (md_q5_0_to_q8_0: exact), in host memory the model keeps,
 * for backends without a Q5_0 product (backend_has_type). */
static int recode_q5_0(md_model *m, const gguf_tensor *g, gguf_tensor *out, md_err *e) {
    size_t rb = md_type_row_bytes(MD_TYPE_Q8_0, g->ne[0]);
    if (rb == 0 || md_type_row_bytes(MD_TYPE_Q5_0, g->ne[0]) * (size_t)(g->n_elements / g->ne[0]) !=
                       g->n_bytes)
        return md_errf(e, MD_EFORMAT, "tensor %s: Q5_0 rows of %lld elements do not fill %zu bytes",
                       g->name, (long long)g->ne[0], g->n_bytes);
    size_t bytes = rb * (size_t)(g->n_elements / g->ne[0]);
    void *p = malloc(bytes);
    if (!p)
        return md_errf(e, MD_ENOMEM, "tensor %s: no memory to recode Q5_0 as Q8_0", g->name);
    int rc = md_q5_0_to_q8_0(g->data, p, g->n_elements, e);
    if (rc) {
        free(p);
        return md_errctx(e, "tensor %s: ", g->name);
    }
    *out = *g;
    out->type = MD_TYPE_Q8_0;
    out->data = p;
    out->n_bytes = bytes;
    return own(m, p, e);
}

/* weight_wrap's done callback: the file's pages of a range the backend has copied go back. */
static void drop_pages(void *gf, const void *p, size_t n) { gguf_drop_pages(gf, p, n); }

/* Bind rows [r0, r0 + nr) and columns [c0, c0 + nc) of tensor `name` of shape [ne0, ne1]
 * (ne1 = 1 for vectors; nr = ne1, nc = ne0: the whole tensor), checking type and shape. */
static int bind_part(md_model *m, const gguf_file *gf, const char *name, int64_t ne0, int64_t ne1,
                     int64_t r0, int64_t nr, int64_t c0, int64_t nc, int optional, int float_only,
                     md_tensor *t, md_err *e) {
    memset(t, 0, sizeof *t);
    const gguf_tensor *g = gguf_find_tensor(gf, name);
    if (!g) {
        if (optional)
            return 0;
        return md_errf(e, MD_EFORMAT, "model lacks tensor %s", name);
    }
    gguf_tensor q8;
    int rc;
    int recode = g->type == MD_TYPE_Q5_0 && !float_only && !backend_has_type(m, g->type);
    if (recode && (rc = recode_q5_0(m, g, &q8, e)))
        return rc;
    if (recode)
        g = &q8;
    if (g->ne[0] != ne0 || g->ne[1] != ne1 || g->ne[2] != 1 || g->ne[3] != 1)
        return md_errf(e, MD_EFORMAT,
                       "tensor %s has shape [%lld, %lld, %lld, %lld], expected "
                       "[%lld, %lld]",
                       name, (long long)g->ne[0], (long long)g->ne[1], (long long)g->ne[2],
                       (long long)g->ne[3], (long long)ne0, (long long)ne1);
    size_t rb = md_type_row_bytes(g->type, ne0);
    if (g->type == MD_TYPE_Q5_K && !float_only && !backend_has_type(m, g->type))
        return md_errf(e, MD_EUNSUPP,
                       "tensor %s has type Q5_K (13), which this backend cannot multiply and "
                       "which has no exact recoding into a type it can at the same size: use "
                       "the cpu backend (or an exact backend, which computes in F32)",
                       name);
    if (!backend_has_type(m, g->type) || rb == 0 || (float_only && g->type != MD_TYPE_F32))
        return md_errf(e, MD_EUNSUPP, "tensor %s has type %s (%d), not supported here", name,
                       md_type_name(g->type) ? md_type_name(g->type) : "unknown", g->type);
    if (rb * (size_t)ne1 != g->n_bytes)
        return md_errf(e, MD_EFORMAT, "tensor %s holds %zu bytes, expected %zu", name, g->n_bytes,
                       rb * (size_t)ne1);
    if (!BE(m))
        return 0; /* md_model_check: found, shaped and typed as the engine needs */
    md_buf *b;
    int type = g->type;
    const void *data = g->data;
    size_t bytes = g->n_bytes;
    if (nc != ne0) { /* a column slice: repacked or dequantized */
        if ((rc = slice(m, g, r0, nr, c0, nc, &data, &bytes, &type, e)))
            return rc;
    } else if (nr != ne1) { /* a row slice: a window of the mapping */
        data = (const char *)g->data + rb * (size_t)r0;
        bytes = rb * (size_t)nr;
    }
    rb = md_type_row_bytes(type, nc);
    if (BE(m)->ops->weights_f32 && type != MD_TYPE_F32) {
        /* an exact backend: dequantized here, copied by buf_wrap, freed once it is there */
        size_t n = (size_t)nc * (size_t)nr;
        float *f = malloc(n * sizeof *f);
        if (!f)
            return md_errf(e, MD_ENOMEM, "tensor %s: no host memory to dequantize %zu elements",
                           name, n);
        if (!(rc = md_dequantize(type, data, f, (int64_t)n, e)) &&
            !(rc = CALL(m, buf_wrap, f, n * sizeof *f, &b, e)) && (rc = CALL(m, sync, e)))
            CALL(m, buf_free, b);
        free(f);
        if (rc)
            return md_errctx(e, "tensor %s: ", name);
        type = MD_TYPE_F32;
        rb = (size_t)nc * sizeof(float);
    } else if (BE(m)->ops->weight_wrap) {
        /* the backend may copy it into its kernels' layout: then the mapping's pages of it are
         * given back, so the weight is resident once (docs/engine.md "Weights in memory") */
        int copied = 0;
        if ((rc = CALL(m, weight_wrap, data, bytes, type, nc, nr, drop_pages, (void *)gf, &b,
                       &copied, e)))
            return md_errctx(e, "tensor %s: ", name);
        if (copied) /* the pages that straddled the parts the backend reported */
            gguf_drop_pages(gf, data, bytes);
    } else if ((rc = CALL(m, buf_wrap, data, bytes, &b, e)))
        return rc;
    m->bufs[m->n_bufs++] = b;
    t->buf = b;
    t->type = type;
    t->ne0 = nc;
    t->ne1 = nr;
    t->row_bytes = rb;
    return 0;
}

/* Bind tensor `name` whole, checking type and shape (ne1 = 1 for vectors). */
static int bind(md_model *m, const gguf_file *gf, const char *name, int64_t ne0, int64_t ne1,
                int optional, int float_only, md_tensor *t, md_err *e) {
    return bind_part(m, gf, name, ne0, ne1, 0, ne1, 0, ne0, optional, float_only, t, e);
}

/* A model whose architecture needs an optional op is refused on a backend without it. */
static int check_ops(md_backend *be, const md_hparams *hp, md_err *e) {
    const md_backend_ops *o = be->ops;
    const char *miss = hp->n_swa && !o->attention_window  ? "attention_window"
                       : hp->embd_scale != 0 && !o->scale ? "scale"
                       : hp->ffn_gelu && !o->geglu        ? "geglu"
                                                          : NULL;
    if (miss)
        return md_errf(e, MD_EUNSUPP,
                       "the %s backend lacks the %s op that this %s model needs (the cpu "
                       "backend has it)",
                       o->name, miss, hp->arch);
    return 0;
}

int md_model_check(const gguf_file *gf, md_hparams *hp, md_err *e) {
    md_model *m;
    int rc = md_model_load_tp(gf, NULL, 0, -1, 0, 1, &m, e);
    if (rc)
        return rc;
    if (hp)
        *hp = m->hp;
    md_model_free(m);
    return 0;
}

int md_model_load(const gguf_file *gf, md_backend *be, md_model **out, md_err *e) {
    return md_model_load_tp(gf, be, 0, -1, 0, 1, out, e);
}

int md_model_load_range(const gguf_file *gf, md_backend *be, int lo, int hi, md_model **out,
                        md_err *e) {
    return md_model_load_tp(gf, be, lo, hi, 0, 1, out, e);
}

/* The layer range [lo, hi) (hi < 0: to the last), the ranks' split of the heads and FFN, and
 * the vocabulary (from the embedding when the metadata lacks it), checked and kept in m. */
static int check_shape(md_model *m, const gguf_file *gf, int lo, int hi, int rank, int tp,
                       md_err *e) {
    md_hparams *hp = &m->hp;
    if (hi < 0)
        hi = hp->n_layer;
    if (lo < 0 || lo >= hi || hi > hp->n_layer)
        return md_errf(e, MD_EINVAL, "layers %d-%d are not a range of the model's %d layers", lo,
                       hi - 1, hp->n_layer);
    m->lo = lo;
    m->hi = hi;
    if (tp < 1 || rank < 0 || rank >= tp || hp->n_head % tp || hp->n_head_kv % tp || hp->n_ff % tp)
        return md_errf(e, MD_EINVAL,
                       "rank %d of %d: the heads (%d), KV heads (%d) and FFN width (%d) must "
                       "divide by %d",
                       rank, tp, hp->n_head, hp->n_head_kv, hp->n_ff, tp);
    m->tp_rank = rank;
    m->tp_n = tp;
    const gguf_tensor *te = gguf_find_tensor(gf, "token_embd.weight");
    if (!te)
        return md_errf(e, MD_EFORMAT, "model lacks tensor token_embd.weight");
    if (hp->n_vocab == 0)
        hp->n_vocab = (int)te->ne[1];
    if (te->ne[1] != hp->n_vocab || hp->n_vocab < 1)
        return md_errf(e, MD_EFORMAT, "token_embd.weight has %lld rows, vocabulary is %d",
                       (long long)te->ne[1], hp->n_vocab);
    return 0;
}

/* The embedding (first stage, or last with a tied head) and the final norm and output head
 * (last stage; the embedding when the head is tied). */
static int bind_ends(md_model *m, const gguf_file *gf, md_err *e) {
    const md_hparams *hp = &m->hp;
    int C = hp->n_embd, rc;
    int tied = gguf_find_tensor(gf, "output.weight") == NULL;
    if ((m->lo == 0 || (tied && m->hi == hp->n_layer)) &&
        (rc = bind(m, gf, "token_embd.weight", C, hp->n_vocab, 0, 0, &m->tok_embd, e)))
        return rc;
    if (m->hi == hp->n_layer &&
        ((rc = bind(m, gf, "output_norm.weight", C, 1, 0, 1, &m->out_norm, e)) ||
         (rc = bind(m, gf, "output.weight", C, hp->n_vocab, 1, 0, &m->output, e))))
        return rc;
    if (m->hi == hp->n_layer && !m->output.buf)
        m->output = m->tok_embd;
    return 0;
}

/* Layer l's tensors: this rank's share of query rows q0.., KV rows k0.., FFN rows f0.. (all
 * of them at tp 1); the norms whole. */
static int bind_layer(md_model *m, const gguf_file *gf, int l, md_err *e) {
    const md_hparams *hp = &m->hp;
    int C = hp->n_embd, qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    int F = hp->n_ff, tp = m->tp_n, rank = m->tp_rank, rc;
    int qn = qd / tp, kn = kvd / tp, fn = F / tp;
    int q0 = qn * rank, k0 = kn * rank, f0 = fn * rank;
    md_layer *L = &m->layers[l];
    char n[96];
#define B(field, suffix, ne0, ne1, r0, nr, c0, nc, opt, flt)                                       \
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                                 \
    if ((rc = bind_part(m, gf, n, ne0, ne1, r0, nr, c0, nc, opt, flt, &L->field, e)))              \
        return rc;
    B(attn_norm, "attn_norm.weight", C, 1, 0, 1, 0, C, 0, 1)
    B(wq, "attn_q.weight", C, qd, q0, qn, 0, C, 0, 0)
    B(wk, "attn_k.weight", C, kvd, k0, kn, 0, C, 0, 0)
    B(wv, "attn_v.weight", C, kvd, k0, kn, 0, C, 0, 0)
    B(wo, "attn_output.weight", qd, C, 0, C, q0, qn, 0, 0)
    B(ffn_norm, "ffn_norm.weight", C, 1, 0, 1, 0, C, 0, 1)
    B(w_gate, "ffn_gate.weight", C, F, f0, fn, 0, C, 0, 0)
    B(w_up, "ffn_up.weight", C, F, f0, fn, 0, C, 0, 0)
    B(w_down, "ffn_down.weight", F, C, 0, C, f0, fn, 0, 0)
    B(bq, "attn_q.bias", qd, 1, 0, 1, q0, qn, 1, 1)
    B(bk, "attn_k.bias", kvd, 1, 0, 1, k0, kn, 1, 1)
    B(bv, "attn_v.bias", kvd, 1, 0, 1, k0, kn, 1, 1)
    if (hp->qk_norm) {
        int hd = hp->head_dim;
        B(q_norm, "attn_q_norm.weight", hd, 1, 0, 1, 0, hd, 0, 1)
        B(k_norm, "attn_k_norm.weight", hd, 1, 0, 1, 0, hd, 0, 1)
    }
    if (hp->post_norms) {
        B(post_attn_norm, "post_attention_norm.weight", C, 1, 0, 1, 0, C, 0, 1)
        B(post_ffn_norm, "post_ffw_norm.weight", C, 1, 0, 1, 0, C, 0, 1)
    }
#undef B
    return 0;
}

/* The RoPE inverse frequencies on the backend (inv_freq; inv_freq_swa for the sliding
 * layers' own base). Llama 3.1 GGUFs carry per-pair frequency divisors in rope_freqs.weight. */
static int rope_tables(md_model *m, const gguf_file *gf, md_err *e) {
    const md_hparams *hp = &m->hp;
    int half = hp->rot_dims / 2, rc;
    float inv[512];
    md_rope_inv_freq(&hp->rope, hp->rot_dims, inv);
    const gguf_tensor *rf = gguf_find_tensor(gf, "rope_freqs.weight");
    if (rf) {
        if (rf->type != MD_TYPE_F32 || rf->n_elements != half)
            return md_errf(e, MD_EFORMAT, "rope_freqs.weight must be F32 [%d]", half);
        for (int i = 0; i < half; i++) {
            float d;
            memcpy(&d, (const char *)rf->data + 4 * i, 4);
            if (!(d > 0))
                return md_errf(e, MD_EFORMAT, "rope_freqs.weight[%d] = %g is not positive", i, d);
            inv[i] /= d;
        }
    }
    if ((rc = CALL(m, buf_alloc, (size_t)half * sizeof(float), &m->inv_freq, e)) ||
        (rc = CALL(m, buf_upload, m->inv_freq, 0, inv, (size_t)half * sizeof(float), e)))
        return rc;
    if (hp->rope_theta_swa > 0) { /* the sliding layers' own base, unscaled (llama.cpp) */
        md_rope_cfg swa = {.theta = hp->rope_theta_swa, .linear_scale = 1.0f};
        md_rope_inv_freq(&swa, hp->rot_dims, inv);
        if ((rc = CALL(m, buf_alloc, (size_t)half * sizeof(float), &m->inv_freq_swa, e)) ||
            (rc = CALL(m, buf_upload, m->inv_freq_swa, 0, inv, (size_t)half * sizeof(float), e)))
            return rc;
    }
    return 0;
}

int md_model_load_tp(const gguf_file *gf, md_backend *be, int lo, int hi, int rank, int tp,
                     md_model **out, md_err *e) {
    *out = NULL;
    md_model *m = calloc(1, sizeof *m);
    if (!m)
        return md_errf(e, MD_ENOMEM, "out of memory");
    m->be = be;
    const char *fz = getenv("MEDLEY_FUSED_MATMUL");
    m->fused = !(fz && !strcmp(fz, "0"));
    md_hparams *hp = &m->hp;
    int rc;
    if ((rc = md_hparams_read(gf, hp, e)) || (be && (rc = check_ops(be, hp, e))) ||
        (rc = check_shape(m, gf, lo, hi, rank, tp, e)))
        goto fail;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    m->bufs = calloc((size_t)hp->n_layer * 16 + 8, sizeof *m->bufs);
    if (!m->layers || !m->bufs) {
        rc = md_errf(e, MD_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = bind_ends(m, gf, e)))
        goto fail;
    for (int l = m->lo; l < m->hi; l++)
        if ((rc = bind_layer(m, gf, l, e)))
            goto fail;
    /* the forward pass sees this rank's heads and FFN width */
    hp->n_head /= tp;
    hp->n_head_kv /= tp;
    hp->n_ff /= tp;
    if (be && (rc = rope_tables(m, gf, e))) /* md_model_check: nothing goes on a device */
        goto fail;
    *out = m;
    return 0;
fail:
    md_model_free(m);
    return rc;
}

void md_model_free(md_model *m) {
    if (!m)
        return;
    for (int i = 0; i < m->n_bufs; i++)
        CALL(m, buf_free, m->bufs[i]);
    if (m->inv_freq)
        CALL(m, buf_free, m->inv_freq);
    if (m->inv_freq_swa)
        CALL(m, buf_free, m->inv_freq_swa);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->bufs);
    free(m->layers);
    free(m);
}
