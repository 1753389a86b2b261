/* gemm.cu — y[m][n] = x[m][k] . W[n][k]^T with FP32 accumulation, for every weight type, one
 * weight at a time (cuda_matmul) or several sharing x (cuda_matmul_n: Q/K/V, gate/up with
 * SwiGLU, a product added into the residual stream).
 *
 * Decode (m <= CUDA_GEMV_MAX_M) is bound by reading the weights once, so it runs on own
 * GEMV kernels: one warp per output row, all m tokens at once; BF16/F16 weights are read
 * with 16-byte vector loads, quantized weights are decoded in registers (weight-only
 * kernels, so a quantized model stays quantized in device memory). Several weights of one
 * type are one launch over their concatenated rows (a warp finds its weight in a segment
 * table passed by value); the residual add is the epilogue's beta, and gate/up rows are
 * computed by the same warp, which writes silu(gate) * up. Prefill and large batches use
 * cuBLAS GemmEx: x is converted to the weight's 16-bit type (once per type for several
 * weights), a quantized weight is multiplied by its BF16 copy when the caller keeps one
 * (cuda_mm_w.bf16, backend.h weight_shadow) and otherwise first expanded to BF16 in scratch,
 * and the product accumulates in FP32.
 *
 * Kernels are launched through GEMV_LAUNCH and cuBLAS is called only from blas_gemm, so the
 * host code around them also runs on the CPU emulator (tests/gpu/emu), which supplies both. */
#include <limits.h>
#include <stdint.h>

#include "kernels/cuda/quant.cuh"

#define GEMV_WARPS 4
#define GEMV_LAUNCH(kernel, grid, stream, ...)                                                     \
    kernel<<<(grid), GEMV_WARPS * 32, 0, (stream)>>>(__VA_ARGS__)

/* This lane's share of the dot products of one weight row wr (k elements of type T) with
 * the m rows of x, added to acc[t]. v16 (F16/BF16 only): 8 elements per 16-byte load, wr
 * and x 16-byte aligned and k % 8 == 0; otherwise 32-element groups decoded by dq32. */
template <int T>
__device__ __forceinline__ void gemv_row(const uint8_t *__restrict__ wr,
                                         const float *__restrict__ x, int m, int k, int v16,
                                         int lane, float *acc) {
    if constexpr (T == QT_BF16 || T == QT_F16) {
        if (v16) {
            const uint4 *w4 = (const uint4 *)wr;
#pragma unroll 4
            for (int i = lane; i < k / 8; i += 32) {
                uint4 pk = __ldg(w4 + i);
                const uint16_t *h = (const uint16_t *)&pk;
                float wf[8];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    wf[j] = T == QT_BF16 ? cuda_bf16_to_f(h[j]) : cuda_f16_to_f(h[j]);
#pragma unroll
                for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
                    if (t >= m)
                        break;
                    const float4 *xr = (const float4 *)(x + (int64_t)t * k + 8 * i);
                    float4 a = __ldg(xr), b = __ldg(xr + 1);
                    acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x +
                              wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                }
            }
            return;
        }
    }
    for (int g = lane; g < k / 32; g += 32) {
        float wf[32];
        dq32<T>(wr, g, wf);
#pragma unroll
        for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
            if (t >= m)
                break;
            const float *xr = x + (int64_t)t * k + 32 * g;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++)
                s += wf[j] * __ldg(xr + j);
            acc[t] += s;
        }
    }
}

/* The weights of one GEMV launch: segment s < n_seg holds rows [end[s-1], end[s]) of the
 * concatenation (end[-1] = 0; end[s] of unused segments = the total), its own weight w[s] (rows of
 * the launch's row_bytes) and output y[s] [m][end[s] - end[s-1]]; v16[s]: its rows take 16-byte
 * loads (decided per weight, so a row's sum is the one cuda_matmul of that weight alone computes).
 */
typedef struct {
    const uint8_t *w[CUDA_MM_MAX];
    float *y[CUDA_MM_MAX];
    int end[CUDA_MM_MAX];
    int v16[CUDA_MM_MAX];
    int n_seg;
} gemv_segs;

