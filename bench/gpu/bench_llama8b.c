/* bench_llama8b.c — decode throughput of a synthetic Llama-3-8B-shaped BF16 model (random
 * weights, real shapes: 32 layers, width 4096, 32 query / 8 KV heads of 128, FFN 14336,
 * vocabulary 128256, untied output) on one GPU, through the CUDA backend's kernels.
 *
 *   medley_gpu_bench [--layers N] [--prompt P] [--gen G] [--batch B] [--small] [--out FILE.json]
 *
 * --small: width 256, 4 query / 2 KV heads of 64, FFN 1024, vocabulary 2048 instead (the
 * device check's rehearsal on the CPU emulator; the figures mean nothing there).
 *
 * Phase 1, batch 1: a P-token prompt, then G decode steps, each step one CUDA graph (all 32
 * layers, the LM head and the on-device argmax that feeds the next step's embedding). The
 * figure is the issue's: weight bytes read per token / time per token / 4.8 TB/s (H200 HBM).
 * Steps are also timed without the graph, to show what the graph saves.
 * Phase 2, batch B (256): B distinct P-token prompts prefilled in chunks of 2048 tokens
 * (tiled attention, cuBLAS GEMMs), then G decode steps over all B sequences (split-KV
 * attention, cuBLAS GEMMs); tokens/s = B * G / (prefill + decode time), the same work
 * bench/gpu/hf_generate.py times for PyTorch + transformers `generate`.
 * The KV cache is F16 in blocks of 16 tokens; greedy sampling on the device. Prints one
 * JSON object (and writes it to --out). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/gpu/bench_gpu_util.h"
#include "common/dtype.h"
#include "common/util.h"
#include "kernels/cuda/cuda_ops.h"

#define BLOCK 16
#define CHUNK 2048
#define HBM_TBPS 4.8

typedef struct {
    int n_layer, C, n_head, n_kv, hd, ff, vocab;
} shape;

typedef struct {
    uint16_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    float *attn_norm, *ffn_norm;
    void *kc, *vc;
} layer;

typedef struct {
    shape s;
    cuda_ctx *c;
    layer *L;
    uint16_t *emb, *lm_head;
    float *out_norm, *inv_freq;
    /* activations for up to max_t tokens */
    int max_t, max_logits, max_seqs, max_blocks;
    float *x, *xb, *q, *k, *v, *att, *g, *u, *xl, *logits;
    void *att_work;
    int n_splits; /* decode attention splits, set per batch size before capture */
    int n_sm;
    int32_t *d_next; /* [max_seqs] next token of each sequence (argmax output) */
    int32_t *d_bt;   /* [max_seqs][max_blocks] */
    int32_t *d_meta; /* step metadata, see step_meta */
    size_t weight_bytes;
} bench;

/* Step metadata, one int32 array: tokens [T] | pos [T] | slot [T] | logit rows [S] |
 * dec [3T] | tiles [4 (T/16 + S)]. */
typedef struct {
    int T, n_logits, n_dec, n_tiles;
    int32_t *tok, *pos, *slot, *rows, *dec, *tiles;
} step_meta;

static size_t meta_ints(int T, int S) {
    return 3 * (size_t)T + S + 3 * (size_t)T + 4 * ((size_t)T / 16 + S + 1);
}
static void meta_view(int32_t *base, int T, int S, step_meta *m) {
    m->tok = base;
    m->pos = base + T;
    m->slot = base + 2 * T;
    m->rows = base + 3 * T;
    m->dec = m->rows + S;
    m->tiles = m->dec + 3 * T;
}

#define TRY(call) BENCH_TRY("medley_gpu_bench", e, call)

static md_err e;

static void *dalloc(bench *b, size_t n) {
    void *p = NULL;
    TRY(cuda_pool_alloc(b->c, n, &p, &e));
    return p;
}

