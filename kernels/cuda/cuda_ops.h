/* cuda_ops.h — the CUDA backend's own kernels and their host launchers (internal to
 * kernels/cuda; the rest of medley reaches a GPU only through kernels/backend.h).
 *
 * A cuda_ctx is one device: its stream, cuBLAS handle, a device memory pool (cudaMalloc
 * slabs; never managed memory) and a sticky error. Every launcher enqueues work on the
 * ctx's stream and returns at once: 0, MD_EINVAL for bad shapes (checked on the host before
 * anything is launched) or MD_EDEVICE with the CUDA error's sentence. After the first
 * device error the ctx refuses all further work with that same error, so a failed step
 * can never be followed by a silently wrong one.
 *
 * Data layout (row-major, innermost last):
 *   activations  float  x[n_tokens][dim]                  (residual stream in FP32)
 *   weights      any GGUF type, w[n_out][k]                 (ggml row = one output)
 *   KV cache     f32/f16/bf16 k[n_slots][n_kv_heads][head_dim], v likewise;
 *                slot = block * block_tokens + offset
 *   block table  int32  bt[n_seqs][max_blocks]              (physical block ids)
 * Pointers passed to launchers are device pointers unless named host_*.
 *
 * Ownership: the caller owns ctx (cuda_ctx_close frees the pool and everything in it);
 * buffers from cuda_pool_alloc belong to the pool until cuda_pool_free. */
#ifndef MEDLEY_KERNELS_CUDA_OPS_H
#define MEDLEY_KERNELS_CUDA_OPS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* common/err.h has no C++ guards of its own: its functions are C */
#endif

#include "common/err.h"

typedef struct cuda_ctx cuda_ctx;

/* Element types of device buffers the launchers accept. */
typedef enum { CUDA_F32 = 0, CUDA_F16 = 1, CUDA_BF16 = 2 } cuda_dtype;

typedef struct {
    char name[256];
    int ordinal;
    int cc_major, cc_minor;
    int n_sm;
    size_t total_bytes, free_bytes;
    double hbm_gbps; /* peak, from memory clock x bus width (0 when the driver hides it) */
} cuda_device_info;

/* How many CUDA devices this process can use. Never fails: with no driver or no device
 * it returns 0 and, when why is not NULL, writes the driver's reason into why. */
int cuda_device_count(char *why, size_t whysz);
int cuda_device_query(int ordinal, cuda_device_info *info, md_err *e);

/* Open device `ordinal`: MD_EDEVICE with a sentence naming the device count when it does
 * not exist. */
int cuda_ctx_open(int ordinal, cuda_ctx **out, md_err *e);
void cuda_ctx_close(cuda_ctx *c);
cudaStream_t cuda_ctx_stream(cuda_ctx *c);
int cuda_ctx_ordinal(const cuda_ctx *c);
/* Wait for the stream and report any error it hit (sticky, see above). */
int cuda_sync(cuda_ctx *c, md_err *e);
/* Check for a launch error after enqueuing kernels; `what` names the operation. */
int cuda_check(cuda_ctx *c, const char *what, md_err *e);
/* The sticky error, or 0. */
int cuda_ctx_failed(const cuda_ctx *c, md_err *e);

/* Device memory pool: 256-byte aligned blocks carved out of cudaMalloc'd slabs. */
int cuda_pool_alloc(cuda_ctx *c, size_t bytes, void **out, md_err *e);
void cuda_pool_free(cuda_ctx *c, void *p);
/* Bytes held by live allocations / by slabs (for memory reports). */
size_t cuda_pool_used(const cuda_ctx *c);
size_t cuda_pool_reserved(const cuda_ctx *c);
/* Refuse before loading: MD_ENOMEM with "needs X GiB, Y GiB free of Z GiB" when need
 * (plus the pool's spare room) exceeds what the device has free. */
int cuda_check_fits(cuda_ctx *c, size_t need_bytes, const char *what, md_err *e);
/* Free device memory plus what the pool holds unused; the device's total. */
int cuda_mem_info(cuda_ctx *c, size_t *avail, size_t *total, md_err *e);

