/* hf_model.c — a Hugging Face directory as a gguf_file: config.json to llama.cpp metadata
 * keys (written as a small GGUF image), safetensors tensors to llama.cpp names (pointing into
 * the shards' mappings). */
#include "engine/weights/hf_model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/dtype.h"
#include "engine/weights/hf_config.h"
#include "engine/weights/quant.h"
#include "engine/weights/safetensors.h"
#include "engine/weights/synth.h"

#define HF_DIR_KEY "medley.hf.dir"

int md_is_hf_dir(const char *path) {
    struct stat st;
    char p[4096];
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    snprintf(p, sizeof p, "%s/config.json", path);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- a GGUF metadata image (no tensors) ---- */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    int n_kv, failed;
} meta;

static void put(meta *m, const void *src, size_t n) {
    if (m->failed)
        return;
    if (m->len + n > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 1024;
        while (nc < m->len + n)
            nc *= 2;
        uint8_t *q = realloc(m->p, nc);
        if (!q) {
            m->failed = 1;
            return;
        }
        m->p = q;
        m->cap = nc;
    }
    memcpy(m->p + m->len, src, n);
    m->len += n;
}

static void put_key(meta *m, const char *arch, const char *key, uint32_t type) {
    char k[128];
    snprintf(k, sizeof k, "%s%s%s", arch ? arch : "", arch ? "." : "", key);
    uint64_t n = strlen(k);
    put(m, &n, 8);
    put(m, k, n);
    put(m, &type, 4);
    m->n_kv++;
}

static void kv_str(meta *m, const char *arch, const char *key, const char *v) {
    put_key(m, arch, key, GGUF_T_STRING);
    uint64_t n = strlen(v);
    put(m, &n, 8);
    put(m, v, n);
}

static void kv_u32(meta *m, const char *arch, const char *key, uint32_t v) {
    put_key(m, arch, key, GGUF_T_UINT32);
    put(m, &v, 4);
}

static void kv_f32(meta *m, const char *arch, const char *key, double v) {
    float f = (float)v;
    put_key(m, arch, key, GGUF_T_FLOAT32);
    put(m, &f, 4);
}

static void kv_bool(meta *m, const char *key, int v) {
    uint8_t b = v != 0;
    put_key(m, NULL, key, GGUF_T_BOOL);
    put(m, &b, 1);
}

/* The key count into the header; the image to *out. */
static int finish_meta(meta *m, const char *dir, void **out, size_t *len, md_err *e) {
    if (m->failed) {
        free(m->p);
        return md_errf(e, MD_ENOMEM, "out of memory for the metadata of %s", dir);
    }
    uint64_t nkv = (uint64_t)m->n_kv;
    memcpy(m->p + 16, &nkv, 8);
    *out = m->p;
    *len = m->len;
    return 0;
}

/* llama.cpp's keys for c (convert_hf_to_gguf.py's set_gguf_parameters). */
static int build_meta(const hf_config *c, const char *dir, void **out, size_t *len, md_err *e) {
    meta m = {0};
    uint32_t hdr[2] = {0x46554747u /* "GGUF" */, 3};
    uint64_t counts[2] = {0, 0};
    put(&m, hdr, 8);
    put(&m, counts, 16);
    const char *a = c->arch, *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    kv_str(&m, NULL, "general.architecture", a);
    kv_str(&m, NULL, "general.name", base);
    kv_str(&m, NULL, HF_DIR_KEY, dir);
    kv_u32(&m, a, "block_count", (uint32_t)c->n_layer);
    kv_u32(&m, a, "context_length", (uint32_t)c->n_ctx);
    kv_u32(&m, a, "embedding_length", (uint32_t)c->n_embd);
    kv_u32(&m, a, "feed_forward_length", (uint32_t)c->n_ff);
    kv_u32(&m, a, "attention.head_count", (uint32_t)c->n_head);
    if (c->encoder) { /* llama.cpp's bert keys; the pooling is the directory's (st_config.h) */
        kv_u32(&m, a, "vocab_size", (uint32_t)c->n_vocab);
        kv_f32(&m, a, "attention.layer_norm_epsilon", c->eps);
        return finish_meta(&m, dir, out, len, e);
    }
    kv_bool(&m, "medley.rope.neox", 1);
    kv_u32(&m, a, "attention.head_count_kv", (uint32_t)c->n_head_kv);
    kv_u32(&m, a, "attention.key_length", (uint32_t)c->head_dim);
    kv_u32(&m, a, "attention.value_length", (uint32_t)c->head_dim);
    kv_u32(&m, a, "rope.dimension_count", (uint32_t)c->head_dim);
    kv_u32(&m, a, "vocab_size", (uint32_t)c->n_vocab);
    kv_f32(&m, a, "attention.layer_norm_rms_epsilon", c->eps);
    kv_f32(&m, a, "rope.freq_base", c->rope_theta);
    if (!strcmp(c->rope_scaling, "linear")) {
        kv_str(&m, a, "rope.scaling.type", "linear");
        kv_f32(&m, a, "rope.scaling.factor", c->rope_factor);
    }
    if (c->sliding_window)
        kv_u32(&m, a, "attention.sliding_window", (uint32_t)c->sliding_window);
    if (c->sliding_window && !strcmp(a, "gemma3")) {
        kv_u32(&m, a, "attention.sliding_window_pattern", (uint32_t)c->swa_pattern);
        kv_f32(&m, a, "rope.freq_base_swa", c->rope_theta_swa);
    }
    return finish_meta(&m, dir, out, len, e);
}