static uint16_t *weight(bench *b, int64_t rows, int64_t cols, uint64_t seed) {
    uint16_t *w = dalloc(b, (size_t)rows * cols * 2);
    /* uniform(-a, a) with a = sqrt(3 / cols): activations keep unit scale through the layers */
    TRY(cuda_fill_random(b->c, w, CUDA_BF16, rows * cols, sqrtf(3.0f / (float)cols), seed, &e));
    b->weight_bytes += (size_t)rows * cols * 2;
    return w;
}

static float *ones(bench *b, int n) {
    float *h = malloc((size_t)n * 4), *d = dalloc(b, (size_t)n * 4);
    for (int i = 0; i < n; i++)
        h[i] = 1.0f;
    TRY(cuda_upload(b->c, d, h, (size_t)n * 4, &e));
    TRY(cuda_sync(b->c, &e));
    free(h);
    return d;
}

static void build(bench *b, int max_seqs, int max_ctx) {
    shape s = b->s;
    int kvd = s.n_kv * s.hd;
    b->L = calloc((size_t)s.n_layer, sizeof *b->L);
    b->max_seqs = max_seqs;
    b->max_blocks = (max_ctx + BLOCK - 1) / BLOCK;
    size_t slots = (size_t)max_seqs * b->max_blocks * BLOCK;
    for (int l = 0; l < s.n_layer; l++) {
        layer *L = &b->L[l];
        uint64_t sd = 1000 + 10 * (uint64_t)l;
        /* q|k|v and gate|up rows are contiguous, so one GEMV reads them at batch 1 */
        L->wq = weight(b, s.C + 2 * kvd, s.C, sd);
        L->wk = L->wq + (size_t)s.C * s.C;
        L->wv = L->wk + (size_t)kvd * s.C;
        L->wo = weight(b, s.C, s.C, sd + 3);
        L->wg = weight(b, 2 * s.ff, s.C, sd + 4);
        L->wu = L->wg + (size_t)s.ff * s.C;
        L->wd = weight(b, s.C, s.ff, sd + 6);
        L->attn_norm = ones(b, s.C);
        L->ffn_norm = ones(b, s.C);
        L->kc = dalloc(b, slots * kvd * 2);
        L->vc = dalloc(b, slots * kvd * 2);
    }
    b->lm_head = weight(b, s.vocab, s.C, 7);
    size_t lm = b->weight_bytes;
    b->emb = weight(b, s.vocab, s.C, 8);
    b->weight_bytes = lm; /* the embedding is read one row per token, not per step */
    b->out_norm = ones(b, s.C);
    float inv[256];
    for (int i = 0; i < s.hd / 2; i++)
        inv[i] = (float)pow(500000.0, -2.0 * i / s.hd);
    b->inv_freq = dalloc(b, sizeof inv);
    TRY(cuda_upload(b->c, b->inv_freq, inv, sizeof inv, &e));
    int T = b->max_t = CHUNK > max_seqs ? CHUNK : max_seqs;
    b->max_logits = max_seqs;
    b->x = dalloc(b, (size_t)T * s.C * 4);
    b->xb = dalloc(b, (size_t)T * s.C * 4);
    b->q = dalloc(b, (size_t)T * (s.C + 2 * kvd) * 4); /* q|k|v at T = 1 */
    b->k = dalloc(b, (size_t)T * kvd * 4);
    b->v = dalloc(b, (size_t)T * kvd * 4);
    b->att = dalloc(b, (size_t)T * s.C * 4);
    b->g = dalloc(b, (size_t)T * s.ff * 4 + (size_t)s.ff * 4); /* + room for g|u at T = 1 */
    b->u = dalloc(b, (size_t)T * s.ff * 4);
    b->xl = dalloc(b, (size_t)max_seqs * s.C * 4);
    b->logits = dalloc(b, (size_t)max_seqs * s.vocab * 4);
    b->n_splits = 8;
    b->att_work = dalloc(b, cuda_attn_decode_work_bytes(max_seqs, s.n_head, s.hd, b->n_splits));
    b->d_next = dalloc(b, (size_t)max_seqs * 4);
    b->d_bt = dalloc(b, (size_t)max_seqs * b->max_blocks * 4);
    b->d_meta = dalloc(b, meta_ints(T, max_seqs) * 4);
    /* sequence i owns blocks [i * max_blocks, (i + 1) * max_blocks) */
    int32_t *bt = malloc((size_t)max_seqs * b->max_blocks * 4);
    for (int i = 0; i < max_seqs * b->max_blocks; i++)
        bt[i] = i;
    TRY(cuda_upload(b->c, b->d_bt, bt, (size_t)max_seqs * b->max_blocks * 4, &e));
    TRY(cuda_sync(b->c, &e));
    free(bt);
}

