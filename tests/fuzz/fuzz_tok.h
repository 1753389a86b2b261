/* fuzz_tok.h — what the tokenizer fuzzers (test_tok_hf_fuzz.c, fuzz_tok_hf.c) do with a
 * tokenizer that loaded: encode each text with and without special-token parsing, decode the
 * ids back. Errors are allowed; a crash, a leak or a sanitizer report is the failure. */
#ifndef MEDLEY_TESTS_FUZZ_TOK_H
#define MEDLEY_TESTS_FUZZ_TOK_H

#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer.h"

static inline void fuzz_tok_roundtrip(const tok_tokenizer *t, const char *const *texts,
                                      size_t n_texts) {
    md_err e = {0};
    for (size_t i = 0; i < n_texts; i++)
        for (int special = 0; special < 2; special++) {
            int32_t *ids;
            int n;
            if (tok_encode(t, texts[i], strlen(texts[i]), 1, special, &ids, &n, &e))
                continue;
            char *out;
            size_t ol;
            if (tok_decode(t, ids, n, 1, &out, &ol, &e) == 0)
                free(out);
            free(ids);
        }
}

#endif
