/* kv_f16.c — rows of the F16 KV cache on the CPU (half the memory and half the bytes attention
 * reads per position): F32 rows converted with round-to-nearest-even, F16C where the CPU has
 * it. Attention over the F16 rows is kernels/cpu/attn_tiled.c. Single-threaded, no
 * allocation. */
#include "kernels/cpu/cpu_ops.h"

#include <stdint.h>

#include "common/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

static void to_f16_scalar(uint16_t *dst, const float *src, int n) {
    for (int i = 0; i < n; i++)
        dst[i] = md_fp32_to_fp16(src[i]);
}

#ifdef HAVE_X86
__attribute__((target("avx2,fma,f16c"))) static void to_f16_avx2(uint16_t *dst, const float *src,
                                                                 int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        dst[i] = md_fp32_to_fp16(src[i]);
}
#endif

void cpu_f32_to_f16_row(uint16_t *dst, const float *src, int n) {
#ifdef HAVE_X86
    if (cpu_simd_level() >= CPU_SIMD_AVX2) {
        to_f16_avx2(dst, src, n);
        return;
    }
#endif
    to_f16_scalar(dst, src, n);
}
