/* backend.h — the only door to a device (docs/design.md §5): a table of function pointers
 * that the engine calls for every operation of a forward pass, in the style of ggml's
 * backends. The CPU backend (kernels/cpu/backend_cpu.c) is always built and is the reference;
 * the CUDA backend (kernels/cuda/) implements the same table. Devices by name: "cpu",
 * "cpu:N", "cpu-exact", "cuda:K", "cuda-exact:K", "auto" (md_backend_open below). Adding an
 * op touches both backends, the engine and several tests: docs/engine.md, "How to add a
 * backend op", lists them in order.
 *
 * Memory model.
 *  - A md_buf is an opaque handle to device memory owned by one backend. The engine never
 *    dereferences it: data moves only through buf_upload / buf_download (or buf_wrap for
 *    read-only weights, which the CPU backend aliases without a copy and a GPU backend
 *    copies to the device). Every op takes buffers of its own backend only.
 *  - Activations are F32, row-major: a buffer "x [T, C]" holds T rows (one per token of the
 *    step) of C floats. Weights are md_tensor views (a buffer + byte offset + md_type of
 *    common/dtype.h + shape) of quantized or float data, laid out as in GGUF: ne0 = row
 *    length (inputs), ne1 = number of rows (outputs).
 *  - The KV cache of one layer is two buffers (K and V) of n_blocks * block_tokens slots;
 *    a slot holds n_kv_heads * head_dim elements of the cache type (kv_cache_type). Which slot
 *    a token's K/V live in is decided by the engine (block tables, prefix sharing,
 *    preemption); the backend just reads and writes slots.
 *  - Per-step metadata (token ids, positions, slots, block tables, which rows need logits)
 *    is host memory handed to batch_prepare() once per step; a device backend uploads it
 *    there, and the ops that follow in the same step use it. Ops are asynchronous with
 *    respect to the host on devices that queue work; buf_download and sync wait.
 *
 * Devices: one md_backend is one device (the host's CPU cores, or one GPU). The engine runs
 * a model on one backend, or as pipeline stages and tensor-parallel ranks each on its own
 * backend (engine/shard/stage.h, engine/shard/tp.h; docs/sharding.md); a backend never sees
 * another's buffers — hidden states cross between them through host memory, a link
 * (engine/shard/link.h) or, between GPUs, the optional collective ops (NCCL).
 *
 * Errors: ops that can fail return 0 or a negative MD_E* code and fill e. The compute ops
 * assume the shapes were validated at model load (the engine checks every tensor's shape and
 * type once) and return MD_EUNSUPP for a weight type the backend cannot multiply.
 *
 * Ownership: md_backend_open() gives a backend the caller frees with md_backend_free();
 * buffers are freed with buf_free before the backend. */
#ifndef MEDLEY_KERNELS_BACKEND_H
#define MEDLEY_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

typedef struct md_backend md_backend;
typedef struct md_buf md_buf;
/* A linear layer prepared by a backend for encoder steps (lin_prepare); opaque. */
typedef struct md_lin md_lin;
/* A communicator of the collective ops (comm_init below); owned by the backend that made it. */
typedef struct md_comm md_comm;
#define MD_COMM_ID_BYTES 128 /* a communicator's id, as NCCL's ncclUniqueId */

/* A weight: rows of ne0 elements of `type` (md_type_supported), ne1 rows, starting `offset` bytes
 * into buf. Row r starts at offset + r * row_bytes. */
typedef struct {
    md_buf *buf;
    size_t offset;
    int type;
    int64_t ne0, ne1;
    size_t row_bytes;
} md_tensor;

/* One step's layout, host memory, valid until the next batch_prepare().
 * T tokens from n_seqs sequences; token t belongs to sequence tok_seq[t] at position
 * tok_pos[t] and its K/V go to cache slot slot[t] (= block * block_tokens + pos %
 * block_tokens). Sequence s attends to its positions [0, seq_len[s]) whose blocks are
 * block_table[s * max_blocks .. + ceil(seq_len[s] / block_tokens)); a token at position p
 * attends causally to positions <= p. Tokens of one sequence are contiguous and in
 * position order. logit_rows[0..n_logits) are the tokens whose logits the step needs. */