int cuda_upload(cuda_ctx *c, void *dst, const void *host_src, size_t bytes, md_err *e);
int cuda_download(cuda_ctx *c, void *host_dst, const void *src, size_t bytes, md_err *e);
int cuda_memset0(cuda_ctx *c, void *dst, size_t bytes, md_err *e);

/* Fill n elements of dst (dtype) with uniform values in [-scale, scale) from a hash of
 * (seed, index): synthetic weights for benchmarks and tests, no host transfer. */
int cuda_fill_random(cuda_ctx *c, void *dst, cuda_dtype dtype, int64_t n, float scale,
                     uint64_t seed, md_err *e);

/* ---- GGUF dequantization (on device) ------------------------------------------------ */

/* Dequantize n elements of ggml type `gtype` (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K;
 * numbered as engine/weights/gguf.h) at src (raw blocks on the device) into dst of type `out`.
 * n must be a multiple of the type's block size. */
int cuda_dequantize(cuda_ctx *c, int gtype, const void *src, void *dst, cuda_dtype out, int64_t n,
                    md_err *e);
/* Bytes of n elements of gtype (0 when the type is unsupported or n is not a multiple). */
size_t cuda_ggml_bytes(int gtype, int64_t n);

/* ---- elementwise and normalisation ------------------------------------------------- */

/* out[r] = x[r] / rms(x[r]) * w, rms = sqrt(mean(x^2) + eps). x f32 [rows][dim], w f32 [dim],
 * out f32 or bf16 [rows][dim] (may alias x when f32). */
int cuda_rmsnorm(cuda_ctx *c, const float *x, const float *w, float eps, int rows, int dim,
                 void *out, cuda_dtype out_type, md_err *e);
/* Rotary embedding in place on x f32 [n_tokens][n_heads][head_dim], rotating the first
 * rot_dim dims of each head by pos[t] * inv_freq[i] (inv_freq f32 [rot_dim/2], scaling
 * already applied). neox=0: pairs (2i, 2i+1); neox=1: pairs (i, i + rot_dim/2). */
int cuda_rope(cuda_ctx *c, float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
              int rot_dim, const float *inv_freq, int neox, md_err *e);
/* out[i] = silu(gate[i]) * up[i], n elements; out f32 or bf16 (may alias gate when f32). */
int cuda_swiglu(cuda_ctx *c, const float *gate, const float *up, void *out, cuda_dtype out_type,
                int64_t n, md_err *e);
/* y += x, n floats. */
int cuda_add(cuda_ctx *c, float *y, const float *x, int64_t n, md_err *e);
/* y[r][i] += bias[i], y f32 [rows][cols]. */
int cuda_add_bias(cuda_ctx *c, float *y, const float *bias, int rows, int cols, md_err *e);
/* Convert n floats to bf16 / f16 / f32 at dst. */
int cuda_convert(cuda_ctx *c, const float *x, void *dst, cuda_dtype out_type, int64_t n, md_err *e);
/* out[t] = row ids[t] of table as f32: table holds n_rows rows of dim elements of ggml type
 * gtype (any type cuda_dequantize takes; dim a multiple of 32 and of the block size). Ids
 * outside [0, n_rows) give rows of zeros and set *bad_id (device int, may be NULL) to 1. */
int cuda_get_rows(cuda_ctx *c, const void *table, int gtype, int64_t n_rows, int dim,
                  const int32_t *ids, int n, float *out, int *bad_id, md_err *e);
/* out[r] = x[rows[r]], x f32 [*][cols], out f32 [n_rows][cols]. */
int cuda_gather_rows(cuda_ctx *c, const float *x, const int32_t *rows, int n_rows, int cols,
                     float *out, md_err *e);

/* ---- GEMM -------------------------------------------------------------------------- */

