/* synth.c — synthetic models built in memory as GGUF images (see synth.h).
 *
 * Layout written: GGUF v3 header, metadata (architecture hyperparameters, tokenizer), the
 * tensor directory, padding to the 32-byte alignment, then each tensor's data at aligned
 * offsets. Data is filled by all cores in fixed chunks, each from its own seed, so the bytes
 * do not depend on the number of threads. */
#include "engine/weights/synth.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/dtype.h"
#include "engine/weights/gguf.h"

#define ALIGN 32
#define MAX_TENSORS 2048

typedef struct {
    const char *name, *arch;
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float theta;
    int tied, qkv_bias;
} shape;

/* Shapes as published in each model's config.json (the same as scheduler/model.c's built-in
 * cards, which the scheduler plans with). */
static const shape shapes[] = {
    {"llama-3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f, 0, 0},
    {"llama-3-70b", "llama", 80, 8192, 64, 8, 28672, 128256, 8192, 500000.0f, 0, 0},
    {"llama-3.2-1b", "llama", 16, 2048, 32, 8, 8192, 128256, 131072, 500000.0f, 1, 0},
    {"mistral-7b", "llama", 32, 4096, 32, 8, 14336, 32000, 32768, 10000.0f, 0, 0}, /* v0.1 */
    {"qwen2-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 32768, 1000000.0f, 0, 1},
    {"smollm2-135m", "llama", 30, 576, 9, 3, 1536, 49152, 8192, 100000.0f, 1, 0},
    {"tiny", "llama", 2, 128, 4, 2, 256, 512, 512, 10000.0f, 0, 0},
    /* tiny with head_dim 64, the smallest the CUDA attention kernels take (the CPU
     * emulator's engine tests, tests/cuda_emu_rt.cmake) */
    {"tiny-hd64", "llama", 2, 256, 4, 2, 512, 1024, 512, 10000.0f, 0, 0},
    /* heads, KV heads and FFN width that divide by 2 and 4, four layers: the sharding tests'
     * tensor-parallel and pipeline splits (tests/e2e/test_sharding.c) */
    {"tiny-tp", "llama", 4, 256, 8, 4, 512, 512, 512, 10000.0f, 0, 0},
    /* tiny-tp with head_dim 64, which the CUDA attention kernels take: tensor parallelism on
     * GPUs (tests/gpu/test_cuda_tp.c) */
    {"tiny-tp-hd64", "llama", 4, 512, 8, 4, 1024, 512, 512, 10000.0f, 0, 0},
    /* encoders (engine/model/encoder.h, llama.cpp's `bert` names and keys; position and
     * token-type tables, biases and LayerNorms beside the matrices): all-MiniLM-L6-v2's shape,
     * and a small one of head_dim 32 for the CUDA emulator's encoder test */
    {"minilm-l6", "bert", 6, 384, 12, 12, 1536, 30522, 512, 0.0f, 0, 0},
    {"bert-tiny", "bert", 2, 128, 4, 4, 256, 512, 128, 0.0f, 0, 0},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

int md_synth_is(const char *name) {
    return name && !strncmp(name, MD_SYNTH_PREFIX, strlen(MD_SYNTH_PREFIX));
}

/* The shape names joined by ", ", built from the table once. */
static char shape_list[N_SHAPES * 24];
static pthread_once_t shape_list_once = PTHREAD_ONCE_INIT;

static void shape_list_build(void) {
    size_t n = 0;
    for (int i = 0; i < N_SHAPES && n < sizeof shape_list; i++)
        n += (size_t)snprintf(shape_list + n, sizeof shape_list - n, "%s%s", i ? ", " : "",
                              shapes[i].name);
}

const char *md_synth_shapes(void) {
    pthread_once(&shape_list_once, shape_list_build);
    return shape_list;
}

/* ---- the header, written into a growable buffer ---------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
    uint64_t n_kv; /* metadata entries written */
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->oom)
        return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 1 << 16;
        while (cap < w->n + n)
            cap *= 2;
        uint8_t *np = realloc(w->p, cap);
        if (!np) {
            w->oom = 1;
            return;
        }
        w->p = np;
        w->cap = cap;
    }
    memcpy(w->p + w->n, src, n);
    w->n += n;
}
static void put_u32(wbuf *w, uint32_t v) {
    put(w, &v, 4);
}
static void put_u64(wbuf *w, uint64_t v) {
    put(w, &v, 8);
}
static void put_str(wbuf *w, const char *s) {
    put_u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_str(wbuf *w, const char *k, const char *v) {
    w->n_kv++;
    put_str(w, k);
    put_u32(w, GGUF_T_STRING);
    put_str(w, v);
}
static void kv_u32(wbuf *w, const char *arch, const char *k, uint32_t v) {
    char key[128];
    snprintf(key, sizeof key, "%s%s%s", arch ? arch : "", arch ? "." : "", k);
    w->n_kv++;
    put_str(w, key);
    put_u32(w, GGUF_T_UINT32);
    put_u32(w, v);
}
static void kv_f32(wbuf *w, const char *arch, const char *k, float v) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, k);
    w->n_kv++;
    put_str(w, key);
    put_u32(w, GGUF_T_FLOAT32);
    put(w, &v, 4);
}