/* y[s] = x . w[s]^T + beta * y[s] for every segment; one warp per row of the concatenation. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_n(gemv_segs sg, size_t row_bytes, const float *__restrict__ x, int m, int k,
             float beta) {
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= sg.end[CUDA_MM_MAX - 1])
        return;
    /* constant indices only, so the table stays in parameter space (no local copy) */
    const uint8_t *w = sg.w[0];
    float *y = sg.y[0];
    int r0 = 0, n = sg.end[0], v16 = sg.v16[0];
#pragma unroll
    for (int s = 1; s < CUDA_MM_MAX; s++)
        if (s < sg.n_seg && row >= sg.end[s - 1]) {
            w = sg.w[s];
            y = sg.y[s];
            r0 = sg.end[s - 1];
            n = sg.end[s] - r0;
            v16 = sg.v16[s];
        }
    row -= r0;
    float acc[CUDA_GEMV_MAX_M];
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++)
        acc[t] = 0.0f;
    gemv_row<T>(w + (size_t)row * row_bytes, x, m, k, v16, lane, acc);
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
        if (t >= m)
            break;
        float s = cuda_warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (int64_t)t * n + row;
            *o = beta == 0.0f ? s : s + beta * *o;
        }
    }
}

/* y[m][n] = silu(x . wg^T) * (x . wu^T): the warp of row r computes gate row r and up row r
 * exactly as k_gemv_n would, and applies k_swiglu's formula (elementwise.cu), so the result
 * equals the unfused GEMVs + swiglu. */
template <int T>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv_swiglu(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu, size_t row_bytes,
                  const float *__restrict__ x, float *__restrict__ y, int m, int n, int k,
                  int v16_g, int v16_u) {
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n)
        return;
    float ag[CUDA_GEMV_MAX_M], au[CUDA_GEMV_MAX_M];
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++)
        ag[t] = au[t] = 0.0f;
    gemv_row<T>(wg + (size_t)row * row_bytes, x, m, k, v16_g, lane, ag);
    gemv_row<T>(wu + (size_t)row * row_bytes, x, m, k, v16_u, lane, au);
#pragma unroll
    for (int t = 0; t < CUDA_GEMV_MAX_M; t++) {
        if (t >= m)
            break;
        float g = cuda_warp_sum(ag[t]), u = cuda_warp_sum(au[t]);
        if (lane == 0)
            y[(int64_t)t * n + row] = g / (1.0f + __expf(-g)) * u;
    }
}

/* y[m][n] = x . w^T + beta * y on cuBLAS: w [n][k] and x [m][k] both of dtype t (F32:
 * SGEMM; F16/BF16: GemmEx), FP32 accumulation and output. Declared apart from its
 * definition because the emulator drops the definition and supplies its own. */
static int blas_gemm(cuda_ctx *c, const void *w, cuda_dtype t, const void *x, float *y, int m,
                     int n, int k, float beta, md_err *e);
static int blas_gemm(cuda_ctx *c, const void *w, cuda_dtype t, const void *x, float *y, int m,
                     int n, int k, float beta, md_err *e) {
    const float alpha = 1.0f;
    cublasStatus_t st;
    /* Column-major view: Y^T (n x m) = W (k x n)^T . X^T (k x m). */
    if (t == CUDA_F32) {
        st = cublasSgemm(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, (const float *)w, k,
                         (const float *)x, k, &beta, y, n);
        if (st != CUBLAS_STATUS_SUCCESS)
            return cuda_fail_blas(c, st, "Sgemm", e);
        return CUDA_LAUNCHED(c, "Sgemm", e);
    }
    cudaDataType dt = t == CUDA_F16 ? CUDA_R_16F : CUDA_R_16BF;
    st = cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, dt, k, x, dt, k,
                      &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return cuda_fail_blas(c, st, "GemmEx", e);
    return CUDA_LAUNCHED(c, "GemmEx", e);
}