/* y[m][n] = x[m][k] . w[n][k]^T (+ beta * y), FP32 accumulation, x and y f32. w holds n rows
 * of row_bytes bytes of ggml type wtype (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K).
 * m <= CUDA_GEMV_MAX_M (and not force_cublas): own GEMV kernels reading w once (quantized
 * weights against x quantized to int8). m <= CUDA_MMQ_MAX_M with a quantized w: an int8
 * tiled product on its blocks. Otherwise cuBLAS GemmEx: x converted to bf16 (f16 for F16
 * weights), quantized w expanded to bf16 in scratch first; F32 weights use SGEMM. */
#define CUDA_GEMV_MAX_M 8
/* 8 < m <= CUDA_MMQ_MAX_M with quantized weights that have no BF16 copy: an int8 tiled
 * product reading the quantized blocks, instead of expanding them: gemm.cu k_mmq (__dp4a)
 * up to CUDA_MMQ_DP4A_MAX_M tokens, k_mmq_tc (int8 mma.sync, sm_80+) above. */
#define CUDA_MMQ_MAX_M 256
#define CUDA_MMQ_DP4A_MAX_M 32
int cuda_matmul(cuda_ctx *c, const void *w, int wtype, size_t row_bytes, const float *x, float *y,
                int m, int n, int k, float beta, int force_cublas, md_err *e);

/* Several products of one x [m][k] (the fused op behind backend.h matmul_n): weight i is
 * w[i].n rows of row_bytes bytes of ggml type wtype, its output y[i] f32 [m][w[i].n]. mode:
 *  CUDA_MM_SET     y[i] = x . w[i]^T
 *  CUDA_MM_ACC     y[i] += x . w[i]^T (beta 1: the residual add; no y[i] may overlap x)
 *  CUDA_MM_SWIGLU  n_w == 2, gate w[0] and up w[1] of one row count:
 *                  y[0] = silu(x . w[0]^T) * (x . w[1]^T); y[1] is scratch it may overwrite.
 * GEMV path (m <= CUDA_GEMV_MAX_M, not force_cublas): weights of one type are one launch
 * over their concatenated rows (weights of different types: one launch per type); SwiGLU
 * with gate and up of one type is one launch whose warps compute a gate row and the
 * matching up row and write silu(g) * u (different types: two GEMVs and cuda_swiglu).
 * 8 < m <= CUDA_MMQ_MAX_M: quantized weights without a bf16 copy on the int8 tiled product
 * (x quantized once per call), the others on cuBLAS as below.
 * cuBLAS path: x converted to BF16 / F16 once per call for all weights needing that type,
 * quantized weights read from w[i].bf16 when set (else expanded into scratch), GemmEx with
 * beta 1 for ACC, SwiGLU as two GEMMs then cuda_swiglu. Results equal
 * cuda_matmul followed by cuda_add / cuda_swiglu to float rounding (on the GEMV path,
 * bit for bit). */
#define CUDA_MM_MAX 4
enum { CUDA_MM_SET = 0, CUDA_MM_ACC = 1, CUDA_MM_SWIGLU = 2 };
typedef struct {
    const void *w; /* device */
    int wtype;
    size_t row_bytes;
    int n;    /* rows (outputs) */
    float *y; /* device, [m][n] */
    /* device: a BF16 copy of a quantized w ([n][k], as cuda_dequantize makes it) for the
     * cuBLAS path instead of expanding w into scratch; NULL when there is none. The GEMV
     * path reads w (fewer bytes). Ignored for F32/F16/BF16 weights. */
    const void *bf16;
} cuda_mm_w;
int cuda_matmul_n(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k, int mode,
                  int force_cublas, md_err *e);

/* ---- paged KV cache and attention ------------------------------------------------ */

typedef struct {
    void *k, *v;      /* [n_slots][n_kv_heads][head_dim] of dtype */
    cuda_dtype dtype; /* F32, F16 or BF16 */
    int n_kv_heads;
    int head_dim; /* a multiple of 32, at most 256 */
    int block_tokens;
} cuda_kv_layer;

/* Write k, v f32 [n_tokens][kv_dim] into k_cache / v_cache (dtype) at slots[t]; a token at
 * slot -1 (a padding row of a decode step) is not stored, here and in cuda_rope_kv. */