/* ---- tensors ------------------------------------------------------------------------- */

typedef struct {
    char name[64];
    int type;
    int64_t ne0, ne1; /* ne1 == 1 for vectors (written as 1-D) */
    size_t bytes, off;
    int fill; /* 0 random, 1 ones, 2 ones plus random (a LayerNorm's gain) */
} tensor;

static int add_tensor(tensor *t, int *n, const char *name, int type, int64_t ne0, int64_t ne1,
                      int fill) {
    if (*n == MAX_TENSORS)
        return -1;
    tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->type = type;
    x->ne0 = ne0;
    x->ne1 = ne1;
    x->bytes = md_type_row_bytes(type, ne0) * (size_t)ne1;
    x->fill = fill;
    return 0;
}

/* ---- random fill --------------------------------------------------------------------- */

#define STD_A 0.0346f /* uniform in [-a, a] has standard deviation a / sqrt(3) = 0.02 */
#define CHUNK ((size_t)1 << 20)

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser: seeds from chunk indices */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct {
    uint8_t *data;
    const tensor *t;
    int n_t;
    size_t *job_t, *job_first, *job_n; /* jobs: tensor, first unit, units */
    size_t n_jobs;
    size_t next; /* guarded by mu */
    pthread_mutex_t mu;
    uint16_t tab16[2][65536]; /* 16 random bits -> bf16 / f16 value in [-a, a] */
} filler;