/* One forward step over the metadata already on the device (d_meta, laid out for T tokens
 * and max_seqs logit rows). tokens: device ids (d_meta's, or d_next for decode); the
 * argmax of the n_logits rows goes to next. Enqueue only: capturable. */
static void forward(bench *b, const step_meta *hm, const int32_t *tokens, int32_t *next) {
    shape s = b->s;
    int T = hm->T, kvd = s.n_kv * s.hd;
    step_meta d;
    meta_view(b->d_meta, T, b->max_seqs, &d);
    cuda_kv_layer kv = {NULL, NULL, CUDA_F16, s.n_kv, s.hd, BLOCK};
    float scale = 1.0f / sqrtf((float)s.hd);
    cuda_ctx *c = b->c;
    TRY(cuda_get_rows(c, b->emb, MD_TYPE_BF16, s.vocab, s.C, tokens, T, b->x, NULL, &e));
    for (int l = 0; l < s.n_layer; l++) {
        layer *L = &b->L[l];
        size_t rc = (size_t)s.C * 2, rf = (size_t)s.ff * 2;
        float *q = b->q, *k = b->k, *v = b->v, *g = b->g, *u = b->u;
        TRY(cuda_rmsnorm(c, b->x, L->attn_norm, 1e-5f, T, s.C, b->xb, CUDA_F32, &e));
        if (T == 1) {
            /* one token: q|k|v in one GEMV into q|k|v laid end to end, roped in one launch */
            k = q + s.C;
            v = k + kvd;
            TRY(cuda_matmul(c, L->wq, MD_TYPE_BF16, rc, b->xb, q, 1, s.C + 2 * kvd, s.C, 0, 0, &e));
            TRY(cuda_rope(c, q, d.pos, 1, s.n_head + s.n_kv, s.hd, s.hd, b->inv_freq, 0, &e));
        } else {
            TRY(cuda_matmul(c, L->wq, MD_TYPE_BF16, rc, b->xb, q, T, s.C, s.C, 0, 0, &e));
            TRY(cuda_matmul(c, L->wk, MD_TYPE_BF16, rc, b->xb, k, T, kvd, s.C, 0, 0, &e));
            TRY(cuda_matmul(c, L->wv, MD_TYPE_BF16, rc, b->xb, v, T, kvd, s.C, 0, 0, &e));
            TRY(cuda_rope(c, q, d.pos, T, s.n_head, s.hd, s.hd, b->inv_freq, 0, &e));
            TRY(cuda_rope(c, k, d.pos, T, s.n_kv, s.hd, s.hd, b->inv_freq, 0, &e));
        }
        TRY(cuda_kv_write(c, L->kc, L->vc, CUDA_F16, kvd, k, v, d.slot, T, &e));
        kv.k = L->kc;
        kv.v = L->vc;
        if (hm->n_dec)
            TRY(cuda_attn_decode(c, &kv, q, d.dec, hm->n_dec, b->d_bt, b->max_blocks, s.n_head,
                                 scale, b->n_splits, b->att_work, b->att, &e));
        if (hm->n_tiles)
            TRY(cuda_attn_prefill(c, &kv, q, d.tiles, hm->n_tiles, b->d_bt, b->max_blocks, s.n_head,
                                  scale, b->att, &e));
        /* residual adds ride on the GEMMs: x = 1 * x + W . a */
        TRY(cuda_matmul(c, L->wo, MD_TYPE_BF16, rc, b->att, b->x, T, s.C, s.C, 1.0f, 0, &e));
        TRY(cuda_rmsnorm(c, b->x, L->ffn_norm, 1e-5f, T, s.C, b->xb, CUDA_F32, &e));
        if (T == 1) {
            u = g + s.ff;
            TRY(cuda_matmul(c, L->wg, MD_TYPE_BF16, rc, b->xb, g, 1, 2 * s.ff, s.C, 0, 0, &e));
        } else {
            TRY(cuda_matmul(c, L->wg, MD_TYPE_BF16, rc, b->xb, g, T, s.ff, s.C, 0, 0, &e));
            TRY(cuda_matmul(c, L->wu, MD_TYPE_BF16, rc, b->xb, u, T, s.ff, s.C, 0, 0, &e));
        }
        TRY(cuda_swiglu(c, g, u, g, CUDA_F32, (int64_t)T * s.ff, &e));
        TRY(cuda_matmul(c, L->wd, MD_TYPE_BF16, rf, g, b->x, T, s.C, s.ff, 1.0f, 0, &e));
    }
    TRY(cuda_gather_rows(c, b->x, d.rows, hm->n_logits, s.C, b->xl, &e));
    TRY(cuda_rmsnorm(c, b->xl, b->out_norm, 1e-5f, hm->n_logits, s.C, b->xl, CUDA_F32, &e));
    TRY(cuda_matmul(c, b->lm_head, MD_TYPE_BF16, (size_t)s.C * 2, b->xl, b->logits, hm->n_logits,
                    s.vocab, s.C, 0, 0, &e));
    TRY(cuda_argmax(c, b->logits, hm->n_logits, s.vocab, next, &e));
}