int cuda_kv_write(cuda_ctx *c, void *k_cache, void *v_cache, cuda_dtype dtype, int kv_dim,
                  const float *k, const float *v, const int32_t *slots, int n_tokens, md_err *e);

/* rope then kv_write of one layer in one launch: q f32 [n_tokens][n_heads][head_dim] rotated
 * in place as cuda_rope does; k f32 [n_tokens][kv_dim] (kv_dim = n_kv_heads * head_dim)
 * rotated the same way straight into k_cache at slots[t] (k itself is left unrotated), v
 * stored into v_cache beside it. Bit for bit cuda_rope on q and on k, then cuda_kv_write. */
int cuda_rope_kv(cuda_ctx *c, float *q, const float *k, const float *v, void *k_cache,
                 void *v_cache, cuda_dtype dtype, const int32_t *pos, const int32_t *slots,
                 int n_tokens, int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                 const float *inv_freq, int neox, md_err *e);

/* Whether the attention kernels take n_heads query heads over n_kv_heads kv heads of
 * head_dim on a cache of dtype: head_dim 64, 128 or 256, at most 8 query heads per kv head.
 * MD_EUNSUPP saying what is supported otherwise. cuda_attn_decode / _prefill check it too. */
int cuda_attn_shape_ok(int n_heads, int n_kv_heads, int head_dim, cuda_dtype dtype, md_err *e);

/* Decode attention, one query token per entry: dec int32 [n][3] = {query row, block-table
 * row, kv length}. q f32 [*][n_heads][head_dim], out likewise (same rows). The entry attends
 * to its sequence's first kv-length cached tokens (read on the device, so a captured graph
 * stays valid as sequences grow). The KV range is split into n_splits chunks processed in
 * parallel and merged (flash-decoding); work is cuda_attn_decode_work_bytes() of scratch
 * (unused with one split: the single pass writes out). */
size_t cuda_attn_decode_work_bytes(int n, int n_heads, int head_dim, int n_splits);
int cuda_attn_decode(cuda_ctx *c, const cuda_kv_layer *kv, const float *q, const int32_t *dec,
                     int n, const int32_t *block_table, int max_blocks, int n_heads, float scale,
                     int n_splits, void *work, float *out, md_err *e);

/* Prefill attention, tiled FlashAttention-style (online softmax over K/V tiles in shared
 * memory): q f32 [n_tokens][n_heads][head_dim]; a tile is up to CUDA_ATTN_TILE_Q consecutive
 * query tokens of one sequence: tiles int32 [n_tiles][4] = {block-table row, first token
 * row, tokens in tile, position of the first token}. Query at position p sees cached
 * positions 0..p (causal); those must be written first. On f16/bf16 caches at head_dim 64
 * or 128, Q K^T and P V run on the tensor cores (k_attn_pf_tc: q and the probabilities
 * rounded to the cache's type, f32 accumulation and softmax) unless the ctx was opened with
 * MEDLEY_CUDA_ATTN_TC=0 or cuda_ctx_set_attn_tc turned it off; otherwise in f32. */
#define CUDA_ATTN_TILE_Q 16
/* Turn the tensor-core prefill attention on or off (benchmarks); returns the old setting. */
int cuda_ctx_set_attn_tc(cuda_ctx *c, int on);
int cuda_attn_prefill(cuda_ctx *c, const cuda_kv_layer *kv, const float *q, const int32_t *tiles,
                      int n_tiles, const int32_t *block_table, int max_blocks, int n_heads,
                      float scale, float *out, md_err *e);

/* ---- encoders (encoder.cu) -------------------------------------------------------- */

/* out[r] = (x[r] - mean) / sqrt(var + eps) * w + b over each row of x f32 [rows][dim] (mean
 * and variance of the row, two passes); w, b f32 [dim]; out may alias x. */
int cuda_layernorm(cuda_ctx *c, const float *x, const float *w, const float *b, float eps, int rows,
                   int dim, float *out, md_err *e);
