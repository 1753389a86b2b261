/* test_grammar_vocab.c — the grammar engine's view of a tokenizer (engine/grammar_vocab.h):
 * each token's bytes are what the tokenizer's decode gives for it, end tokens are the ones
 * the engine stops on and add no bytes. Synthetic vocabularies (a SentencePiece one with
 * byte tokens, a byte-level BPE tokenizer.json); with the argument "smollm2", SmolLM2's real
 * vocabulary (e2e: skipped when the model is not fetched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/grammar_vocab.h"
#include "engine/weights/gguf.h"
#include "engine/weights/registry.h"
#include "engine/weights/synth.h"

/* 1 when s[0..n) is well-formed UTF-8 (shortest forms, no surrogates, <= U+10FFFF). */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int k = c < 0x80             ? 0
                : (c & 0xe0) == 0xc0 ? 1
                : (c & 0xf0) == 0xe0 ? 2
                : (c & 0xf8) == 0xf0 ? 3
                                     : -1;
        if (k < 0 || i + (size_t)k >= n) /* k continuation bytes must follow within n */
            return 0;
        uint32_t cp = k == 0 ? c : c & (0x3fu >> k);
        for (int j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + j] & 0x3fu);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

/* Every token: bytes equal to the decode of the token alone when they are valid UTF-8 (the
 * decode turns partial characters into U+FFFD); end tokens of length 0 and listed; then
 * seeded runs of 2..5 tokens whose bytes make valid UTF-8 decode to their concatenation
 * (pieces holding parts of one character). Returns how many single tokens were compared. */
static int check_vocab(const tok_tokenizer *t) {
    md_vocab_bytes vb;
    md_err e = {0};
    assert_int_equal(md_vocab_bytes_make(t, &vb, &e), 0);
    assert_int_equal(vb.n_vocab, tok_n_vocab(t));
    assert_true(vb.n_eos > 0);
    int compared = 0, k = 0;
    for (int i = 0; i < vb.n_vocab; i++) {
        if (k < vb.n_eos && vb.eos[k] == i) {
            k++;
            assert_true(tok_is_eog(t, i));
            assert_int_equal(vb.len[i], 0);
            continue;
        }
        assert_false(tok_is_eog(t, i));
        char *dec;
        size_t dl;
        assert_int_equal(tok_decode(t, &i, 1, 0, &dec, &dl, &e), 0);
        if (utf8_ok((const unsigned char *)vb.tok[i], vb.len[i])) {
            if (dl != vb.len[i] || memcmp(dec, vb.tok[i], dl))
                fail_msg("token %d: grammar bytes '%.*s' (%u), decode '%s' (%zu)", i,
                         (int)vb.len[i], vb.tok[i], vb.len[i], dec, dl);
            compared++;
        }
        free(dec);
    }
    assert_int_equal(k, vb.n_eos);
    uint64_t x = 88172645463325252ull;
    char cat[1024];
    int runs = 0;
    for (int r = 0; r < 200000 && runs < 2000; r++) {
        int32_t ids[5];
        int n = 2 + r % 4;
        size_t cl = 0;
        for (int j = 0; j < n; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[j] = (int32_t)(x % (uint64_t)vb.n_vocab);
            /* a partial character: look for its bytes among the byte-ish tokens too */
            if (j > 0 && vb.len[ids[j - 1]] &&
                !utf8_ok((const unsigned char *)vb.tok[ids[j - 1]], vb.len[ids[j - 1]]))
                ids[j] = (int32_t)(x % (uint64_t)(vb.n_vocab < 512 ? vb.n_vocab : 512));
            if (cl + vb.len[ids[j]] < sizeof cat) {
                memcpy(cat + cl, vb.tok[ids[j]], vb.len[ids[j]]);
                cl += vb.len[ids[j]];
            }
        }
        if (!utf8_ok((const unsigned char *)cat, cl))
            continue;
        char *dec;
        size_t dl;
        assert_int_equal(tok_decode(t, ids, n, 0, &dec, &dl, &e), 0);
        if (dl != cl || memcmp(dec, cat, dl))
            fail_msg("run of %d tokens from %d: grammar bytes '%.*s', decode '%s'", n, ids[0],
                     (int)cl, cat, dec);
        free(dec);
        runs++;
    }
    assert_true(runs > 100);
    md_vocab_bytes_free(&vb);
    return compared;
}