/* Host metadata for a prefill chunk: sequences [s0, s0 + ns) with P prompt tokens each. */
static void meta_prefill(bench *b, int32_t *h, int s0, int ns, int P, step_meta *m) {
    int T = ns * P;
    meta_view(h, T, b->max_seqs, m);
    m->T = T;
    m->n_logits = ns;
    m->n_dec = 0;
    m->n_tiles = 0;
    uint64_t rng = 0x853C49E6748FEA9Bull + (uint64_t)s0;
    for (int i = 0; i < ns; i++) {
        int seq = s0 + i;
        for (int p = 0; p < P; p++) {
            int t = i * P + p;
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            m->tok[t] = (int32_t)((rng >> 33) % (uint64_t)b->s.vocab);
            m->pos[t] = p;
            m->slot[t] = (seq * b->max_blocks + p / BLOCK) * BLOCK + p % BLOCK;
        }
        m->rows[i] = i * P + P - 1;
        for (int p = 0; p < P; p += CUDA_ATTN_TILE_Q) {
            int32_t *ti = m->tiles + 4 * m->n_tiles++;
            ti[0] = seq;
            ti[1] = i * P + p;
            ti[2] = P - p < CUDA_ATTN_TILE_Q ? P - p : CUDA_ATTN_TILE_Q;
            ti[3] = p;
        }
    }
}

/* Host metadata for decode step `step` (0-based) of B sequences after P prompt tokens. */
static void meta_decode(bench *b, int32_t *h, int B, int P, int step, step_meta *m) {
    meta_view(h, B, b->max_seqs, m);
    m->T = B;
    m->n_logits = B;
    m->n_dec = B;
    m->n_tiles = 0;
    for (int i = 0; i < B; i++) {
        int p = P + step;
        m->pos[i] = p;
        m->slot[i] = (i * b->max_blocks + p / BLOCK) * BLOCK + p % BLOCK;
        m->rows[i] = i;
        m->dec[3 * i] = i;
        m->dec[3 * i + 1] = i;
        m->dec[3 * i + 2] = p + 1;
    }
}

