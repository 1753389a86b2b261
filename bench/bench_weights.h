/* bench_weights.h — random weights of a GGUF type for the benchmarks (CPU and GPU): random
 * bytes in which every 16-bit value (F16/BF16) and every f16 scale field of a quantized block
 * is a small valid number (no inf/NaN), so products stay finite. Types are common/dtype.h's
 * md_type (those of md_type_supported). Header-only: each benchmark is one program. */
#ifndef MEDLEY_BENCH_WEIGHTS_H
#define MEDLEY_BENCH_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/dtype.h"

/* Fill w (bytes, whole blocks) with random weights of gtype, drawing from rnd. */
static inline void bench_random_weights(int gtype, uint8_t *w, size_t bytes,
                                        uint32_t (*rnd)(void)) {
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)rnd();
    if (gtype == MD_TYPE_F32) { /* uniform in [-1, 1] */
        for (size_t i = 0; i < bytes / 4; i++) {
            float f = (float)(rnd() % 2001) / 1000.0f - 1.0f;
            memcpy(w + 4 * i, &f, 4);
        }
        return;
    }
    if (gtype == MD_TYPE_F16 || gtype == MD_TYPE_BF16) {
        for (size_t i = 0; i < bytes / 2; i++) {
            uint16_t h = gtype == MD_TYPE_F16 ? (uint16_t)(0x3000 | (rnd() & 0x3ff))
                                              : (uint16_t)(0x3e00 | (rnd() & 0x7f));
            memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    /* block bytes and the offsets of its f16 scale fields (d, and dmin / m) */
    size_t bb = md_type_block_bytes(gtype);
    int off[2] = {gtype == MD_TYPE_Q6_K ? 208 : 0,
                  gtype == MD_TYPE_Q4_1 || gtype == MD_TYPE_Q4_K || gtype == MD_TYPE_Q5_K ? 2 : -1};
    for (size_t b = 0; b < bytes / bb; b++)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                uint16_t h = (uint16_t)(0x2000 | (rnd() & 0x3ff));
                memcpy(w + b * bb + off[k], &h, 2);
            }
}

#endif
