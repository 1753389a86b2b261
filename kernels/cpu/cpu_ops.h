/* cpu_ops.h — the CPU backend's math: a thread pool, quantized matrix products with SIMD
 * runtime dispatch (AVX-512 VNNI, AVX2, portable scalar), and the vector ops of a
 * llama-family forward pass.
 *
 * Weight types are common/dtype.h's md_type (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K:
 * md_type_supported; and Q5_0: cpu_weight_type). Weights stay in their GGUF block layout (they
 * may point into a read-only mmap); nothing here writes to them or keeps a pointer to them.
 *
 * Hot-path contract: cpu_matmul and the vector ops never allocate, lock or log. The
 * caller allocates cpu_matmul's scratch once (cpu_matmul_scratch_size) and owns it.
 * The pool is the only object here that owns resources (its threads): create once,
 * destroy once. */
#ifndef MEDLEY_KERNELS_CPU_OPS_H
#define MEDLEY_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"

/* ---- thread pool ---- */
typedef struct cpu_pool cpu_pool;
/* n_threads: 0 = number of online cores. Workers spin briefly after each job, then sleep
 * on a futex. Returns NULL on failure (out of memory / threads). */
cpu_pool *cpu_pool_create(int n_threads);
void cpu_pool_destroy(cpu_pool *p); /* NULL is a no-op */
int cpu_pool_size(const cpu_pool *p);
/* Run fn(ctx, ith, nth) for ith = 0..nth-1 (nth = cpu_pool_size), each index exactly once,
 * in parallel over the pool's threads and the caller; returns when all are done. An index
 * is not tied to a thread: the caller runs the tasks of workers that have not started yet
 * (so a descheduled thread does not stall the job), but no two tasks of one job share an
 * index, so per-ith scratch is safe. p may be NULL: then fn(ctx, 0, 1) runs on the caller.
 * Not reentrant: one cpu_pool_run at a time per pool; fn must not call it on the same pool. */