typedef struct {
    int n_tokens;
    int n_seqs;
    const int32_t *tokens;      /* [T] token ids */
    const int32_t *tok_seq;     /* [T] index into the per-sequence arrays */
    const int32_t *tok_pos;     /* [T] */
    const int32_t *slot;        /* [T] */
    const int32_t *seq_len;     /* [n_seqs] K/V length after this step's writes */
    const int32_t *block_table; /* [n_seqs * max_blocks] */
    int max_blocks;
    int block_tokens;
    const int32_t *logit_rows; /* [n_logits] */
    int n_logits;
    /* Ignored by the backends: for a pipeline's last stage (engine/shard/stage.h), 1 = give back
     * each logit row's argmax instead of the row (every row of the step is a plain greedy
     * pick), so a link carries 4 bytes per row instead of n_vocab * 4. */
    int argmax_only;
} md_batch;

/* Sizes fixed at engine open, so the step loop never allocates. */
typedef struct {
    int max_tokens;   /* most tokens in one step */
    int max_seqs;     /* most sequences in one step */
    int max_cols;     /* longest matmul row (input width) */
    int max_ctx;      /* longest sequence (positions) */
    int max_blocks;   /* block table width */
    int n_heads;      /* query heads, for attention scratch */
    int enc_head_dim; /* encoders: attention_enc's head dimension (its scratch); 0: none */
} md_reserve;

/* A token a row's penalties touch: one entry per distinct token of the sequence (those of
 * the prompt too when the repetition penalty is on), with how often it occurs in the
 * output (0: prompt only). engine/sampler.h smp_pen_list makes them. */
typedef struct {
    int32_t token;
    int32_t n_out;
} md_sample_pen;

/* A bias added to one token's logit (engine.h md_logit_bias, OpenAI's logit_bias). */
typedef struct {
    int32_t token;
    float bias;
} md_sample_bias;

/* Words of a row's token mask: bit t % 32 of word t / 32 is token t. */
#define MD_MASK_WORDS(n) (((n) + 31) / 32)

/* One row's draw for the optional sample op: the engine's sampler semantics (engine/sampler.h
 * smp_sample_row) — first the constraint: each bias entry added to its token's logit (in
 * order, float adds), then every token whose mask bit is clear set to -inf; the row so
 * constrained is "the row as it came in" for the logprobs and top logprobs. Then penalties
 * over the row's entries (repetition: a positive logit divided by it, a negative one
 * multiplied; then presence + frequency * n_out subtracted where n_out > 0), temperature
 * softmax, top_k (0 = off), top_p (1 = off), min_p (0 = off), then the inverse-CDF walk over
 * the kept tokens of non-zero probability in index order at u in [0, 1); the argmax of the
 * penalised row at temperature <= 0. A row whose mask allows no token is the caller's error
 * (the engine never sends one): its result is -1 or an arbitrary token. */
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    double u;
    float repetition, presence, frequency; /* 1, 0, 0 = off */
    int pen_off, pen_n; /* the row's entries: pen[pen_off .. pen_off + pen_n) of the call */
    int n_top;          /* top logprobs wanted, 0..MD_SAMPLE_TOP */
    /* The constraint (structured outputs), host memory the caller keeps until the op returns:
     * mask [MD_MASK_WORDS(n)] (NULL = every token allowed) and bias [n_bias] (NULL / 0 =
     * none; tokens outside [0, n) are skipped). A device backend packs the masked rows into
     * one bitmask upload per call. */
    const uint32_t *mask;
    const md_sample_bias *bias;
    int n_bias;
} md_sample_params;

/* lin_prepare flags and lin epilogues (encoder linear layers). */
enum { MD_LIN_BF16 = 1 };
enum { MD_LIN_SET = 0, MD_LIN_GELU = 1, MD_LIN_ADD = 2 };

#define MD_SAMPLE_TOP 20 /* engine.h MD_TOP_LOGPROBS */