static void fill_job(filler *f, size_t j) {
    const tensor *t = &f->t[f->job_t[j]];
    size_t ub = md_type_block_bytes(t->type); /* a unit: one element, or one block */
    uint8_t *p = f->data + t->off + f->job_first[j] * ub;
    size_t n = f->job_n[j];
    uint64_t s = mix(((uint64_t)f->job_t[j] << 40) ^ f->job_first[j]) | 1;
#define NEXT() (s ^= s >> 12, s ^= s << 25, s ^= s >> 27, s * 0x2545f4914f6cdd1dull)
    if (t->fill == 1) { /* norms: F32 ones */
        for (size_t i = 0; i < n; i++)
            ((float *)p)[i] = 1.0f;
        return;
    }
    if (t->fill == 2) { /* LayerNorm gains: around one, so every element matters */
        for (size_t i = 0; i < n; i++)
            ((float *)p)[i] =
                1.0f + ((int64_t)(NEXT() >> 11) * (1.0 / 4503599627370496.0) - 1.0) * 10 * STD_A;
        return;
    }
    switch (t->type) {
    case MD_TYPE_F32:
        for (size_t i = 0; i < n; i++)
            ((float *)p)[i] = ((int64_t)(NEXT() >> 11) * (1.0 / 4503599627370496.0) - 1.0) * STD_A;
        break;
    case MD_TYPE_BF16:
    case MD_TYPE_F16: {
        const uint16_t *tab = f->tab16[t->type == MD_TYPE_F16];
        uint16_t *o = (uint16_t *)p;
        size_t i = 0;
        for (; i + 4 <= n; i += 4) {
            uint64_t r = NEXT();
            o[i] = tab[r & 0xffff];
            o[i + 1] = tab[(r >> 16) & 0xffff];
            o[i + 2] = tab[(r >> 32) & 0xffff];
            o[i + 3] = tab[r >> 48];
        }
        for (; i < n; i++)
            o[i] = tab[NEXT() >> 48];
        break;
    }
    case MD_TYPE_Q8_0: {
        uint16_t d = md_fp32_to_fp16(STD_A / 127.0f);
        for (size_t b = 0; b < n; b++, p += 34) {
            memcpy(p, &d, 2);
            for (int k = 0; k < 32; k += 8) {
                uint64_t r = NEXT();
                memcpy(p + 2 + k, &r, 8);
            }
            for (int k = 0; k < 32; k++)
                if ((int8_t)p[2 + k] == -128)
                    p[2 + k] = (uint8_t)(int8_t)-127;
        }
        break;
    }
    case MD_TYPE_Q4_0: {
        uint16_t d = md_fp32_to_fp16(STD_A / 8.0f);
        for (size_t b = 0; b < n; b++, p += 18) {
            memcpy(p, &d, 2);
            uint64_t r0 = NEXT(), r1 = NEXT();
            memcpy(p + 2, &r0, 8);
            memcpy(p + 10, &r1, 8);
        }
        break;
    }
    }
#undef NEXT
}

static void *fill_thread(void *arg) {
    filler *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        size_t j = f->next++;
        pthread_mutex_unlock(&f->mu);
        if (j >= f->n_jobs)
            return NULL;
        fill_job(f, j);
    }
}

static int fill_all(uint8_t *data, const tensor *t, int n_t, md_err *e) {
    filler *f = calloc(1, sizeof *f);
    if (!f)
        return md_errf(e, MD_ENOMEM, "synthetic model: out of memory");
    for (int i = 0; i < 65536; i++) {
        float v = ((float)i / 65535.0f * 2.0f - 1.0f) * STD_A;
        f->tab16[0][i] = md_fp32_to_bf16(v);
        f->tab16[1][i] = md_fp32_to_fp16(v);
    }
    size_t n_jobs = 0;
    for (int i = 0; i < n_t; i++)
        n_jobs += t[i].bytes / CHUNK + 1;
    f->job_t = malloc(n_jobs * sizeof(size_t));
    f->job_first = malloc(n_jobs * sizeof(size_t));
    f->job_n = malloc(n_jobs * sizeof(size_t));
    if (!f->job_t || !f->job_first || !f->job_n) {
        free(f->job_t);
        free(f->job_first);
        free(f->job_n);
        free(f);
        return md_errf(e, MD_ENOMEM, "synthetic model: out of memory");
    }
    for (int i = 0; i < n_t; i++) {
        size_t ub = md_type_block_bytes(t[i].type), units = t[i].bytes / ub, per = CHUNK / ub;
        for (size_t u = 0; u < units; u += per) {
            f->job_t[f->n_jobs] = (size_t)i;
            f->job_first[f->n_jobs] = u;
            f->job_n[f->n_jobs++] = units - u < per ? units - u : per;
        }
    }
    f->data = data;
    f->t = t;
    f->n_t = n_t;
    pthread_mutex_init(&f->mu, NULL);
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = nc < 1 ? 1 : nc > 32 ? 32 : (int)nc;
    pthread_t th[32];
    int started = 0;
    for (int i = 1; i < nth; i++)
        if (pthread_create(&th[started], NULL, fill_thread, f) == 0)
            started++;
    fill_thread(f);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&f->mu);
    free(f->job_t);
    free(f->job_first);
    free(f->job_n);
    free(f);
    return 0;
}

