/* elementwise.cu — the small kernels of a llama-family layer: RMSNorm, RoPE, SwiGLU,
 * residual and bias adds, type conversion, embedding lookups and row gathers. Each is
 * bandwidth-bound; one block per row where a row reduction is needed, one thread per
 * element (or pair) elsewhere. */
#include "kernels/cuda/quant.cuh"

/* One block per row: sum of squares in FP32, then scale. */
__global__ void k_rmsnorm(const float *x, const float *w, float eps, int dim, void *out,
                          cuda_dtype ot) {
    __shared__ float sh[32];
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += xr[i] * xr[i];
    ss = cuda_block_sum(ss, sh);
    float inv = rsqrtf(ss / dim + eps);
    int64_t o = (int64_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        cuda_store(out, ot, o + i, xr[i] * inv * w[i]);
}

int cuda_rmsnorm(cuda_ctx *c, const float *x, const float *w, float eps, int rows, int dim,
                 void *out, cuda_dtype out_type, md_err *e) {
    CUDA_GUARD(c, e);
    if (rows < 0 || dim <= 0)
        return md_errf(e, MD_EINVAL, "CUDA rmsnorm: bad shape [%d, %d]", rows, dim);
    if (rows == 0)
        return 0;
    int threads = dim >= 4096 ? 1024 : dim >= 1024 ? 512 : 256;
    k_rmsnorm<<<rows, threads, 0, c->stream>>>(x, w, eps, dim, out, out_type);
    return CUDA_LAUNCHED(c, "rmsnorm", e);
}

/* One thread per rotated pair. */
__global__ void k_rope(float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
                       int rot_dim, const float *inv_freq, int neox) {
    int half = rot_dim / 2;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n_tokens * n_heads * half)
        return;
    int p = (int)(i % half);
    int64_t th = i / half; /* token * n_heads + head */
    int t = (int)(th / n_heads);
    float *h = x + th * head_dim;
    int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    cuda_rope_pair(h[a], h[b], pos[t], inv_freq[p], &h[a], &h[b]);
}

int cuda_rope(cuda_ctx *c, float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
              int rot_dim, const float *inv_freq, int neox, md_err *e) {
    CUDA_GUARD(c, e);
    if (n_tokens < 0 || n_heads <= 0 || rot_dim <= 0 || rot_dim % 2 || rot_dim > head_dim)
        return md_errf(e, MD_EINVAL, "CUDA rope: bad shape (heads %d, head_dim %d, rot_dims %d)",
                       n_heads, head_dim, rot_dim);
    int64_t n = (int64_t)n_tokens * n_heads * (rot_dim / 2);
    if (n == 0)
        return 0;
    k_rope<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(x, pos, n_tokens, n_heads, head_dim, rot_dim,
                                                       inv_freq, neox);
    return CUDA_LAUNCHED(c, "rope", e);
}

__global__ void k_swiglu(const float *gate, const float *up, void *out, cuda_dtype ot, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float g = gate[i];
    cuda_store(out, ot, i, g / (1.0f + __expf(-g)) * up[i]);
}

int cuda_swiglu(cuda_ctx *c, const float *gate, const float *up, void *out, cuda_dtype out_type,
                int64_t n, md_err *e) {
    CUDA_GUARD(c, e);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA swiglu: negative size");
    k_swiglu<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(gate, up, out, out_type, n);
    return CUDA_LAUNCHED(c, "swiglu", e);
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

int cuda_add(cuda_ctx *c, float *y, const float *x, int64_t n, md_err *e) {
    CUDA_GUARD(c, e);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA add: negative size");
    k_add<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(y, x, n);
    return CUDA_LAUNCHED(c, "add", e);
}

__global__ void k_add_bias(float *y, const float *bias, int64_t n, int cols) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += bias[i % cols];
}

int cuda_add_bias(cuda_ctx *c, float *y, const float *bias, int rows, int cols, md_err *e) {
    CUDA_GUARD(c, e);
    int64_t n = (int64_t)rows * cols;
    if (rows < 0 || cols <= 0)
        return md_errf(e, MD_EINVAL, "CUDA add_bias: bad shape [%d, %d]", rows, cols);
    if (n == 0)
        return 0;
    k_add_bias<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(y, bias, n, cols);
    return CUDA_LAUNCHED(c, "add_bias", e);
}