/* The synthetic SentencePiece vocabulary (byte fallback <0xNN> tokens, ▁ pieces). */
static void sentencepiece_bytes_are_the_decode(void **st) {
    void *img;
    size_t len;
    md_err e = {0};
    assert_int_equal(md_synth_build("synthetic:tiny", 0, &img, &len, &e), 0);
    gguf_file *f;
    tok_tokenizer *t;
    assert_int_equal(gguf_open_mem(img, len, &f, &e), 0);
    assert_int_equal(tok_load(f, &t, &e), 0);
    gguf_close(f);
    md_vocab_bytes vb;
    assert_int_equal(md_vocab_bytes_make(t, &vb, &e), 0);
    int32_t b41 = tok_find(t, "<0x41>", 6), bc3 = tok_find(t, "<0xC3>", 6);
    assert_true(b41 >= 0 && bc3 >= 0);
    assert_int_equal(vb.len[b41], 1);
    assert_int_equal(vb.tok[b41][0], 'A');
    assert_int_equal(vb.len[bc3], 1);
    assert_int_equal((unsigned char)vb.tok[bc3][0], 0xc3);
    md_vocab_bytes_free(&vb);
    assert_true(check_vocab(t) > 256);
    tok_free(t);
    md_synth_free(img, len);
}

/* Byte-level BPE from a tokenizer.json: Ġ is a space, the special end token adds nothing. */
static void byte_level_bpe_bytes_are_the_decode(void **st) {
    static const char json[] =
        "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 9, \"content\": \"<|end|>\", "
        "\"special\": true}], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
        "\"add_prefix_space\": false, \"use_regex\": true}, \"post_processor\": null, "
        "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"h\": "
        "0, \"e\": 1, \"l\": 2, \"o\": 3, \"\xc4\xa0\": 4, \"he\": 5, \"ll\": 6, \"hell\": 7, "
        "\"\xc4\xa0hello\": 8, \"<|end|>\": 9, \"\xc3\x83\": 10, \"\xc2\xa9\": 11, "
        "\"\xc3\x83\xc2\xa9\": 12}, \"merges\": [\"h e\", \"l l\", \"he ll\"]}}";
    static const char cfg[] = "{\"eos_token\": \"<|end|>\"}";
    tok_tokenizer *t;
    md_err e = {0};
    if (tok_load_hf_mem(json, strlen(json), cfg, strlen(cfg), &t, &e))
        fail_msg("load: %s", e.msg);
    md_vocab_bytes vb;
    assert_int_equal(md_vocab_bytes_make(t, &vb, &e), 0);
    assert_int_equal(vb.n_eos, 1);
    assert_int_equal(vb.eos[0], 9);
    assert_int_equal(vb.len[9], 0);
    assert_int_equal(vb.len[4], 1);
    assert_int_equal(vb.tok[4][0], ' ');
    assert_int_equal(vb.len[8], 6);
    assert_memory_equal(vb.tok[8], " hello", 6);
    /* Ã -> byte 0xC3, © -> byte 0xA9: "é" in two tokens and in one */
    assert_int_equal(vb.len[12], 2);
    assert_memory_equal(vb.tok[12], "\xc3\xa9", 2);
    assert_int_equal(vb.len[10], 1);
    assert_int_equal((unsigned char)vb.tok[10][0], 0xc3);
    md_vocab_bytes_free(&vb);
    check_vocab(t);
    tok_free(t);
}

/* SmolLM2's file as `medley models fetch smollm2-135m` put it (the registry's lookup), or NULL
 * when it is not fetched. */
static const char *model_path(void) {
    static char path[4096];
    md_err e = {0};
    return md_model_resolve("smollm2-135m", 0, path, sizeof path, &e) == 0 ? path : NULL;
}

/* SmolLM2's 49152 tokens: <|im_end|> and <|endoftext|> are end tokens, and nearly every token
 * is a whole-character piece compared with its decode. */
static void smollm2_bytes_are_the_decode(void **st) {
    const char *p = model_path();
    if (!p) {
        fprintf(stderr, "test_grammar_vocab: smollm2-135m not fetched; skipping\n");
        skip();
    }
    gguf_file *f;
    tok_tokenizer *t;
    md_err e = {0};
    assert_int_equal(gguf_open(p, &f, &e), 0);
    assert_int_equal(tok_load(f, &t, &e), 0);
    gguf_close(f);
    assert_true(tok_is_eog(t, tok_find(t, "<|im_end|>", 10)));
    assert_true(check_vocab(t) > 45000);
    tok_free(t);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "smollm2") == 0) {
        const struct CMUnitTest e2e[] = {cmocka_unit_test(smollm2_bytes_are_the_decode)};
        return cmocka_run_group_tests(e2e, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sentencepiece_bytes_are_the_decode),
        cmocka_unit_test(byte_level_bpe_bytes_are_the_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
