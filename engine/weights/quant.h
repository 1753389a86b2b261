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
 * BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K. MD_EUNSUPP for other types, MD_EINVAL for a
 * bad n. */
int md_dequantize(int type, const void *src, float *dst, int64_t n, md_err *e);
/* Recode n elements (a multiple of 32) of Q5_0 (22-byte blocks) at src as Q8_0 (34-byte
 * blocks) at dst, exactly: the same f16 scale, q8 = q5 - 16 in [-16, 15]. The backends
 * multiply by Q8_0 but not Q5_0, which Q4_K_M files use for some matrices (engine/model/model.c
 * recodes them at load). MD_EINVAL for a bad n. */
int md_q5_0_to_q8_0(const void *src, void *dst, int64_t n, md_err *e);
/* Quantize n floats (multiple of the block size) to `type`: F32, F16, BF16, Q8_0, Q4_0,
 * Q4_1, bit-identical to the gguf Python package. MD_EUNSUPP for other types. */
int md_quantize(int type, const float *src, void *dst, int64_t n, md_err *e);

#endif
