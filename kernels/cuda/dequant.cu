/* dequant.cu — GGUF weight formats to f32/f16/bf16 on the device (the raw blocks are
 * uploaded once and expanded on the GPU). One thread expands one 32-element group with
 * the same dq32 decoders the weight-only GEMV and embedding lookups use. */
#include "kernels/cuda/quant.cuh"

size_t cuda_ggml_bytes(int gtype, int64_t n) {
    int b = qt_block_elems(gtype);
    if (b == 0 || n < 0 || n % b)
        return 0;
    return md_type_row_bytes(gtype, n);
}

template <int T>
__global__ void k_dequant(const uint8_t *src, void *dst, cuda_dtype ot, int64_t n_groups) {
    int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= n_groups)
        return;
    float v[32];
    dq32<T>(src, g, v);
    for (int j = 0; j < 32; j++)
        cuda_store(dst, ot, g * 32 + j, v[j]);
}

int cuda_dequantize(cuda_ctx *c, int gtype, const void *src, void *dst, cuda_dtype out, int64_t n,
                    md_err *e) {
    CUDA_GUARD(c, e);
    int b = qt_block_elems(gtype);
    if (b == 0)
        return md_errf(e, MD_EUNSUPP,
                       "CUDA dequantize: ggml type %d is not supported "
                       "(F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K are)",
                       gtype);
    if (n <= 0 || n % b)
        return md_errf(e, MD_EINVAL,
                       "CUDA dequantize: %lld elements is not a positive multiple "
                       "of the block size %d",
                       (long long)n, b);
    int64_t ng = n / 32;
    const uint8_t *s = (const uint8_t *)src;
    QT_DISPATCH(gtype, k_dequant<QT><<<cuda_blocks(ng, 128), 128, 0, c->stream>>>(s, dst, out, ng));
    return CUDA_LAUNCHED(c, "dequantize", e);
}