typedef struct md_backend_ops {
    const char *name; /* "cpu" (also cpu-exact), "cuda" (also cuda-exact) */
    /* Element type of the KV cache the engine allocates on this backend unless configured
     * otherwise: MD_TYPE_F16 (cpu, cuda), MD_TYPE_F32 (cpu-exact, cuda-exact) or
     * MD_TYPE_BF16. */
    int kv_cache_type;
    /* 1: the engine hands every weight to buf_wrap as F32, dequantized on the host (the
     * exact modes of device backends, whose buf_wrap copies: the host copy is freed after
     * the wrap and a sync). 0: weights as the file stores them. A backend that aliases host
     * memory in buf_wrap (the CPU) must leave it 0. */
    int weights_f32;
    /* Weight types beyond md_type_supported this backend multiplies as the file stores them,
     * a bit mask of 1ull << md_type (0: none; the CPU: Q5_0). The engine recodes a weight
     * of a type outside both where it can (Q5_0 as Q8_0, exactly: engine/model/model.c). */
    uint64_t extra_weight_types;
    /* The engine's batch sizes on this backend when the configuration leaves them 0: most
     * running sequences, most tokens per step (0: the engine's 64 and 512, a CPU's). A GPU
     * reads every weight once per step whatever the batch, so it sets both higher. */
    int default_max_seqs, default_step_tokens;

    void (*free)(md_backend *be);
    /* Device description for logs and heartbeats ("cpu: 16 threads, avx512_vnni"). */
    const char *(*describe)(md_backend *be);

    int (*buf_alloc)(md_backend *be, size_t bytes, md_buf **out, md_err *e);
    /* Read-only device copy of host data (the CPU backend aliases it: host must outlive the
     * buffer). Used for weights, which stay mmap'd on CPU. */
    int (*buf_wrap)(md_backend *be, const void *host, size_t bytes, md_buf **out, md_err *e);
    void (*buf_free)(md_backend *be, md_buf *b);
    int (*buf_upload)(md_backend *be, md_buf *dst, size_t off, const void *src, size_t n,
                      md_err *e);
    int (*buf_download)(md_backend *be, const md_buf *src, size_t off, void *dst, size_t n,
                        md_err *e);
    /* Set n bytes at off to zero. */
    int (*buf_zero)(md_backend *be, md_buf *b, size_t off, size_t n, md_err *e);

    /* Whether this backend's attention takes a model of these heads over a cache of
     * cache_type (optional; NULL: any shape). The engine asks before it loads anything, so
     * a model the kernels cannot run is refused with nothing uploaded, not at its first
     * step. MD_EUNSUPP with what is supported. */
    int (*check_attention)(md_backend *be, int n_heads, int n_kv_heads, int head_dim,
                           int cache_type, md_err *e);
    int (*reserve)(md_backend *be, const md_reserve *r, md_err *e);
    int (*batch_prepare)(md_backend *be, const md_batch *b, md_err *e);

    /* out [T, w->ne0] = rows tokens[t] of w (any weight type), using the prepared batch. */
    int (*embed)(md_backend *be, const md_tensor *w, md_buf *out, md_err *e);
    /* y [T, w->ne1] = x [T, w->ne0] · wᵀ. Any T from 1 to max_tokens. */
    int (*matmul)(md_backend *be, const md_tensor *w, const md_buf *x, md_buf *y, int T, md_err *e);
    /* y [T, n] += bias [n] (F32 tensor). */
    int (*add_bias)(md_backend *be, md_buf *y, const md_tensor *bias, int T, md_err *e);
    /* out [T, C] = x / rms(x) * w  (w F32 [C]); out may equal x. */
    int (*rmsnorm)(md_backend *be, const md_buf *x, const md_tensor *w, md_buf *out, int T, int C,
                   float eps, md_err *e);
    /* Rotate x [T, n_heads, head_dim] in place at the prepared positions. inv_freq
     * [rot_dims / 2] F32 (md_rope_inv_freq) holds theta_i per pair, scaling applied; neox
     * pairs (i, i + rot_dims/2), otherwise (2i, 2i+1). Dimensions >= rot_dims are kept. */
    int (*rope)(md_backend *be, md_buf *x, int n_heads, int head_dim, int rot_dims,
                const md_buf *inv_freq, int neox, md_err *e);
    /* Store k, v [T, kv_dim] into the prepared slots of k_cache / v_cache. */
    int (*kv_write)(md_backend *be, const md_buf *k, const md_buf *v, md_buf *k_cache,
                    md_buf *v_cache, int kv_dim, int cache_type, md_err *e);
    /* out [T, n_heads * head_dim] = softmax(q kᵀ * scale) v over each token's sequence,
     * causal, GQA (query head h reads kv head h / (n_heads / n_kv_heads)). */
    int (*attention)(md_backend *be, const md_buf *q, const md_buf *k_cache, const md_buf *v_cache,
                     md_buf *out, int n_heads, int n_kv_heads, int head_dim, int cache_type,
                     float scale, md_err *e);
    /* out [n] = silu(gate) * up; out may equal gate. */
    int (*swiglu)(md_backend *be, const md_buf *gate, const md_buf *up, md_buf *out, int64_t n,
                  md_err *e);
    /* x [n] += y [n]. */
    int (*add)(md_backend *be, md_buf *x, const md_buf *y, int64_t n, md_err *e);
    /* out [n_logits, C] = rows logit_rows of x [T, C]. */
    int (*gather_rows)(md_backend *be, const md_buf *x, md_buf *out, int C, md_err *e);
    /* Wait for queued work. */
    int (*sync)(md_backend *be, md_err *e);

    /* Optional ops (NULL when the backend does not have them). */

    /* Refuse before loading: 0 when need_bytes (weights + KV cache, as the engine sizes
     * them) fit the device, else MD_ENOMEM with a sentence giving what, the bytes needed
     * and the device's free and total memory. */
    int (*check_fits)(md_backend *be, size_t need_bytes, const char *what, md_err *e);
    /* Device memory medley could still take (free + what its pool holds unused) and the
     * device's total: the engine sizes its default KV cache from it. */
    int (*mem_info)(md_backend *be, size_t *avail_bytes, size_t *total_bytes, md_err *e);
    /* Greedy sampling on the device: out [rows] (host) = index of the largest of each row of
     * x [rows, n] (the lowest index on ties, as the engine's sampler), so a step of greedy
     * sequences downloads rows ids instead of rows x n logits; -1 for a row holding a NaN
     * (a faulty device: the engine fails that sequence). Waits for the result. */
    int (*argmax)(md_backend *be, const md_buf *x, int rows, int n, int32_t *out, md_err *e);
    /* Sampling on the device: out [rows] (host) = the draw of each row of x [rows, n] under
     * p[r] (host, rows entries) and its penalty entries in pen [n_pen] (host), so sampled,
     * penalised and logprob-reporting sequences download one id instead of a row of logits;
     * -1 for a row holding a NaN. Each row's constraint (p[r].mask, p[r].bias) applies first,
     * as md_sample_params says. logprob [rows] (host, may be NULL) = each chosen token's
     * log-softmax under the raw row with its constraint (before penalties and temperature);
     * top_tok, top_lp
     * [rows, MD_SAMPLE_TOP] (host, may be NULL; only with logprob) = the p[r].n_top most likely
     * tokens of the raw row and their logprobs as engine/sampler.h smp_top_logprobs lists
     * them, -1 / 0 past the last. Rows with penalty entries are penalised in place (x is the
     * step's scratch). Waits for the result. */
    int (*sample)(md_backend *be, const md_buf *x, int rows, int n, const md_sample_params *p,
                  const md_sample_pen *pen, int n_pen, int32_t *out, float *logprob,
                  int32_t *top_tok, float *top_lp, md_err *e);

    /* Fused products of one input x [T, K] with n <= MD_MM_MAX weights w[i] [ne1_i, K] (any
     * weight types, mixed allowed), so a backend can read x once and launch once for Q/K/V
     * or gate/up, and fold the residual add or SwiGLU into the product (the engine falls
     * back to matmul / add / swiglu when this is NULL). mode:
     *  MD_MM_SET    y[i] [T, ne1_i] = x · w[i]ᵀ
     *  MD_MM_ACC    y[i] [T, ne1_i] += x · w[i]ᵀ (the residual add; y[i] is not x)
     *  MD_MM_SWIGLU n == 2, w[0] (gate) and w[1] (up) of one shape [F, K] (types may differ):
     *               y[0] [T, F] = silu(x · w[0]ᵀ) * (x · w[1]ᵀ); y[1] [T, F] is scratch the
     *               backend may overwrite (the unfused fallback's up buffer).
     * No y[i] may be x or another y[j]. The result must equal the unfused ops' (matmul then
     * add / swiglu) to rounding of the same arithmetic; the CPU backend's is bit-identical. */
    int (*matmul_n)(md_backend *be, int n, const md_tensor *const *w, const md_buf *x,
                    md_buf *const *y, int T, int mode, md_err *e);

    /* rope(q), rope(k) and kv_write(k, v) of one layer in one op (optional; the engine falls
     * back to the three): q [T, n_heads, head_dim] is rotated in place, k [T, n_kv_heads,
     * head_dim] is rotated into the cache (k itself may be left rotated or not: the engine
     * does not read it again) and v is stored beside it. Arguments as for rope and kv_write,
     * kv_dim = n_kv_heads * head_dim; results equal theirs bit for bit. */
    int (*rope_kv)(md_backend *be, md_buf *q, md_buf *k, const md_buf *v, md_buf *k_cache,
                   md_buf *v_cache, int n_heads, int n_kv_heads, int head_dim, int rot_dims,
                   const md_buf *inv_freq, int neox, int cache_type, md_err *e);

    /* Gemma 3 and sliding-window models (optional; the engine refuses a model that needs
     * one of them on a backend without it, at load, naming the op):
     *  attention_window  attention as above, but a token at position p attends to positions
     *                    (p - window, p] only (window >= 1; older keys are masked out, as
     *                    llama.cpp's standard SWA mask)
     *  scale             x [n] *= s
     *  geglu             out [n] = gelu(gate) * up, gelu's tanh form (cpu_geglu); out may
     *                    equal gate */
    int (*attention_window)(md_backend *be, const md_buf *q, const md_buf *k_cache,
                            const md_buf *v_cache, md_buf *out, int n_heads, int n_kv_heads,
                            int head_dim, int cache_type, float scale, int window, md_err *e);
    int (*scale)(md_backend *be, md_buf *x, float s, int64_t n, md_err *e);
    int (*geglu)(md_backend *be, const md_buf *gate, const md_buf *up, md_buf *out, int64_t n,
                 md_err *e);

    /* Encoders (BERT family, engine/model/encoder.h; optional, all four or none: the encoder
     * refuses a backend without them at load, naming the op). No KV cache: the step's tokens
     * are the whole of their sequences, packed one after the other (variable-length packing:
     * no padding, no padding mask). An encoder's step is prepared with max_blocks 0 (only
     * tokens, tok_seq and tok_pos are read) on a backend reserved with max_blocks 0 and
     * enc_head_dim set; a backend may refuse an enc_head_dim its kernel cannot take
     * (MD_EUNSUPP, CUDA: above 128).
     *  layernorm      out [T, C] = (x - mean) / sqrt(var + eps) * w + b, mean and variance
     *                 over each row (w, b F32 [C]); out may equal x
     *  gelu_erf       x [n] = 0.5 x (1 + erf(x / sqrt 2)), the exact GELU, in place
     *  embed_add      out [T, w->ne0] += row (tok_pos[t] + offset) of w, for each token of the
     *                 prepared batch (absolute position embeddings); offset >= 0
     *  attention_enc  out [T, n_heads * head_dim] = softmax(q kᵀ * scale) v, token t attending
     *                 to every token of its own sequence in the prepared batch (the contiguous
     *                 run of equal tok_seq around t), before and after it: block-diagonal,
     *                 bidirectional. q, k, v [T, n_heads * head_dim] activations; a sequence
     *                 is at most the reserved max_ctx tokens and head_dim at most the reserved
     *                 enc_head_dim (MD_ERANGE). */
    int (*layernorm)(md_backend *be, const md_buf *x, const md_tensor *w, const md_tensor *b,
                     md_buf *out, int T, int C, float eps, md_err *e);
    int (*gelu_erf)(md_backend *be, md_buf *x, int64_t n, md_err *e);
    int (*embed_add)(md_backend *be, const md_tensor *w, int offset, md_buf *out, md_err *e);
    int (*attention_enc)(md_backend *be, const md_buf *q, const md_buf *k, const md_buf *v,
                         md_buf *out, int n_heads, int head_dim, float scale, md_err *e);
    /* Pooling on the device (optional; NULL: the caller downloads the hidden states and
     * pools them on the host, engine/embedder.h md_pool): out [n_seqs, C] = for each sequence
     * of the prepared encoder step, in step order (every sequence holds tokens), mode
     * (MD_POOL_*) over its rows of x [T, C]; with normalize, each row then divided by
     * max(its L2 norm, 1e-12) (left as is at norm 0). MD_EINVAL outside an encoder step. */
    int (*pool_enc)(md_backend *be, const md_buf *x, md_buf *out, int C, int mode, int normalize,
                    md_err *e);

    /* Encoder linear layers (optional, all three or none: the encoder falls back to matmul,
     * add_bias, gelu_erf and add):
     *  lin_prepare  weight w [ne1, ne0] (F32, F16 or BF16; other types as the backend's matmul
     *               takes them) with bias b (F32 [ne1]) kept in the layout the backend
     *               multiplies many tokens by (the CPU at the AVX-512 level: panels of 32 rows,
     *               kernels/cpu/enc_gemm.c), a copy it owns until lin_free. flags
     *               MD_LIN_BF16: products of BF16-rounded weights and activations, summed in
     *               F32 (MD_EUNSUPP naming the instruction set where the device has none).
     *               Called at load, never in a step.
     *  lin          y [T, ne1] = x [T, ne0] · wᵀ + b, then epi: MD_LIN_SET stores it,
     *               MD_LIN_GELU stores its exact GELU, MD_LIN_ADD adds it to y (the
     *               residual). A token's row does not depend on the other tokens of the step.
     *  lin_free     NULL is a no-op. */
    int (*lin_prepare)(md_backend *be, const md_tensor *w, const md_tensor *b, int flags,
                       md_lin **out, md_err *e);
    int (*lin)(md_backend *be, const md_lin *l, const md_buf *x, md_buf *y, int T, int epi,
               md_err *e);
    void (*lin_free)(md_backend *be, md_lin *l);

    /* Keep a BF16 copy of quantized weight w on the device beside it (optional): matmul and
     * matmul_n then multiply products of more rows than the backend's weight-only vector
     * kernels serve by the copy, instead of expanding w into scratch at every such product.
     * Costs ne0 * ne1 * 2 bytes; MD_ENOMEM, with nothing changed, when the device lacks them.
     * 0 and nothing done for F32/F16/BF16 weights. A copy lives until the buffer holding w is
     * freed (buf_free drops the copies of the tensors inside it). */
    int (*weight_shadow)(md_backend *be, const md_tensor *w, md_err *e);

    /* A weight for embed / matmul / matmul_n (optional; NULL: the engine calls buf_wrap):
     * host holds ne1 rows of ne0 elements of `type` in GGUF layout, `bytes` bytes. The
     * backend may copy it into the layout its kernels stream (the CPU at the AVX2 and AVX-512
     * levels: Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K repacked in 16-row groups, docs/kernels.md
     * "Repacked weights"):
     * then *copied = 1 and host is never read again, so the caller may give its pages back;
     * else *copied = 0 and the buffer aliases host as buf_wrap's does. While copying, the
     * backend calls done(done_ctx, p, n) (done may be NULL) for each range [p, p + n) of host
     * it has finished reading, so that the caller can give those pages back before the copy
     * ends (a 178 MB embedding would otherwise be resident twice at its peak). Either way
     * tensors over the buffer are used as over any weight buffer, at offset 0 with GGUF's
     * row_bytes; buf_free frees a copy. */
    int (*weight_wrap)(md_backend *be, const void *host, size_t bytes, int type, int64_t ne0,
                       int64_t ne1, void (*done)(void *done_ctx, const void *p, size_t n),
                       void *done_ctx, md_buf **out, int *copied, md_err *e);

    /* Step recording (CUDA graphs). The engine brackets the ops of one forward pass, after
     * batch_prepare and before anything is downloaded, with step_begin / step_end. Between
     * them the backend may record instead of run (and launch the recording at step_end),
     * or replay an earlier recording of a step of the same shape at step_end (the ops then
     * check their arguments and queue nothing). So every op argument between the two must
     * depend only on the step's shape as the backend keys it, never on per-step values
     * other than the metadata batch_prepare uploaded. step_end(failed) gets the first error
     * of the pass (0 when none) and returns 0 when the pass's work is queued,
     * MD_STEP_RERUN when the recording was dropped and the engine must issue the same ops
     * again (they then run directly), or an error. */
    int (*step_begin)(md_backend *be, md_err *e);
    int (*step_end)(md_backend *be, int failed, md_err *e);

    /* Collectives between devices (optional, all present or all NULL: the CUDA backend's
     * through NCCL when the build found it, MEDLEY_HAVE_NCCL; the tensor-parallel ranks of
     * engine/shard/tp.c use them). A communicator joins n backends, rank 0 to n - 1, each on a
     * device of its own, in threads of one process or in several processes.
     *  comm_unique_id  Any one rank makes the id and hands it to the others (memory, a
     *                  socket): MD_COMM_ID_BYTES opaque bytes. MD_EUNSUPP with the reason
     *                  when the collectives library cannot be loaded on this host.
     *  comm_init       Rank `rank` of n joins the communicator of id: blocks until all n
     *                  ranks have called it, so each calls it from its own thread or process
     *                  (a rank that never comes leaves the others waiting: NCCL's init has
     *                  no timeout). The communicator belongs to this backend and is freed
     *                  with comm_free before it (comm_free waits for the backend's queued
     *                  work; a communicator that failed is aborted first, so its kernels stop
     *                  waiting for peers); it is used with this backend only and from one
     *                  thread at a time. A backend in a communicator records no steps
     *                  (step_begin runs the ops directly): every rank must issue the same
     *                  collectives in the same order, which per-rank graph decisions could
     *                  break.
     *  all_reduce      buf [n] (F32) = the sum of every rank's buf [n], in place. Every rank
     *                  calls it with the same n, in the same order as its other collectives.
     *                  Queued like the compute ops (asynchronous; the backend's later ops
     *                  see the sum), on a padded decode step over the padded rows too.
     *  send / recv     `bytes` bytes at `off` in buf to / from rank `peer` (queued, like
     *                  all_reduce); a send is matched by the peer's recv of the same size.
     *                  Each waits on the device for its peer, so one thread sending to and
     *                  receiving from a peer (or itself) brackets the pair with
     *                  comm_group_start / comm_group_end.
     *  comm_group_*    The calling thread's collectives between start and end are issued
     *                  together at end (ncclGroupStart / ncclGroupEnd); groups nest.
     * Errors: MD_EINVAL for a rank, peer or count outside the communicator, MD_ERANGE for
     * bytes outside buf, MD_EDEVICE with the library's sentence and what was asked ("cuda:1
     * all-reduce of 1048576 floats: unhandled cuda error (...)"). A communicator keeps its
     * first error and refuses every later call with it: its peers may be waiting for the
     * collective that failed, so the caller fails the whole group. */
    int (*comm_unique_id)(md_backend *be, uint8_t id[MD_COMM_ID_BYTES], md_err *e);
    int (*comm_init)(md_backend *be, const uint8_t id[MD_COMM_ID_BYTES], int rank, int n,
                     md_comm **out, md_err *e);
    void (*comm_free)(md_backend *be, md_comm *c);
    int (*all_reduce)(md_backend *be, md_comm *c, md_buf *buf, int64_t n, md_err *e);
    int (*send)(md_backend *be, md_comm *c, const md_buf *buf, size_t off, size_t bytes, int peer,
                md_err *e);
    int (*recv)(md_backend *be, md_comm *c, md_buf *buf, size_t off, size_t bytes, int peer,
                md_err *e);
    int (*comm_group_start)(md_backend *be, md_err *e);
    int (*comm_group_end)(md_backend *be, md_err *e);
} md_backend_ops;