void cpu_pool_run(cpu_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* ---- SIMD dispatch ---- */
enum { CPU_SIMD_SCALAR = 0, CPU_SIMD_AVX2 = 1, CPU_SIMD_AVX512VNNI = 2 };
/* Name of the level in use: "avx512vnni", "avx2" or "scalar". */
const char *cpu_simd_name(void);
/* The level in use: the best this CPU supports, or lower where the environment variable
 * MEDLEY_SIMD names one (scalar, avx2, avx512vnni), read once at load. */
int cpu_simd_level(void);
/* Best level this CPU supports (AVX2 needs avx2+fma+f16c; AVX512VNNI needs
 * avx512f/bw/vl/vnni). */
int cpu_simd_detect(void);
/* Force a level (tests, benchmarks). Returns 0, or -1 (and changes nothing) when the CPU
 * lacks it. Not thread-safe against running kernels: call between matmuls. */
int cpu_simd_set(int level);

/* AMX (matmul_amx.c): products over repacked Q4_0/Q4_1/Q5_0/Q8_0 weights with at least 16
 * activation rows run on AMX int8 tiles where the CPU has AMX-INT8 and Linux grants the tile
 * state (asked once per process); the results are the AVX-512 packed kernels' bits.
 * cpu_amx_detect: 1 when both hold. cpu_amx_use: 1 when the kernels are in use: detected, the
 * SIMD level in use is AVX-512 VNNI (MEDLEY_SIMD=avx2 or scalar, or cpu_simd_set lower, turn
 * AMX off) and neither MEDLEY_AMX=0 (read once) nor cpu_amx_set(0) switched it off.
 * cpu_amx_set: 0, or -1 (nothing changed) when asked on where cpu_amx_detect is 0. Like
 * cpu_simd_set, call between matmuls (tests, benchmarks). */
int cpu_amx_detect(void);
int cpu_amx_use(void);
int cpu_amx_set(int on);

/* ---- matrix products ---- */
/* 1 when cpu_matmul multiplies weights of type t: those of md_type_supported and Q5_0 (which
 * other backends get recoded as Q8_0, engine/model/model.c); else 0. */
int cpu_weight_type(int t);
/* 0 when cpu_matmul can take (wtype, cols): a type of cpu_weight_type, cols > 0 and a
 * multiple of the block size; else -1. Check once at model load; cpu_matmul itself does not
 * check. */
int cpu_matmul_check(int wtype, int cols);

/* y[n][rows] = x[n][cols] · W^T: W is `rows` rows of `cols` elements of type wtype (row r
 * starts at (char*)W + r*md_type_row_bytes(wtype, cols)); x and y are row-major float, y must
 * not alias x. Quantized weights take activations quantized per block into scratch
 * (int8 blocks of 32 with a float scale for Q4_0/Q4_1/Q5_0/Q8_0, blocks of 256 with 16-element
 * sums for Q4_K/Q6_K), then integer dot products. scratch holds
 * cpu_matmul_scratch_size(wtype, cols, n) bytes, 64-byte aligned (may be 0 bytes: then
 * NULL is fine). Threads of p split the rows (p may be NULL). */
size_t cpu_matmul_scratch_size(int wtype, int cols, int n);
void cpu_matmul(cpu_pool *p, int wtype, const void *W, int rows, int cols, const float *x, int n,
                float *y, void *scratch);
/* Products of one x with several weights, for fused Q/K/V, gate/up and residual adds: one
 * activation quantization and one pool job for all of them. Each weight is rows x cols of
 * wtype with its own output y [n][rows] (no aliasing with x or each other). mode:
 *   CPU_MM_SET     y = x · W^T (as cpu_matmul, bit for bit)
 *   CPU_MM_ACC     y += x · W^T (bit for bit cpu_matmul then cpu_add)
 *   CPU_MM_SWIGLU  n_w == 2 of equal rows: w[0].y = silu(x · W0^T) * (x · W1^T) through
 *                  cpu_swiglu; w[1].y receives x · W1^T (scratch).
 * Weights of different activation classes (float / 32-block / K types) run one after the
 * other, sharing scratch. Bad arguments (n_w outside 1..CPU_MM_MAX, unsupported types)
 * are a no-op: the backend checks them. */
enum { CPU_MM_SET = 0, CPU_MM_ACC = 1, CPU_MM_SWIGLU = 2 };
#define CPU_MM_MAX 4
typedef struct {
    int wtype;
    const void *W;
    int rows;
    float *y;
} cpu_mm_seg;
void cpu_matmul_n(cpu_pool *p, const cpu_mm_seg *w, int n_w, int cols, const float *x, int n,
                  int mode, void *scratch);
/* ---- repacked weights (repack.c, repack_k.c; docs/kernels.md "Repacked weights") ----
 * Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K weights copied into groups of CPU_PACK_ROWS rows whose
 * blocks are interleaved, so one 4-byte activation broadcast feeds 16 rows in one dpbusd. A packed
 * weight goes to cpu_matmul / cpu_matmul_n as wtype CPU_PACKED(t) with W the packed copy;
 * every SIMD level multiplies it (the scalar packed kernel where a level has none), and its
 * results do not depend on n, the tiles or the threads, like the plain layout's. */
#define CPU_PACK_ROWS 16
#define CPU_PACKED(t) (0x100 | (t))
/* 1 when type t has a packed layout (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K); else 0. */
int cpu_pack_type(int t);
/* 1 when the SIMD level in use has packed kernels for t that beat the plain layout's (AVX2
 * and AVX-512 VNNI), so a backend should repack t's weights at load; else 0. */
int cpu_pack_wanted(int t);
/* Bytes of the packed copy of rows x cols of t (rows padded to CPU_PACK_ROWS); 0 when t has
 * no packed layout or the shape is not one cpu_matmul_check accepts. */
size_t cpu_pack_size(int t, int rows, int cols);
/* Write the packed copy of W (rows x cols of t, GGUF layout) into dst (cpu_pack_size bytes,
 * 64-byte aligned). Returns 0, or -1 (dst untouched) for a type or shape without a layout. */
int cpu_pack(int t, const void *W, int rows, int cols, void *dst);
/* The same for the groups [g0, g1) of CPU_PACK_ROWS rows only (dst: the whole packed copy),
 * so a large weight can be packed, and its source released, a part at a time. */
int cpu_pack_groups(int t, const void *W, int rows, int cols, int g0, int g1, void *dst);
/* Row r of a packed weight dequantized into out[cols] (the values cpu_dequant_row gives for
 * the GGUF row it was packed from). */
void cpu_packed_dequant_row(int t, const void *Wp, int rows, int cols, int r, float *out);

/* Scalar reference: dequantize each row, dot with unquantized x in double; for tests and
 * benchmarks (slow; allocates one row of floats). */
void cpu_matmul_ref(int wtype, const void *W, int rows, int cols, const float *x, int n, float *y);
/* The same product, its rows split over the pool's threads: each element bit-identical to
 * cpu_matmul_ref's (the cpu-exact backend's matmul). */
void cpu_matmul_ref_mt(cpu_pool *p, int wtype, const void *W, int rows, int cols, const float *x,
                       int n, float *y);
/* Dequantize one row of `cols` elements (embedding lookup). */
void cpu_dequant_row(int wtype, const void *row, float *out, int cols);

/* ---- vector ops (SIMD, single-threaded; the caller parallelises over rows/tokens) ---- */
/* out = x / sqrt(mean(x^2) + eps) * w; out may alias x. */
void cpu_rmsnorm(float *out, const float *x, const float *w, int n, float eps);
/* out = silu(gate) * up, silu(g) = g / (1 + e^-g); out may alias gate or up. */
void cpu_swiglu(float *out, const float *gate, const float *up, int n);
/* out = gelu(gate) * up with gelu's tanh form, 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
 * (GeGLU, Gemma's FFN); out may alias gate or up. */
void cpu_geglu(float *out, const float *gate, const float *up, int n);
void cpu_add(float *out, const float *a, const float *b, int n); /* may alias */
float cpu_dot_f32(const float *a, const float *b, int n);
void cpu_axpy(float *y, float a, const float *x, int n); /* y += a*x */
void cpu_scale(float *x, float a, int n);                /* x *= a */
void cpu_softmax(float *x, int n);                       /* in place, max-subtracted */
/* The lowest index of the largest of x[0..n-1]; -1 if any is NaN or n < 1 (greedy pick). */
int cpu_argmax_f32(const float *x, int n);
/* One query head's attention over its sequence's cached positions p0..npos-1 (p0 > 0: a
 * sliding window; the keys before p0 are masked out):
 *   out[hd] = Σ_p softmax_p(scale · q·k_p) · v_p
 * K and V rows live in a paged cache: position p is in slot
 * block_table[p / block_tokens] * block_tokens + p % block_tokens, and its row for this
 * head starts at k + slot*row_stride (resp. v + ...), in floats (so pass k already offset
 * by the KV head). scratch holds npos floats (the caller's, per thread); out is zero when
 * p0 >= npos. */
void cpu_attention_paged(float *out, const float *q, const float *k, const float *v,
                         size_t row_stride, const int32_t *block_table, int block_tokens, int p0,
                         int npos, int hd, float scale, float *scratch);

/* enc_ops.c — encoder models (BERT). out = (x - mean) / sqrt(var + eps) * w + b over n
 * elements (out may alias x). cpu_attention_seq: one head's attention over one sequence of n
 * rows, every query against every key (bidirectional): q, k, v and out already offset to the
 * head, rows row_stride floats apart; scratch holds cpu_attention_seq_scratch(n, hd) floats.
 * At the AVX-512 level (hd a multiple of 16) blocks of 8 queries share each key load. */
size_t cpu_attention_seq_scratch(int n, int hd);
void cpu_layernorm(float *out, const float *x, const float *w, const float *b, int n, float eps);
void cpu_attention_seq(float *out, const float *q, const float *k, const float *v,
                       size_t row_stride, int n, int hd, float scale, float *scratch);
/* enc_gemm.c — products of many tokens with one weight packed once (encoder steps; decoders'
 * BF16 weights, backend_cpu.c): y [T, N] = x [T, K] · Wᵀ + bias (bias may be NULL), then per
 * epi: CPU_LIN_SET stores it, CPU_LIN_GELU stores gelu_erf of it, CPU_LIN_ADD adds it to y.
 * W [N, K] of F32, F16 or BF16 rows. cpu_lin_pack copies W into the kernel's layout (the
 * caller may drop W afterwards; free with cpu_lin_free); NULL when the SIMD level in use is
 * below AVX-512, the type is another, CPU_LIN_BF16 is asked of a CPU without AVX512-BF16
 * (cpu_lin_bf16_ok), or memory is short: the caller then uses cpu_matmul. prec:
 *   CPU_LIN_F32    W as F32, x as given, F32 FMAs;
 *   CPU_LIN_BF16   W and x rounded to BF16, pairs multiplied by VDPBF16PS into F32 sums;
 *   CPU_LIN_WBF16  W rounded to (a BF16 weight: kept as) BF16, x as given, F32 FMAs: the same
 *                  sums as CPU_LIN_F32 over those weights, bit for bit, with half the bytes.
 * cpu_lin_run allocates nothing: scratch is cpu_lin_scratch_size(K, threads) bytes, the
 * caller's. Each output is the same sum whatever T or the thread split. cpu_lin_ref: the
 * scalar reference (double sums; the operands rounded as prec rounds them). */
enum { CPU_LIN_SET = 0, CPU_LIN_GELU = 1, CPU_LIN_ADD = 2 };
enum { CPU_LIN_F32 = 0, CPU_LIN_BF16 = 1, CPU_LIN_WBF16 = 2 };
typedef struct cpu_lin cpu_lin;
int cpu_lin_bf16_ok(void);
cpu_lin *cpu_lin_pack(int wtype, const void *W, int N, int K, int prec);
/* The same in steps (a decoder weight packed at load a part at a time, its source pages given
 * back as it goes): cpu_lin_alloc (NULL where cpu_lin_pack would give NULL; rows zero), then
 * cpu_lin_pack_rows for rows [r0, r1) of W (W: row 0; returns 0, or -1 for a bad range or
 * type, or no memory). cpu_lin_row: row r of the packed weight as floats (a BF16 or F32 weight's
 * own values exactly). Decoders: backend_cpu.c packs BF16 weights as CPU_LIN_WBF16 at the
 * AVX-512 level (docs/kernels.md "Packed float products"). */
cpu_lin *cpu_lin_alloc(int N, int K, int prec);
int cpu_lin_pack_rows(cpu_lin *l, int wtype, const void *W, int r0, int r1);
void cpu_lin_row(const cpu_lin *l, int r, float *out);
/* A packed copy of src's rows (their values, rounded to BF16 for the BF16 precisions) in
 * precision prec; NULL as cpu_lin_alloc. */
cpu_lin *cpu_lin_copy(const cpu_lin *src, int prec);
int cpu_lin_prec(const cpu_lin *l);
/* 1 where CPU_LIN_BF16's VDPBF16PS outruns CPU_LIN_WBF16's F32 FMAs (AMD Zen 4: twice the
 * multiply rate; Intel's AVX512-BF16 cores: half), so decoders' BF16 weights take it; else 0. */
int cpu_lin_bf16_fast(void);
/* 1 where CPU_LIN_BF16 products run on AMX-BF16 tiles (the CPU has AMX-BF16, Linux granted the
 * tile state, the level in use is AVX-512; K a multiple of 32): then cpu_lin_bf16_fast is 1. */
int cpu_lin_amx_ok(void);
void cpu_lin_free(cpu_lin *l);
size_t cpu_lin_scratch_size(int K, int n_threads);
void cpu_lin_run(cpu_pool *p, const cpu_lin *l, const float *bias, const float *x, int T, float *y,
                 int epi, void *scratch);
void cpu_lin_ref(int wtype, const void *W, int N, int K, const float *bias, const float *x, int T,
                 float *y, int epi, int prec);
/* vec.c: x = 0.5 x (1 + erf(x / sqrt 2)) in place; libm's erff in the scalar path, a
 * Chebyshev erfc (relative error < 1.2e-7) in the AVX2 one. */
void cpu_gelu_erf(float *x, int n);

/* kv_f16.c — rows of the F16 KV cache: float -> half with round-to-nearest-even (F16C where the
 * CPU has it, common/dtype.h's md_fp32_to_fp16 otherwise). */
void cpu_f32_to_f16_row(uint16_t *dst, const float *src, int n);

/* Most query heads of one KV head the attention kernels update together (their K/V loads
 * shared); a larger group runs in parts of this many. */
#define CPU_ATT_GROUP 4

/* attn_tiled.c — blocked (flash-style) attention over the F16 cache for nt query tokens of one
 * sequence and the G query heads that share one KV head: key tiles of
 * cpu_attention_key_tile(hd) positions aligned to multiples of it, each K/V row converted once
 * per call, an online softmax (no score row longer than a tile), vector exponentials.
 * Token i (its q row at q + i * q_stride, head g at + g * hd; out likewise at o_stride) at
 * position pos[i] attends to positions (pos[i] - window, pos[i]] (window 0: [0, pos[i]]);
 * positions need not be consecutive. k, v are already offset by the KV head (kv_stride halves
 * between slots). scratch holds cpu_attention_tiled_scratch(hd, nt * G) floats.
 * A row's result does not depend on nt or on the other rows of the call (same bits for a token
 * alone or in any tile): the engine's chunked prefill relies on it. Scalar, AVX2 (hd % 8 == 0)
 * and AVX-512 (hd % 16 == 0) versions; results differ between levels by rounding only. */
int cpu_attention_key_tile(int hd);
size_t cpu_attention_tiled_scratch(int hd, int rows);
void cpu_attention_tiled_f16(float *out, size_t o_stride, const float *q, size_t q_stride, int nt,
                             const int32_t *pos, int G, const uint16_t *k, const uint16_t *v,
                             size_t kv_stride, const int32_t *block_table, int block_tokens,
                             int window, int hd, float scale, float *scratch);
/* The reference: one query row (hd <= 1024), two passes in double precision over the F16 rows. */
void cpu_attention_ref_f16(float *out, const float *q, const uint16_t *k, const uint16_t *v,
                           size_t row_stride, const int32_t *block_table, int block_tokens,
                           int pos, int window, int hd, float scale);

#endif