/* ---- building ------------------------------------------------------------------------ */

static int parse(const char *spec, const shape **sh, int *type, md_err *e) {
    const char *s = spec + strlen(MD_SYNTH_PREFIX);
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    *sh = NULL;
    for (int i = 0; i < N_SHAPES; i++)
        if (strlen(shapes[i].name) == n && !strncmp(shapes[i].name, s, n))
            *sh = &shapes[i];
    if (!*sh)
        return md_errf(e, MD_ENOTFOUND, "unknown synthetic model shape \"%.*s\" (known: %s)",
                       (int)n, s, md_synth_shapes());
    *type = MD_TYPE_BF16;
    if (colon) {
        static const struct {
            const char *name;
            int type;
        } types[] = {{"bf16", MD_TYPE_BF16},
                     {"f32", MD_TYPE_F32},
                     {"f16", MD_TYPE_F16},
                     {"q8_0", MD_TYPE_Q8_0},
                     {"q4_0", MD_TYPE_Q4_0}};
        int found = 0;
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            if (!strcmp(colon + 1, types[i].name)) {
                *type = types[i].type;
                found = 1;
            }
        if (!found)
            return md_errf(e, MD_ENOTFOUND,
                           "unknown weight type \"%s\" in %s (bf16, f32, f16, q8_0, q4_0)",
                           colon + 1, spec);
    }
    return 0;
}

static void add_vocab(wbuf *w, int V) {
    w->n_kv += 3;
    put_str(w, "tokenizer.ggml.tokens");
    put_u32(w, GGUF_T_ARRAY);
    put_u32(w, GGUF_T_STRING);
    put_u64(w, (uint64_t)V);
    char tok[32];
    for (int i = 0; i < V; i++) {
        if (i < 3)
            snprintf(tok, sizeof tok, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(tok, sizeof tok, "<0x%02X>", i - 3);
        else
            snprintf(tok, sizeof tok, "\xe2\x96\x81t%d", i - 259); /* "▁t<k>" */
        put_str(w, tok);
    }
    put_str(w, "tokenizer.ggml.scores");
    put_u32(w, GGUF_T_ARRAY);
    put_u32(w, GGUF_T_FLOAT32);
    put_u64(w, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        float sc = i < 259 ? 0.0f : -(float)(i - 259);
        put(w, &sc, 4);
    }
    put_str(w, "tokenizer.ggml.token_type");
    put_u32(w, GGUF_T_ARRAY);
    put_u32(w, GGUF_T_INT32);
    put_u64(w, (uint64_t)V);
    for (int i = 0; i < V; i++) {
        int32_t ty = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
        put(w, &ty, 4);
    }
}

/* An encoder's tensors (BERT as llama.cpp names them), in file order; returns how many. */
static int list_bert(const shape *sh, int wt, tensor *t) {
    int C = sh->n_embd, F = sh->n_ff, n = 0;
    add_tensor(t, &n, "token_embd.weight", wt, C, sh->n_vocab, 0);
    add_tensor(t, &n, "position_embd.weight", wt, C, sh->n_ctx, 0);
    add_tensor(t, &n, "token_types.weight", MD_TYPE_F32, C, 2, 0);
    add_tensor(t, &n, "token_embd_norm.weight", MD_TYPE_F32, C, 1, 2);
    add_tensor(t, &n, "token_embd_norm.bias", MD_TYPE_F32, C, 1, 0);
    for (int l = 0; l < sh->n_layer; l++) {
        char nm[64];
#define T(suffix, type, a, b, fill)                                                                \
    snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);                                               \
    add_tensor(t, &n, nm, type, a, b, fill);
        T("attn_q.weight", wt, C, C, 0)
        T("attn_q.bias", MD_TYPE_F32, C, 1, 0)
        T("attn_k.weight", wt, C, C, 0)
        T("attn_k.bias", MD_TYPE_F32, C, 1, 0)
        T("attn_v.weight", wt, C, C, 0)
        T("attn_v.bias", MD_TYPE_F32, C, 1, 0)
        T("attn_output.weight", wt, C, C, 0)
        T("attn_output.bias", MD_TYPE_F32, C, 1, 0)
        T("attn_output_norm.weight", MD_TYPE_F32, C, 1, 2)
        T("attn_output_norm.bias", MD_TYPE_F32, C, 1, 0)
        T("ffn_up.weight", wt, C, F, 0)
        T("ffn_up.bias", MD_TYPE_F32, F, 1, 0)
        T("ffn_down.weight", wt, F, C, 0)
        T("ffn_down.bias", MD_TYPE_F32, C, 1, 0)
        T("layer_output_norm.weight", MD_TYPE_F32, C, 1, 2)
        T("layer_output_norm.bias", MD_TYPE_F32, C, 1, 0)
#undef T
    }
    return n;
}