static void upload_meta(bench *b, const int32_t *h, int T) {
    TRY(cuda_upload(b->c, b->d_meta, h, meta_ints(T, b->max_seqs) * 4, &e));
}

/* Prefill B sequences of P tokens in chunks of CHUNK tokens; seconds. */
static double prefill(bench *b, int32_t *h, int B, int P) {
    int per = CHUNK / P > 0 ? CHUNK / P : 1;
    TRY(cuda_sync(b->c, &e));
    uint64_t t0 = md_mono_ns();
    for (int s0 = 0; s0 < B; s0 += per) {
        int ns = B - s0 < per ? B - s0 : per;
        step_meta m;
        meta_prefill(b, h, s0, ns, P, &m);
        upload_meta(b, h, m.T);
        step_meta d;
        meta_view(b->d_meta, m.T, b->max_seqs, &d);
        forward(b, &m, d.tok, b->d_next + s0);
        TRY(cuda_sync(b->c, &e)); /* h is rewritten for the next chunk */
    }
    return (md_mono_ns() - t0) / 1e9;
}

/* G decode steps over B sequences; with use_graph, each step is one graph launch after the
 * metadata copy. Metadata of every step is prepared in pinned memory first. Seconds. */
static double decode(bench *b, int B, int P, int G, int use_graph) {
    size_t per = meta_ints(B, b->max_seqs);
    /* as the backend chooses: fill the SMs twice, at least 64 keys per split */
    int blocks = B * b->s.n_kv, by_len = (P + G + 63) / 64;
    b->n_splits = (2 * b->n_sm + blocks - 1) / blocks;
    if (b->n_splits > by_len)
        b->n_splits = by_len;
    if (b->n_splits > 8)
        b->n_splits = 8;
    if (b->n_splits < 1)
        b->n_splits = 1;
    int32_t *h = NULL;
    if (cudaMallocHost((void **)&h, per * G * 4) != cudaSuccess) {
        fprintf(stderr, "medley_gpu_bench: cannot pin %zu bytes\n", per * G * 4);
        exit(1);
    }
    step_meta m0;
    for (int st = 0; st < G; st++)
        meta_decode(b, h + per * st, B, P, st, &m0);
    meta_decode(b, h, B, P, 0, &m0);
    cuda_graph *g = NULL;
    if (use_graph) {
        upload_meta(b, h, B);
        TRY(cuda_sync(b->c, &e));
        TRY(cuda_graph_begin(b->c, &e));
        forward(b, &m0, b->d_next, b->d_next);
        TRY(cuda_graph_end(b->c, &g, &e));
    }
    TRY(cuda_sync(b->c, &e));
    uint64_t t0 = md_mono_ns();
    for (int st = 0; st < G; st++) {
        TRY(cuda_upload(b->c, b->d_meta, h + per * st, per * 4, &e));
        if (g)
            TRY(cuda_graph_launch(b->c, g, &e));
        else
            forward(b, &m0, b->d_next, b->d_next);
    }
    TRY(cuda_sync(b->c, &e));
    double t = (md_mono_ns() - t0) / 1e9;
    cuda_graph_free(g);
    cudaFreeHost(h);
    return t;
}