#define MD_STEP_RERUN 1

/* pool_enc modes (engine/weights/st_config.h's st_pooling numbers them alike): the mean of the
 * rows, the first row (CLS), the element-wise maximum, the sum over sqrt(rows), the last row. */
enum { MD_POOL_MEAN = 0, MD_POOL_CLS, MD_POOL_MAX, MD_POOL_MEAN_SQRT, MD_POOL_LAST };

/* matmul_n modes and its most weights per call. */
enum { MD_MM_SET = 0, MD_MM_ACC = 1, MD_MM_SWIGLU = 2 };
#define MD_MM_MAX 4

/* Every backend struct starts with its ops table. */
struct md_backend {
    const md_backend_ops *ops;
};

/* Devices: what code outside kernels/ may know about them (worker heartbeats, `medley
 * profile`), through here only. Every build answers: one without CUDA, or a host without a
 * driver or GPU, has no CUDA devices. */
typedef enum { MD_DEVICE_CPU = 0, MD_DEVICE_CUDA = 1 } md_device_kind;

/* A device name taken apart. */
typedef struct {
    md_device_kind kind;
    int index; /* CUDA: the GPU ordinal (0 for "cuda"); CPU: threads of "cpu:N", else 0 */
    int exact; /* "cpu-exact", "cuda-exact", "cuda-exact:K" */
} md_device_id;

