/* fuzz_tok_hf.c — libFuzzer target for tokenizer.json (built only with clang, see
 * tests/tokenizer.cmake). The input is split at its first NUL into tokenizer.json and
 * tokenizer_config.json; an accepted tokenizer encodes and decodes a few texts, a refused
 * one must carry a message and no tokenizer.
 *
 *   CC=clang cmake -S . -B build-fuzz -DMEDLEY_CUDA=OFF && cmake --build build-fuzz \
 *       --target fuzz_tok_hf && build-fuzz/tests/fuzz_tok_hf -max_total_time=60 corpus/
 *
 * (seed corpus: tokenizer.json files, e.g. those tests/fixtures/tokenizer/
 * make_hf_tokenizer.py writes, or the seeds in tests/fuzz/test_tok_hf_fuzz.c.) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer.h"
#include "fuzz/fuzz_tok.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data, *cfg = NULL;
    size_t len = size, cfg_len = 0;
    const char *nul = memchr(data, 0, size);
    if (nul) {
        len = (size_t)(nul - json);
        cfg = nul + 1;
        cfg_len = size - len - 1;
    }
    tok_tokenizer *t = NULL;
    md_err e = {0};
    if (tok_load_hf_mem(json, len, cfg, cfg_len, &t, &e)) {
        if (t || !e.msg[0])
            abort();
        return 0;
    }
    static const char *const texts[] = {"hello 123 <|end|> x", "\xff\xc3 \xed\xa0\x80 e\xcc\x81",
                                        ""};
    fuzz_tok_roundtrip(t, texts, 3);
    tok_free(t);
    return 0;
}