/* Every weight's type, shape and row size, before anything is launched. */
static int mm_check(const cuda_mm_w *w, int n_w, int m, int k, int mode, md_err *e) {
    if (n_w < 1 || n_w > CUDA_MM_MAX)
        return md_errf(e, MD_EINVAL, "CUDA matmul: %d weights in one call (1 to %d)", n_w,
                       CUDA_MM_MAX);
    if (mode != CUDA_MM_SET && mode != CUDA_MM_ACC && mode != CUDA_MM_SWIGLU)
        return md_errf(e, MD_EINVAL, "CUDA matmul: unknown mode %d", mode);
    if (mode == CUDA_MM_SWIGLU && (n_w != 2 || w[0].n != w[1].n))
        return md_errf(e, MD_EINVAL,
                       "CUDA matmul: SwiGLU takes a gate and an up weight of one shape (got %d "
                       "weights)",
                       n_w);
    int64_t rows = 0;
    for (int i = 0; i < n_w; i++) {
        int b = qt_block_elems(w[i].wtype);
        if (b == 0)
            return md_errf(e, MD_EUNSUPP,
                           "CUDA matmul: weight type %d is not supported (F32, F16, "
                           "BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K are)",
                           w[i].wtype);
        if (m < 0 || w[i].n <= 0 || k <= 0 || k % b)
            return md_errf(e, MD_EINVAL,
                           "CUDA matmul: bad shape m %d, n %d, k %d (k must be a "
                           "multiple of %d)",
                           m, w[i].n, k, b);
        if (w[i].row_bytes != qt_row_bytes(w[i].wtype, k))
            return md_errf(e, MD_EINVAL,
                           "CUDA matmul: rows of %zu bytes, expected %zu for %d "
                           "elements of type %d",
                           w[i].row_bytes, qt_row_bytes(w[i].wtype, k), k, w[i].wtype);
        rows += w[i].n;
    }
    if (rows > INT_MAX)
        return md_errf(e, MD_EINVAL, "CUDA matmul: %lld output rows in one call", (long long)rows);
    return 0;
}

/* Whether weight w's rows take 16-byte loads with this x. */
static int gemv_v16(const cuda_mm_w *w, const float *x, int k) {
    return (w->wtype == QT_F16 || w->wtype == QT_BF16) && k % 8 == 0 && ((uintptr_t)x % 16) == 0 &&
           ((uintptr_t)w->w % 16) == 0;
}

/* The weights of w[first..n_w) of w[first]'s type not yet launched (taken[i] == 0), in
 * order, marked taken. */
static void gemv_group(const cuda_mm_w *w, int n_w, int first, const float *x, int k, int *taken,
                       gemv_segs *sg) {
    int t = w[first].wtype, rows = 0;
    sg->n_seg = 0;
    for (int i = first; i < n_w; i++) {
        if (taken[i] || w[i].wtype != t)
            continue;
        taken[i] = 1;
        rows += w[i].n;
        sg->w[sg->n_seg] = (const uint8_t *)w[i].w;
        sg->y[sg->n_seg] = w[i].y;
        sg->v16[sg->n_seg] = gemv_v16(&w[i], x, k);
        sg->end[sg->n_seg++] = rows;
    }
    for (int s = sg->n_seg; s < CUDA_MM_MAX; s++)
        sg->end[s] = rows;
}

/* GEMV path: one launch per weight type (one in all for weights of one type), SwiGLU in the
 * epilogue when gate and up share a type (else their two GEMVs and the swiglu kernel). */
static int mm_gemv(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k,
                   float beta, int swiglu, md_err *e) {
    if (swiglu && w[0].wtype == w[1].wtype) {
        int vg = gemv_v16(&w[0], x, k), vu = gemv_v16(&w[1], x, k);
        const uint8_t *wg = (const uint8_t *)w[0].w, *wu = (const uint8_t *)w[1].w;
        size_t rb = w[0].row_bytes;
        int n = w[0].n;
        float *y = w[0].y;
        QT_DISPATCH(w[0].wtype, GEMV_LAUNCH(k_gemv_swiglu<QT>, cuda_blocks(n, GEMV_WARPS),
                                            c->stream, wg, wu, rb, x, y, m, n, k, vg, vu));
        return CUDA_LAUNCHED(c, "gemv_swiglu", e);
    }
    int taken[CUDA_MM_MAX] = {0};
    for (int i = 0; i < n_w; i++) {
        if (taken[i])
            continue;
        gemv_segs sg;
        gemv_group(w, swiglu ? i + 1 : n_w, i, x, k, taken, &sg);
        size_t rb = w[i].row_bytes;
        float b = swiglu ? 0.0f : beta;
        QT_DISPATCH(w[i].wtype,
                    GEMV_LAUNCH(k_gemv_n<QT>, cuda_blocks(sg.end[CUDA_MM_MAX - 1], GEMV_WARPS),
                                c->stream, sg, rb, x, m, k, b));
        int rc = CUDA_LAUNCHED(c, "gemv", e);
        if (rc)
            return rc;
    }
    if (swiglu)
        return cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e);
    return 0;
}