/* x[i] = 0.5 x (1 + erf(x / sqrt 2)) in place, n floats. */
int cuda_gelu_erf(cuda_ctx *c, float *x, int64_t n, md_err *e);
/* out[t] += row ids[t] + offset of table, as f32 (table as cuda_get_rows takes it: n_rows rows
 * of dim elements of ggml type gtype). The caller checks the rows: one outside [0, n_rows)
 * adds nothing. */
int cuda_add_rows(cuda_ctx *c, const void *table, int gtype, int64_t n_rows, int dim,
                  const int32_t *ids, int offset, int n, float *out, md_err *e);
/* Bidirectional attention within packed sequences: q, k, v, out f32 [T][n_heads][head_dim]
 * (head_dim <= CUDA_ENC_MAX_HEAD_DIM); tiles int32 [n_tiles][4] = {first row of a sequence,
 * its length, first query row, queries (<= CUDA_ENC_TILE_Q)}: each query row attends to
 * every row of its sequence, softmax(q k^T * scale) v, in f32. */
#define CUDA_ENC_TILE_Q 16
#define CUDA_ENC_MAX_HEAD_DIM 128
int cuda_attn_enc(cuda_ctx *c, const float *q, const float *k, const float *v, const int32_t *tiles,
                  int n_tiles, int n_heads, int head_dim, float scale, float *out, md_err *e);
/* out[s] = the pooling of rows seqs[s][0] .. seqs[s][0] + seqs[s][1] - 1 of x f32 [*][dim]
 * (int32 [n_seqs][2] = {first row, rows >= 1}), numbered as backend.h MD_POOL_*: mean, first
 * row, element-wise max, sum / sqrt(rows), last row; then, with normalize, divided by
 * max(its L2 norm, 1e-12) (left as it is at norm 0). out f32 [n_seqs][dim]. */
enum { CUDA_POOL_MEAN = 0, CUDA_POOL_CLS, CUDA_POOL_MAX, CUDA_POOL_MEAN_SQRT, CUDA_POOL_LAST };
int cuda_pool_enc(cuda_ctx *c, const float *x, const int32_t *seqs, int n_seqs, int dim, int mode,
                  int normalize, float *out, md_err *e);

/* ---- sampling ---------------------------------------------------------------------- */

typedef struct {
    float temperature;                     /* <= 0: greedy */
    int top_k;                             /* 0 = off */
    float top_p;                           /* >= 1 = off */
    float min_p;                           /* 0 = off */
    float u;                               /* uniform draw in [0, 1) from the caller's seeded RNG */
    float repetition, presence, frequency; /* penalties: 1, 0, 0 = off */
    int pen_off, pen_n;                    /* the row's entries in the call's pen */
    int n_top;                             /* top logprobs wanted, 0..CUDA_SAMPLE_TOP */
    /* the row's constraint (cuda_constrain): 1 + its row of the call's packed mask (0 = no
     * mask, so a zeroed struct is unconstrained) and its entries of the call's bias */
    int mask_row, bias_off, bias_n;
} cuda_sample_params;

/* A bias added to a token's logit (backend.h md_sample_bias). */
typedef struct {
    int32_t token;
    float bias;
} cuda_sample_bias;

#define CUDA_SAMPLE_TOP 20 /* backend.h MD_SAMPLE_TOP */

/* A distinct token of the row's sequence and its output count (backend.h md_sample_pen). */
typedef struct {
    int32_t token, n_out;
} cuda_sample_pen;

/* Greedy: out[r] = argmax logits[r][:] (lowest index on ties). */
int cuda_argmax(cuda_ctx *c, const float *logits, int rows, int vocab, int32_t *out, md_err *e);
/* One token per row under params[r] (device array): the row's penalty entries pen[pen_off ..
 * pen_off + pen_n) applied to it in place (repetition, then presence + frequency * n_out
 * where n_out > 0; their raw logits saved in pen_raw, as many floats as pen holds entries),
 * then greedy at temperature <= 0, else the temperature softmax, top-k, top-p and min-p as
 * thresholds on the probabilities and the inverse-CDF draw at u over the kept tokens in
 * index order; -1 for a row holding a NaN or no finite logit. logprob[r] (may be NULL) = the
 * chosen token's log-softmax under the raw row. top_tok, top_lp [rows, CUDA_SAMPLE_TOP] (may
 * be NULL) = the params[r].n_top most likely tokens of the raw row with their logprobs, -1 /
 * 0 past the last. engine/sampler.h smp_sample_row and smp_top_logprobs are the
 * reference. */