/* The model's tensors, in file order; returns how many. */
static int list_tensors(const shape *sh, int wt, tensor *t) {
    if (!strcmp(sh->arch, "bert"))
        return list_bert(sh, wt, t);
    int C = sh->n_embd, hd = C / sh->n_head, qd = sh->n_head * hd, kvd = sh->n_head_kv * hd;
    int n = 0;
    add_tensor(t, &n, "token_embd.weight", wt, C, sh->n_vocab, 0);
    add_tensor(t, &n, "output_norm.weight", MD_TYPE_F32, C, 1, 1);
    if (!sh->tied)
        add_tensor(t, &n, "output.weight", wt, C, sh->n_vocab, 0);
    for (int l = 0; l < sh->n_layer; l++) {
        char nm[64];
#define T(suffix, type, a, b, fill)                                                                \
    snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);                                               \
    add_tensor(t, &n, nm, type, a, b, fill);
        T("attn_norm.weight", MD_TYPE_F32, C, 1, 1)
        T("attn_q.weight", wt, C, qd, 0)
        T("attn_k.weight", wt, C, kvd, 0)
        T("attn_v.weight", wt, C, kvd, 0)
        T("attn_output.weight", wt, qd, C, 0)
        T("ffn_norm.weight", MD_TYPE_F32, C, 1, 1)
        T("ffn_gate.weight", wt, C, sh->n_ff, 0)
        T("ffn_up.weight", wt, C, sh->n_ff, 0)
        T("ffn_down.weight", wt, sh->n_ff, C, 0)
        if (sh->qkv_bias) {
            T("attn_q.bias", MD_TYPE_F32, qd, 1, 0)
            T("attn_k.bias", MD_TYPE_F32, kvd, 1, 0)
            T("attn_v.bias", MD_TYPE_F32, kvd, 1, 0)
        }
#undef T
    }
    return n;
}

int md_synth_size(const char *spec, size_t *weight_bytes, int64_t *n_params, md_err *e) {
    const shape *sh = NULL;
    int wt = MD_TYPE_BF16;
    int rc = md_synth_is(spec) ? parse(spec, &sh, &wt, e)
                               : md_errf(e, MD_EINVAL, "\"%s\" is not a synthetic model name", spec);
    if (rc)
        return rc;
    tensor *t = calloc(MAX_TENSORS, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "synthetic model: out of memory");
    int n = list_tensors(sh, wt, t);
    size_t bytes = 0;
    int64_t params = 0;
    for (int i = 0; i < n; i++) {
        bytes += t[i].bytes;
        params += t[i].ne0 * t[i].ne1;
    }
    free(t);
    if (weight_bytes)
        *weight_bytes = bytes;
    if (n_params)
        *n_params = params;
    return 0;
}