/* ---- what the gguf_file keeps alive ---- */
typedef struct {
    st_file *st;
    void **copies; /* F32 copies of 1-D tensors, the rope factors */
    int n_copies;
} owner;

static void owner_free(void *p) {
    owner *o = p;
    if (!o)
        return;
    st_close(o->st);
    for (int i = 0; i < o->n_copies; i++)
        free(o->copies[i]);
    free(o->copies);
    free(o);
}

static float *new_copy(owner *o, int64_t n) {
    void **c = realloc(o->copies, (size_t)(o->n_copies + 1) * sizeof *c);
    if (!c)
        return NULL;
    o->copies = c;
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    if (f)
        o->copies[o->n_copies++] = f;
    return f;
}

/* Llama 3.1's frequency divisors (rope_freqs.weight, [head_dim / 2]), as llama.cpp's
 * converter computes them from rope_scaling. */
static void llama3_factors(const hf_config *c, float *out) {
    int half = c->head_dim / 2;
    double lo_wl = c->rope_orig_ctx / c->rope_low_freq_factor;
    double hi_wl = c->rope_orig_ctx / c->rope_high_freq_factor;
    for (int i = 0; i < half; i++) {
        double freq = 1.0 / pow(c->rope_theta, 2.0 * i / c->head_dim);
        double wl = 2 * M_PI / freq;
        if (wl < hi_wl)
            out[i] = 1.0f;
        else if (wl > lo_wl)
            out[i] = (float)c->rope_factor;
        else {
            double s = (c->rope_orig_ctx / wl - c->rope_low_freq_factor) /
                       (c->rope_high_freq_factor - c->rope_low_freq_factor);
            out[i] = (float)(1.0 / ((1 - s) / c->rope_factor + s));
        }
    }
}

