/* bench_weights.h — random weights of a GGUF type for the benchmarks (CPU and GPU): random
 * bytes in which every 16-bit value (F16/BF16) and every f16 scale field of a quantized block
 * is a small valid number (no inf/NaN), so products stay finite. Types by ggml's numbers
 * (engine/gguf.h): F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 8, Q4_K 12, Q6_K 14, BF16 30.
 * Header-only: each benchmark is one program. */
#ifndef MEDLEY_BENCH_WEIGHTS_H
#define MEDLEY_BENCH_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Fill w (bytes, whole blocks) with random weights of gtype, drawing from rnd. */
static inline void bench_random_weights(int gtype, uint8_t *w, size_t bytes,
                                        uint32_t (*rnd)(void)) {
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)rnd();
    if (gtype == 0) { /* F32: uniform in [-1, 1] */
        for (size_t i = 0; i < bytes / 4; i++) {
            float f = (float)(rnd() % 2001) / 1000.0f - 1.0f;
            memcpy(w + 4 * i, &f, 4);
        }
        return;
    }
    if (gtype == 1 || gtype == 30) {
        for (size_t i = 0; i < bytes / 2; i++) {
            uint16_t h = gtype == 1 ? (uint16_t)(0x3000 | (rnd() & 0x3ff))
                                    : (uint16_t)(0x3e00 | (rnd() & 0x7f));
            memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    /* block bytes and the offsets of its f16 scale fields (d, and dmin / m) */
    size_t bb = gtype == 2 ? 18 : gtype == 3 ? 20 : gtype == 8 ? 34 : gtype == 12 ? 144 : 210;
    int off[2] = {gtype == 14 ? 208 : 0, gtype == 3 || gtype == 12 ? 2 : -1};
    for (size_t b = 0; b < bytes / bb; b++)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                uint16_t h = (uint16_t)(0x2000 | (rnd() & 0x3ff));
                memcpy(w + b * bb + off[k], &h, 2);
            }
}

#endif