/* cuBLAS path: x converted to BF16 once for all weights but F16 ones, to F16 once for
 * those; quantized weights read from their BF16 copy when they have one, else expanded to
 * BF16 scratch one after another (stream order keeps each GEMM's scratch until it is done);
 * F32 weights on SGEMM. SwiGLU: gate into y[0], up
 * into y[1], then the swiglu kernel, as the unfused ops. */
static int mm_blas(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k,
                   float beta, int swiglu, md_err *e) {
    float b = swiglu ? 0.0f : beta;
    int64_t wrows = 0; /* largest weight to expand */
    for (int i = 0; i < n_w; i++)
        if (w[i].wtype != QT_F32 && w[i].wtype != QT_F16 && w[i].wtype != QT_BF16 && !w[i].bf16 &&
            w[i].n > wrows)
            wrows = w[i].n;
    void *ws = NULL;
    int rc = 0;
    if (wrows && (rc = cuda_scratch(c, CUDA_SCRATCH_W, (size_t)wrows * k * 2, &ws, e)))
        return rc;
    for (int i = 0; i < n_w; i++)
        if (w[i].wtype == QT_F32 &&
            (rc = blas_gemm(c, w[i].w, CUDA_F32, x, w[i].y, m, w[i].n, k, b, e)))
            return rc;
    for (int pass = 0; pass < 2; pass++) {
        cuda_dtype xt = pass == 0 ? CUDA_BF16 : CUDA_F16;
        void *xs = NULL;
        for (int i = 0; i < n_w; i++) {
            if (w[i].wtype == QT_F32 || (w[i].wtype == QT_F16) != (xt == CUDA_F16))
                continue;
            if (!xs && ((rc = cuda_scratch(c, CUDA_SCRATCH_X, (size_t)m * k * 2, &xs, e)) ||
                        (rc = cuda_convert(c, x, xs, xt, (int64_t)m * k, e))))
                return rc;
            const void *wm = w[i].w;
            if (w[i].wtype != QT_F16 && w[i].wtype != QT_BF16) {
                if (w[i].bf16)
                    wm = w[i].bf16;
                else if ((rc = cuda_dequantize(c, w[i].wtype, w[i].w, ws, CUDA_BF16,
                                               (int64_t)w[i].n * k, e)))
                    return rc;
                else
                    wm = ws;
            }
            if ((rc = blas_gemm(c, wm, xt, xs, w[i].y, m, w[i].n, k, b, e)))
                return rc;
        }
    }
    if (swiglu)
        return cuda_swiglu(c, w[0].y, w[1].y, w[0].y, CUDA_F32, (int64_t)m * w[0].n, e);
    return 0;
}

/* Arguments checked; the ctx's device current. */
static int mm_run(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k, int mode,
                  float beta, int force_cublas, md_err *e) {
    int rc = mm_check(w, n_w, m, k, mode, e);
    if (rc || m == 0)
        return rc;
    int swiglu = mode == CUDA_MM_SWIGLU;
    if (m <= CUDA_GEMV_MAX_M && !force_cublas)
        return mm_gemv(c, w, n_w, x, m, k, beta, swiglu, e);
    return mm_blas(c, w, n_w, x, m, k, beta, swiglu, e);
}

int cuda_matmul(cuda_ctx *c, const void *w, int wtype, size_t row_bytes, const float *x, float *y,
                int m, int n, int k, float beta, int force_cublas, md_err *e) {
    CUDA_GUARD(c, e);
    cuda_mm_w one = {w, wtype, row_bytes, n, y, NULL};
    return mm_run(c, &one, 1, x, m, k, CUDA_MM_SET, beta, force_cublas, e);
}

int cuda_matmul_n(cuda_ctx *c, const cuda_mm_w *w, int n_w, const float *x, int m, int k, int mode,
                  int force_cublas, md_err *e) {
    CUDA_GUARD(c, e);
    return mm_run(c, w, n_w, x, m, k, mode, mode == CUDA_MM_ACC ? 1.0f : 0.0f, force_cublas, e);
}