__global__ void k_convert(const float *x, void *dst, cuda_dtype ot, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        cuda_store(dst, ot, i, x[i]);
}

int cuda_convert(cuda_ctx *c, const float *x, void *dst, cuda_dtype out_type, int64_t n,
                 md_err *e) {
    CUDA_GUARD(c, e);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA convert: negative size");
    k_convert<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(x, dst, out_type, n);
    return CUDA_LAUNCHED(c, "convert", e);
}

/* One thread per (token, 32-element group). */
template <int T>
__global__ void k_get_rows(const uint8_t *table, size_t row_bytes, int64_t n_rows, int dim,
                           const int32_t *ids, int n, float *out, int *bad) {
    int groups = dim / 32;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * groups)
        return;
    int t = (int)(i / groups), g = (int)(i % groups);
    int32_t id = ids[t];
    float *o = out + (int64_t)t * dim + g * 32;
    if (id < 0 || id >= n_rows) {
        for (int j = 0; j < 32; j++)
            o[j] = 0.0f;
        if (bad)
            *bad = 1;
        return;
    }
    float v[32];
    dq32<T>(table + (size_t)id * row_bytes, g, v);
    for (int j = 0; j < 32; j++)
        o[j] = v[j];
}

int cuda_get_rows(cuda_ctx *c, const void *table, int gtype, int64_t n_rows, int dim,
                  const int32_t *ids, int n, float *out, int *bad_id, md_err *e) {
    CUDA_GUARD(c, e);
    int b = qt_block_elems(gtype);
    if (b == 0)
        return md_errf(e, MD_EUNSUPP, "CUDA get_rows: ggml type %d is not supported", gtype);
    if (dim <= 0 || dim % b || dim % 32)
        return md_errf(e, MD_EINVAL, "CUDA get_rows: row length %d is not a multiple of %d", dim,
                       b > 32 ? b : 32);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA get_rows: negative count");
    int64_t work = (int64_t)n * (dim / 32);
    size_t rb = md_type_row_bytes(gtype, dim);
    const uint8_t *tb = (const uint8_t *)table;
    QT_DISPATCH(gtype, k_get_rows<QT><<<cuda_blocks(work, 128), 128, 0, c->stream>>>(
                           tb, rb, n_rows, dim, ids, n, out, bad_id));
    return CUDA_LAUNCHED(c, "get_rows", e);
}

__global__ void k_gather(const float *x, const int32_t *rows, int cols, float *out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    int64_t r = i / cols;
    out[i] = x[(int64_t)rows[r] * cols + i % cols];
}

int cuda_gather_rows(cuda_ctx *c, const float *x, const int32_t *rows, int n_rows, int cols,
                     float *out, md_err *e) {
    CUDA_GUARD(c, e);
    int64_t n = (int64_t)n_rows * cols;
    if (n_rows < 0 || cols <= 0)
        return md_errf(e, MD_EINVAL, "CUDA gather_rows: bad shape");
    if (n == 0)
        return 0;
    k_gather<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(x, rows, cols, out, n);
    return CUDA_LAUNCHED(c, "gather_rows", e);
}

__global__ void k_fill_random(void *dst, cuda_dtype t, int64_t n, float scale, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)i * 0x9E3779B97F4A7C15ull; /* splitmix64 */
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        cuda_store(dst, t, i, (2.0f * u - 1.0f) * scale);
    }
}

int cuda_fill_random(cuda_ctx *c, void *dst, cuda_dtype dtype, int64_t n, float scale,
                     uint64_t seed, md_err *e) {
    CUDA_GUARD(c, e);
    if (n <= 0)
        return n == 0 ? 0 : md_errf(e, MD_EINVAL, "CUDA fill_random: negative size");
    int64_t blocks = (n + 255) / 256;
    k_fill_random<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, c->stream>>>(dst, dtype, n,
                                                                                      scale, seed);
    return CUDA_LAUNCHED(c, "fill_random", e);
}
