/* quant.h — the reference conversions between GGUF block formats and float: plain scalar
 * code, exact to each format's definition (common/dtype.h lists the layouts). The fast
 * kernels in kernels/ are checked against it; the engine uses it to expand weights for
 * backends that want F32 and tests use it to build synthetic blocks. Caller-owned buffers
 * in and out; nothing allocates. */
#ifndef MEDLEY_ENGINE_QUANT_H
#define MEDLEY_ENGINE_QUANT_H

#include <stdint.h>

#include "common/dtype.h"
#include "common/err.h"

/* Dequantize n elements (multiple of the block size) of `type` at src to float: F32, F16,
 * BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K. MD_EUNSUPP for other types, MD_EINVAL for a bad n. */
int md_dequantize(int type, const void *src, float *dst, int64_t n, md_err *e);
/* Quantize n floats (multiple of the block size) to `type`: F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, bit-identical to the gguf Python package. MD_EUNSUPP for other types. */
int md_quantize(int type, const float *src, void *dst, int64_t n, md_err *e);

#endif
