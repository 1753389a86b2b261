/* fuzz_gguf.c — libFuzzer target for the GGUF reader (built only with clang, see
 * tests/gguf.cmake). Every input is opened with gguf_open_mem; an accepted file has every
 * metadata value, array string and tensor read back; a rejected one must carry a message.
 *
 *   CC=clang cmake -S . -B build-fuzz -DMEDLEY_CUDA=OFF && cmake --build build-fuzz \
 *       --target fuzz_gguf && build-fuzz/tests/fuzz_gguf -max_total_time=60 corpus/
 *
 * (seed corpus: any .gguf file, e.g. the first 64 KiB of a model, or the files
 * tests/fuzz/test_gguf_fuzz.c builds.) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/weights/gguf.h"
#include "engine/weights/quant.h"
#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    gguf_file *f = NULL;
    md_err e = {0};
    if (gguf_open_mem(data, size, &f, &e) != 0) {
        if (f || !e.msg[0])
            abort();
        return 0;
    }
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const char *k = gguf_key_name(f, i), *s;
        size_t len;
        gguf_vtype et;
        uint64_t n, u;
        const void *d;
        if (gguf_find_key(f, k) != i)
            abort();
        gguf_get_u64(f, k, &u, &e);
        if (gguf_get_str(f, k, &s, &len, &e) == 0)
            fuzz_touch(s, len);
        if (gguf_get_arr(f, k, &et, &n, &e) == 0) {
            if (et == GGUF_T_STRING)
                for (uint64_t j = 0; j < n; j++)
                    if (gguf_arr_str(f, k, j, &s, &len, &e) == 0)
                        fuzz_touch(s, len);
                    else
                        abort();
            else if (gguf_arr_data(f, k, &d, &e) == 0 && n)
                fuzz_touch(d, 1);
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (gguf_find_tensor(f, t->name) != t)
            abort();
        fuzz_touch(t->data, t->n_bytes);
        if (t->n_elements <= (1 << 16)) {
            float *y = malloc((size_t)t->n_elements * sizeof *y);
            if (y)
                md_dequantize(t->type, t->data, y, t->n_elements, &e);
            free(y);
        }
    }
    gguf_close(f);
    return 0;
}