int main(int argc, char **argv) {
    shape s = {32, 4096, 32, 8, 128, 14336, 128256};
    const shape small = {2, 256, 4, 2, 64, 1024, 2048};
    const char *shape_name = "llama-3-8b";
    int P = 128, G = 128, B = 256, layers = 0;
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--layers") && i + 1 < argc)
            layers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--small")) {
            s = small;
            shape_name = "small";
        } else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gen") && i + 1 < argc)
            G = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            B = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: medley_gpu_bench [--layers N] [--prompt P] [--gen G] "
                            "[--batch B] [--small] [--out FILE]\n");
            return 2;
        }
    }
    if (layers)
        s.n_layer = layers;
    if (s.n_layer < 1 || P < 1 || P > CHUNK || G < 2 || B < 1 || B > 4096) {
        fprintf(stderr,
                "medley_gpu_bench: need layers >= 1, 1 <= prompt <= %d, gen >= 2, "
                "1 <= batch <= 4096\n",
                CHUNK);
        return 2;
    }
    cuda_device_info info;
    cuda_ctx *c;
    int rc = bench_gpu_open("medley_gpu_bench", &info, &c);
    if (rc)
        return rc;
    bench b = {.s = s, .n_sm = info.n_sm, .c = c};
    uint64_t t_build = md_mono_ns();
    build(&b, B, P + G);
    TRY(cuda_sync(b.c, &e));
    fprintf(stderr,
            "built %d layers: %.2f GB of weights read per step, %.2f GiB on the device, "
            "in %.1f s\n",
            s.n_layer, b.weight_bytes / 1e9, cuda_pool_reserved(b.c) / 1073741824.0,
            (md_mono_ns() - t_build) / 1e9);
    size_t hn = meta_ints(b.max_t, B);
    int32_t *h = malloc(hn * 4);

    /* batch 1 */
    prefill(&b, h, 1, P);
    double t_graph = decode(&b, 1, P, G, 1);
    prefill(&b, h, 1, P);
    double t_plain = decode(&b, 1, P, G, 0);
    double ms_tok = t_graph * 1e3 / G;
    double frac = b.weight_bytes / (t_graph / G) / (HBM_TBPS * 1e12);
    fprintf(stderr,
            "batch 1: %.3f ms/token with a CUDA graph (%.3f without): %.0f GB/s of "
            "weights = %.1f%% of %.1f TB/s\n",
            ms_tok, t_plain * 1e3 / G, b.weight_bytes / (t_graph / G) / 1e9, 100 * frac, HBM_TBPS);

    /* batch B */
    double tp = prefill(&b, h, B, P);
    double td = decode(&b, B, P, G, 1);
    double tps = (double)B * G / (tp + td);
    fprintf(stderr,
            "batch %d: prefill %d x %d tokens %.2f s, %d decode steps %.2f s (%.2f ms/step): "
            "%.0f generated tokens/s overall, %.0f in decode\n",
            B, B, P, tp, G, td, td * 1e3 / G, tps, (double)B * G / td);

    char date[64];
    bench_utc_date(date, sizeof date);
    char json[2048];
    snprintf(json, sizeof json,
             "{\"bench\": \"medley_gpu_bench\", \"date\": \"%s\", \"device\": \"%s\", "
             "\"model\": \"synthetic %s shape, bf16, %d layers\", \"prompt\": %d, "
             "\"gen\": %d, \"weight_bytes_per_token\": %zu, "
             "\"batch1\": {\"ms_per_token\": %.4f, \"ms_per_token_no_graph\": %.4f, "
             "\"weight_gbps\": %.1f, \"hbm_fraction\": %.4f, \"hbm_tbps_assumed\": %.1f}, "
             "\"batchN\": {\"batch\": %d, \"prefill_s\": %.4f, \"decode_s\": %.4f, "
             "\"decode_step_ms\": %.3f, \"tokens_per_s\": %.1f, \"decode_tokens_per_s\": %.1f}}",
             date, info.name, shape_name, s.n_layer, P, G, b.weight_bytes, ms_tok,
             t_plain * 1e3 / G, b.weight_bytes / (t_graph / G) / 1e9, frac, HBM_TBPS, B, tp, td,
             td * 1e3 / G, tps, (double)B * G / td);
    if (bench_emit_json("medley_gpu_bench", json, out))
        return 1;
    free(h);
    free(b.L);
    cuda_ctx_close(b.c);
    return 0;
}