int hf_open_dir(const char *dir, gguf_file **out, md_err *e) {
    md_err local;
    if (!e)
        e = &local;
    *out = NULL;
    hf_config c;
    int rc = hf_config_load(dir, &c, e);
    if (rc)
        return rc;
    owner *o = calloc(1, sizeof *o);
    gguf_tensor *gt = NULL;
    char(*names)[96] = NULL;
    void *img = NULL;
    size_t img_len = 0;
    if (!o)
        return md_errf(e, MD_ENOMEM, "out of memory");
    if ((rc = st_open_dir(dir, &o->st, e)))
        goto fail;
    int64_t n = st_n_tensors(o->st), k = 0;
    gt = calloc((size_t)n + 1, sizeof *gt);
    names = calloc((size_t)n + 1, sizeof *names);
    if (!gt || !names) {
        rc = md_errf(e, MD_ENOMEM, "out of memory for %lld tensors", (long long)n);
        goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        const st_tensor *s = st_tensor_at(o->st, i);
        const char *shard = st_shard_path(o->st, s->shard);
        int m = hf_tensor_gguf_name(&c, s->name, names[k], sizeof names[k]);
        if (m == 0)
            continue;
        if (m < 0) {
            rc = md_errf(e, MD_EUNSUPP,
                         "%s: tensor '%s' has no place in a %s model (model_type %s): refusing "
                         "rather than ignoring its weights",
                         shard, s->name, c.arch, c.model_type);
            goto fail;
        }
        if (s->type == MD_TYPE_I64) {
            rc = md_errf(e, MD_EUNSUPP, "%s: tensor '%s' holds integers (I64), not weights", shard,
                         s->name);
            goto fail;
        }
        if (s->n_dims < 1 || s->n_dims > 2 || s->n_elements == 0) {
            rc = md_errf(e, MD_EFORMAT, "%s: tensor '%s' has %d dimensions%s, expected 1 or 2",
                         shard, s->name, s->n_dims, s->n_elements ? "" : " and no elements");
            goto fail;
        }
        gguf_tensor *t = &gt[k];
        t->name = names[k];
        t->n_dims = s->n_dims;
        t->ne[0] = s->shape[s->n_dims - 1];
        t->ne[1] = s->n_dims == 2 ? s->shape[0] : 1;
        t->ne[2] = t->ne[3] = 1;
        t->n_elements = s->n_elements;
        t->type = s->type;
        t->n_bytes = s->n_bytes;
        t->data = s->data;
        if (s->n_dims == 1) { /* norms and biases: F32 (and 1 + w for Gemma's norms) */
            float *f = new_copy(o, s->n_elements);
            if (!f) {
                rc = md_errf(e, MD_ENOMEM, "out of memory");
                goto fail;
            }
            if ((rc = md_dequantize(s->type, s->data, f, s->n_elements, e)))
                goto fail;
            size_t nl = strlen(t->name);
            if (c.norm_plus_one && nl > 11 && !strcmp(t->name + nl - 11, "norm.weight"))
                for (int64_t j = 0; j < s->n_elements; j++)
                    f[j] += 1.0f;
            t->type = MD_TYPE_F32;
            t->n_bytes = (size_t)s->n_elements * sizeof(float);
            t->data = f;
        }
        k++;
    }
    if (!strcmp(c.rope_scaling, "llama3")) {
        float *f = new_copy(o, c.head_dim / 2);
        if (!f) {
            rc = md_errf(e, MD_ENOMEM, "out of memory");
            goto fail;
        }
        llama3_factors(&c, f);
        gguf_tensor *t = &gt[k];
        snprintf(names[k], sizeof names[k], "rope_freqs.weight");
        t->name = names[k];
        t->n_dims = 1;
        t->ne[0] = c.head_dim / 2;
        t->ne[1] = t->ne[2] = t->ne[3] = 1;
        t->n_elements = c.head_dim / 2;
        t->type = MD_TYPE_F32;
        t->n_bytes = (size_t)t->n_elements * sizeof(float);
        t->data = f;
        k++;
    }
    if ((rc = build_meta(&c, dir, &img, &img_len, e)))
        goto fail;
    rc = gguf_open_parts(img, img_len, gt, k, owner_free, o, out, e);
    free(gt);
    free(names);
    return rc ? md_errctx(e, "%s: ", dir) : 0;
fail:
    free(gt);
    free(names);
    owner_free(o);
    return rc;
}

int md_model_open(const char *path, gguf_file **out, md_err *e) {
    if (md_is_hf_dir(path))
        return hf_open_dir(path, out, e);
    return gguf_open(path, out, e);
}

int md_model_open_any(const char *path, int weights, void **synth, size_t *synth_len,
                      gguf_file **gf, md_err *e) {
    if (!md_synth_is(path))
        return md_model_open(path, gf, e);
    int rc = md_synth_build(path, weights, synth, synth_len, e);
    return rc ? rc : gguf_open_mem(*synth, *synth_len, gf, e);
}

const char *hf_dir_of(const gguf_file *gf, size_t *len) {
    const char *s;
    size_t n;
    if (gguf_get_str(gf, HF_DIR_KEY, &s, &n, NULL))
        return NULL;
    if (len)
        *len = n;
    return s;
}