int cuda_sample(cuda_ctx *c, float *logits, int rows, int vocab, const cuda_sample_params *params,
                const cuda_sample_pen *pen, float *pen_raw, int32_t *out, float *logprob,
                int32_t *top_tok, float *top_lp, md_err *e);

/* Constrain rows in place before cuda_sample (structured outputs, backend.h md_sample_params):
 * row r's bias entries bias[bias_off .. bias_off + bias_n) added in order (tokens outside
 * [0, vocab) skipped), then, when params[r].mask_row > 0, every token whose bit is clear in
 * mask row mask_row - 1 ([rows of the call, (vocab + 31) / 32] words, bit t % 32 of word t /
 * 32) set to -inf — engine/sampler.h smp_constrain's arithmetic. mask and bias are device
 * arrays (either NULL when no row uses it). */
int cuda_constrain(cuda_ctx *c, float *logits, int rows, int vocab,
                   const cuda_sample_params *params, const uint32_t *mask,
                   const cuda_sample_bias *bias, md_err *e);

/* ---- CUDA graphs ------------------------------------------------------------------ */

typedef struct cuda_graph cuda_graph;
/* Everything enqueued on the ctx stream between begin and end is recorded, not run. A
 * failure inside the capture is the capture's, not the device's: cuda_graph_end then
 * returns CUDA_ECAPTURE (nothing recorded, the ctx still usable: run the work directly), or the
 * sticky error when the device itself failed. cuda_graph_abort drops a capture. */
#define CUDA_ECAPTURE (-100)
int cuda_graph_begin(cuda_ctx *c, md_err *e);
int cuda_graph_end(cuda_ctx *c, cuda_graph **out, md_err *e);
void cuda_graph_abort(cuda_ctx *c);
/* Counts moves of scratch buffers kernels read (graphs recorded before a move are stale);
 * cuda_ctx_scratch_moved is for scratch owned outside the ctx (the backend's attention work). */
unsigned cuda_ctx_scratch_gen(const cuda_ctx *c);
void cuda_ctx_scratch_moved(cuda_ctx *c);
int cuda_graph_launch(cuda_ctx *c, cuda_graph *g, md_err *e);
void cuda_graph_free(cuda_graph *g);

/* ---- collectives (nccl.c, built when CMake found NCCL: MEDLEY_HAVE_NCCL) ------------- */

/* backend.h's md_comm: an NCCL communicator on one ctx's device. Every call below but the
 * group pair takes the ctx the communicator was made on and queues on its stream; the
 * ranks' semantics and errors are backend.h's (comm_*, all_reduce, send, recv). */
typedef struct md_comm md_comm;
#define CUDA_COMM_ID_BYTES 128
int cuda_comm_unique_id(uint8_t id[CUDA_COMM_ID_BYTES], md_err *e);
int cuda_comm_init(cuda_ctx *c, const uint8_t id[CUDA_COMM_ID_BYTES], int rank, int n,
                   md_comm **out, md_err *e);
/* Waits for c's queued work first; a communicator that failed is aborted (its kernels stop
 * waiting for peers) before that wait, a sound one destroyed after it. */
void cuda_comm_free(cuda_ctx *c, md_comm *m);
/* x [n] f32 device memory, summed over the ranks in place. */
int cuda_comm_all_reduce(cuda_ctx *c, md_comm *m, float *x, int64_t n, md_err *e);
int cuda_comm_send(cuda_ctx *c, md_comm *m, const void *p, size_t bytes, int peer, md_err *e);
int cuda_comm_recv(cuda_ctx *c, md_comm *m, void *p, size_t bytes, int peer, md_err *e);
int cuda_comm_group_start(md_err *e);
int cuda_comm_group_end(md_err *e);

#ifdef __cplusplus
}
#endif

#endif