/* Parse "cpu", "cpu:N" (N >= 1), "cpu-exact", "cuda", "cuda:K", "cuda-exact" or
 * "cuda-exact:K"; NULL or "" is "cpu". Asks no driver, so "cuda:7" parses on any host.
 * MD_EINVAL with a sentence for anything else, "auto" included (md_backend_resolve turns it
 * into one of these). */
int md_device_parse(const char *device, md_device_id *out, md_err *e);

/* Usable CUDA devices; 0 when there are none, with the reason in why (may be NULL): the
 * driver's sentence, or "medley was built without CUDA". */
int md_device_count(char *why, size_t whysz);

typedef struct {
    char name[256]; /* "NVIDIA H200" */
    int ordinal;
    int cc_major, cc_minor; /* compute capability */
    int n_sm;
    size_t total_bytes, free_bytes;
    double hbm_gbps; /* peak from the memory clock and bus width; 0 if unknown */
} md_device_info;

/* Describe CUDA device `ordinal`: MD_EDEVICE with a sentence when it does not exist,
 * MD_EUNSUPP on a build without CUDA. */
int md_device_get(int ordinal, md_device_info *out, md_err *e);

/* Open "cpu", "cpu:N" (N threads), "cpu-exact", "cuda:K", "cuda-exact:K" or "auto"
 * (md_backend_resolve).
 * n_threads applies to the CPU backend (0 = every core). "cuda:K" on a build without CUDA
 * fails with MD_EUNSUPP "built without CUDA". */