int md_synth_build(const char *spec, int weights, void **image, size_t *len, md_err *e) {
    *image = NULL;
    *len = 0;
    if (!md_synth_is(spec))
        return md_errf(e, MD_EINVAL, "\"%s\" is not a synthetic model name (synthetic:<shape>)",
                       spec ? spec : "(null)");
    const shape *sh = NULL;
    int wt = MD_TYPE_BF16;
    int rc = parse(spec, &sh, &wt, e);
    if (rc)
        return rc;
    tensor *t = calloc(MAX_TENSORS, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "synthetic model: out of memory");
    int n = list_tensors(sh, wt, t);
    wbuf w = {0};
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, (uint64_t)n);
    put_u64(&w, 0); /* metadata entries: patched once written */
    char name[160];
    snprintf(name, sizeof name, "%s", spec);
    kv_str(&w, "general.architecture", sh->arch);
    kv_str(&w, "general.name", name);
    kv_u32(&w, sh->arch, "block_count", (uint32_t)sh->n_layer);
    kv_u32(&w, sh->arch, "context_length", (uint32_t)sh->n_ctx);
    kv_u32(&w, sh->arch, "embedding_length", (uint32_t)sh->n_embd);
    kv_u32(&w, sh->arch, "feed_forward_length", (uint32_t)sh->n_ff);
    kv_u32(&w, sh->arch, "attention.head_count", (uint32_t)sh->n_head);
    /* BERT: BertModel's epsilon, and mean pooling (llama.cpp's number 1) */
    if (!strcmp(sh->arch, "bert")) {
        kv_f32(&w, sh->arch, "attention.layer_norm_epsilon", 1e-12f);
        kv_u32(&w, sh->arch, "pooling_type", 1);
    } else {
        kv_u32(&w, sh->arch, "attention.head_count_kv", (uint32_t)sh->n_head_kv);
        kv_f32(&w, sh->arch, "rope.freq_base", sh->theta);
        kv_f32(&w, sh->arch, "attention.layer_norm_rms_epsilon", 1e-5f);
    }
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_u32(&w, NULL, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&w, NULL, "tokenizer.ggml.eos_token_id", 2);
    add_vocab(&w, sh->n_vocab);
    if (!w.oom)
        memcpy(w.p + 16, &w.n_kv, 8);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        put_str(&w, t[i].name);
        int vec = t[i].ne1 == 1;
        put_u32(&w, vec ? 1 : 2);
        put_u64(&w, (uint64_t)t[i].ne0);
        if (!vec)
            put_u64(&w, (uint64_t)t[i].ne1);
        put_u32(&w, (uint32_t)t[i].type);
        t[i].off = off;
        put_u64(&w, off);
        off = (off + t[i].bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    if (w.oom) {
        free(w.p);
        free(t);
        return md_errf(e, MD_ENOMEM, "synthetic model: out of memory for the header");
    }
    size_t head = (w.n + ALIGN - 1) / ALIGN * ALIGN, total = head + off;
    void *img = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (img == MAP_FAILED) {
        free(w.p);
        free(t);
        return md_errf(e, MD_ENOMEM, "synthetic model %s needs %.2f GiB of host memory: %s", spec,
                       total / 1073741824.0, "mmap failed");
    }
    memcpy(img, w.p, w.n);
    free(w.p);
    for (int i = 0; i < n; i++)
        t[i].off += head; /* fill_all addresses the whole image */
    rc = weights ? fill_all(img, t, n, e) : 0; /* untouched pages cost no memory */
    free(t);
    if (rc) {
        munmap(img, total);
        return rc;
    }
    *image = img;
    *len = total;
    return 0;
}

void md_synth_free(void *image, size_t len) {
    if (image)
        munmap(image, len);
}