int md_backend_open(const char *device, int n_threads, md_backend **out, md_err *e);

/* Turn a device name into the one to open, before anything is loaded:
 *  - "auto": "cuda:0" when the CUDA backend is built and a device is usable, otherwise
 *    "cpu" (not an error); logs one info line saying which device was chosen and why
 *    (the CUDA driver's sentence when there is no GPU).
 *  - "cuda:K" / "cuda" (and "cuda-exact:K" / "cuda-exact"): checked now, so a missing GPU
 *    is a clear error (MD_EUNSUPP when built without CUDA, MD_EDEVICE "no CUDA device is
 *    usable ..." otherwise).
 *  - NULL or "" is "cpu"; other names are copied unchanged (md_backend_open checks them).
 * Writes the name to out (n bytes). */
int md_backend_resolve(const char *device, char *out, size_t n, md_err *e);
void md_backend_free(md_backend *be);

/* Make md_backend_open accept another device name: `prefix` exactly, or `prefix:<rest>`
 * (open gets the whole name). For backends that live outside kernels/ (the tests' fault
 * injection and graph-recording wrappers). Names of the built-in devices cannot be taken;
 * at most 8 registrations; not thread-safe (register before opening anything). */
typedef int (*md_backend_open_fn)(const char *device, int n_threads, md_backend **out, md_err *e);
int md_backend_register(const char *prefix, md_backend_open_fn open, md_err *e);

int md_backend_cpu_open(int n_threads, md_backend **out, md_err *e);
/* "cpu-exact": the CPU backend with quantized weights dequantized and multiplied in double
 * precision, activations unquantized (slow: double products over the threads, a row buffer
 * per thread per call): the reference the fast kernels and other backends are checked
 * against. */
int md_backend_cpu_exact_open(int n_threads, md_backend **out, md_err *e);
#ifdef MEDLEY_HAVE_CUDA
int md_backend_cuda_open(int ordinal, md_backend **out, md_err *e);
/* The CUDA backend's device facts behind md_device_count / md_device_get (kernels/cuda/
 * backend_cuda.c; declared here so kernels/ does not include its own cuda/ folder). */
int md_cuda_device_count(char *why, size_t whysz);
int md_cuda_device_get(int ordinal, md_device_info *out, md_err *e);
/* "cuda-exact:K": the CUDA backend with every weight dequantized to F32 at load, an F32 KV
 * cache and FP32 arithmetic throughout (F32 GEMV, SGEMM, FP32 attention): activations are
 * never rounded below F32, so it agrees with cpu-exact to float accumulation order, where
 * the fast backends, which round activations to int8 before each quantized product, part
 * at their rounding (docs/cuda.md "Agreement with the CPU backend"). Four to eight times
 * the weight memory of a quantized model. */
int md_backend_cuda_exact_open(int ordinal, md_backend **out, md_err *e);
#endif

/* Copy n bytes between buffers of possibly different backends: a download into `staging`
 * (host memory, n bytes), then an upload. The engine's stages stage hidden states through
 * the head's host buffers themselves (engine/shard/link_local.c), so nothing calls this yet. */
int md_backend_copy(md_backend *src_be, const md_buf *src, size_t src_off, md_backend *dst_be,
                    md_buf *dst, size_t dst_off, size_t n, void *staging, md_err *e);

/* RoPE frequencies. Llama 3 scaling (factor > 0) follows Meta's reference: wavelengths above
 * orig_ctx / low_freq_factor are divided by factor, below orig_ctx / high_freq_factor kept,
 * interpolated in between. linear_scale (1 = none) divides every frequency. */
typedef struct {
    float theta;
    float linear_scale;
    float llama3_factor; /* 0 = off */
    float llama3_low_freq_factor;
    float llama3_high_freq_factor;
    int llama3_orig_ctx;
} md_rope_cfg;
/* inv_freq [rot_dims / 2]. */
void md_rope_inv_freq(const md_rope_cfg *c, int rot_dims, float *inv_freq);

#endif
