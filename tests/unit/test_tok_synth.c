/* test_tok_synth.c — tokenizers on tiny synthetic GGUF vocabularies written in memory:
 * SentencePiece (merges by score, byte fallback, space prefix after specials), byte-level BPE
 * with each pre-tokenizer family (gpt2, llama-bpe, qwen2, smollm, default) where a merge that
 * would cross a split point shows where the regexes split, merges through strings that are
 * not tokens, ignore_merges (Llama 3), loader errors, and random bytes / ids (no crash, valid
 * UTF-8 out). Expected ids were worked out by hand from the rules written in
 * engine/tokenizer/tokenizer_bpe.c and tokenizer_spm.c (llama.cpp's behaviour); SmolLM2's real
 * vocabulary is checked against llama.cpp itself in test_tok_smollm.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/weights/gguf.h"
#include "engine/tokenizer/tokenizer.h"

/* ---- a GGUF writer for tokenizer metadata only ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
} gw;

static void put(gw *g, const void *d, size_t n) {
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 256;
        g->p = realloc(g->p, g->cap);
    }
    memcpy(g->p + g->n, d, n);
    g->n += n;
}
static void u32(gw *g, uint32_t v) {
    put(g, &v, 4);
}
static void u64(gw *g, uint64_t v) {
    put(g, &v, 8);
}
static void str(gw *g, const char *s) {
    u64(g, strlen(s));
    put(g, s, strlen(s));
}
static void key(gw *g, const char *k, uint32_t type) {
    str(g, k);
    u32(g, type);
    g->n_kv++;
}
static void kv_str(gw *g, const char *k, const char *v) {
    key(g, k, GGUF_T_STRING);
    str(g, v);
}
static void kv_u32(gw *g, const char *k, uint32_t v) {
    key(g, k, GGUF_T_UINT32);
    u32(g, v);
}
static void kv_bool(gw *g, const char *k, int v) {
    key(g, k, GGUF_T_BOOL);
    uint8_t b = (uint8_t)v;
    put(g, &b, 1);
}
static void kv_strs(gw *g, const char *k, const char *const *v, int n) {
    key(g, k, GGUF_T_ARRAY);
    u32(g, GGUF_T_STRING);
    u64(g, (uint64_t)n);
    for (int i = 0; i < n; i++)
        str(g, v[i]);
}
static void kv_f32s(gw *g, const char *k, const float *v, int n) {
    key(g, k, GGUF_T_ARRAY);
    u32(g, GGUF_T_FLOAT32);
    u64(g, (uint64_t)n);
    put(g, v, (size_t)n * 4);
}
static void kv_i32s(gw *g, const char *k, const int32_t *v, int n) {
    key(g, k, GGUF_T_ARRAY);
    u32(g, GGUF_T_INT32);
    u64(g, (uint64_t)n);
    put(g, v, (size_t)n * 4);
}
static gw gw_begin(void) {
    gw g = {0};
    put(&g, "GGUF", 4);
    u32(&g, 3);
    u64(&g, 0); /* tensors */
    u64(&g, 0); /* kv count, patched by gw_end */
    return g;
}
static void gw_end(gw *g) {
    memcpy(g->p + 16, &g->n_kv, 8);
    while (g->n % 32)
        put(g, "", 1);
}

/* Open g as a tokenizer; the gguf_file is closed right away (tok_load copies). */
static int load(gw *g, tok_tokenizer **t, md_err *e) {
    gguf_file *f;
    gw_end(g);
    int rc = gguf_open_mem(g->p, g->n, &f, e);
    if (rc)
        return rc;
    rc = tok_load(f, t, e);
    gguf_close(f);
    return rc;
}

/* ---- vocabularies ---- */

typedef struct {
    const char *v[600];
    char own[600][8];
    int n;
} vocab;

static int add(vocab *v, const char *s) {
    v->v[v->n] = s;
    return v->n++;
}
static int vid(const vocab *v, const char *s) {
    for (int i = v->n - 1; i >= 0; i--)
        if (!strcmp(v->v[i], s))
            return i;
    fail_msg("test vocab has no '%s'", s);
    return -1;
}

/* SentencePiece: <unk> <s> </s>, 256 byte tokens, then scored pieces. */
static tok_tokenizer *spm(vocab *v, const char *tmpl) {
    static const struct {
        const char *s;
        float score;
    } pieces[] = {
        {"\xe2\x96\x81", -1.0f},
        {"\xe2\x96\x81h", -1.0f},
        {"\xe2\x96\x81he", -2.0f},
        {"\xe2\x96\x81hel", -3.0f},
        {"\xe2\x96\x81hell", -4.0f},
        {"\xe2\x96\x81hello", -5.0f},
        {"\xe2\x96\x81w", -1.5f},
        {"\xe2\x96\x81wo", -2.5f},
        {"\xe2\x96\x81wor", -3.5f},
        {"\xe2\x96\x81worl", -4.5f},
        {"\xe2\x96\x81world", -5.5f},
        {"h", -10},
        {"e", -10},
        {"l", -10},
        {"o", -10},
        {"w", -10},
        {"r", -10},
        {"d", -10},
        {"ab", -1.0f},
        {"bc", -0.5f},
        {"a", -10},
        {"b", -10},
        {"c", -10},
    };
    float scores[600] = {0};
    int32_t types[600];
    v->n = 0;
    types[add(v, "<unk>")] = 2;
    types[add(v, "<s>")] = 3;
    types[add(v, "</s>")] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(v->own[b], sizeof v->own[b], "<0x%02X>", b);
        types[add(v, v->own[b])] = 6;
    }
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        scores[v->n] = pieces[i].score;
        types[add(v, pieces[i].s)] = 1;
    }
    gw g = gw_begin();
    kv_str(&g, "general.architecture", "llama");
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", v->v, v->n);
    kv_f32s(&g, "tokenizer.ggml.scores", scores, v->n);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, v->n);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&g, "tokenizer.ggml.unknown_token_id", 0);
    if (tmpl)
        kv_str(&g, "tokenizer.chat_template", tmpl);
    tok_tokenizer *t = NULL;
    md_err e = {0};
    if (load(&g, &t, &e))
        fail_msg("loading the SentencePiece vocab: %s", e.msg);
    free(g.p);
    return t;
}

/* GPT-2's byte-level alphabet, as UTF-8, for byte b. */
static void alpha(int b, char out[4]) {
    int n = 0, c = b;
    for (int x = 0; x < 256; x++) {
        int printable = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
        if (!printable) {
            if (x == b)
                c = 256 + n;
            n++;
        }
    }
    if (c < 0x80) {
        out[0] = (char)c, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (c >> 6)), out[1] = (char)(0x80 | (c & 0x3F)), out[2] = 0;
    }
}

/* Byte-level BPE: the 256 alphabet characters (token b stands for byte b), control tokens,
 * then the merges' results. Space is "\xc4\xa0" (Ġ), newline "\xc4\x8a" (Ċ). */
static const char *const k_merges[] = {
    "1 2",
    "12 3",
    "4 5",
    "' S",
    "i t",
    "( h",
    "h e",
    "he l",
    "hel l",
    "hell o",
    "\xc4\xa0 \xc4\xa0",
    "\xc4\xa0 b",
    "\xc4\xa0 \xc4\x8a",
    "\xc4\xa0\xc4\x8a \xc4\x8a",
    "a b",
    "ab c",
    "! !",
    "!! !",
    "x y",
};
static tok_tokenizer *bpe(vocab *v, const char *pre, int with_xyz) {
    static const char *const results[] = {
        "12",
        "123",
        "45",
        "'S",
        "it",
        "(h",
        "he",
        "hel",
        "hell",
        "hello",
        "\xc4\xa0\xc4\xa0",
        "\xc4\xa0"
        "b",
        "\xc4\xa0\xc4\x8a",
        "\xc4\xa0\xc4\x8a\xc4\x8a",
        "abc",
        "!!",
        "!!!",
    };
    v->n = 0;
    int32_t types[600];
    for (int b = 0; b < 256; b++) {
        alpha(b, v->own[b]);
        types[add(v, v->own[b])] = 1;
    }
    types[add(v, "<|endoftext|>")] = 3;
    types[add(v, "<|im_start|>")] = 3;
    types[add(v, "<|im_end|>")] = 3;
    types[add(v, "<tool>")] = 4; /* user-defined: matched even without parse_special */
    for (size_t i = 0; i < sizeof results / sizeof *results; i++)
        types[add(v, results[i])] = 1;
    if (with_xyz)
        types[add(v, "xyz")] = 1; /* a token no merge reaches */
    gw g = gw_begin();
    kv_str(&g, "general.architecture", "llama");
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    if (pre)
        kv_str(&g, "tokenizer.ggml.pre", pre);
    kv_strs(&g, "tokenizer.ggml.tokens", v->v, v->n);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, v->n);
    kv_strs(&g, "tokenizer.ggml.merges", k_merges, (int)(sizeof k_merges / sizeof *k_merges));
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 257);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", 256);
    kv_bool(&g, "tokenizer.ggml.add_bos_token", 0);
    tok_tokenizer *t = NULL;
    md_err e = {0};
    if (load(&g, &t, &e))
        fail_msg("loading the BPE vocab (%s): %s", pre ? pre : "-", e.msg);
    free(g.p);
    return t;
}

/* Encode and compare with the expected token strings of v. */
static void expect(tok_tokenizer *t, const vocab *v, const char *text, size_t len, int bos,
                   int special, const char *const *want, int n_want) {
    int32_t *ids;
    int n;
    md_err e = {0};
    if (tok_encode(t, text, len, bos, special, &ids, &n, &e))
        fail_msg("encode \"%s\": %s", text, e.msg);
    int ok = n == n_want;
    for (int i = 0; ok && i < n; i++)
        ok = ids[i] == vid(v, want[i]);
    if (!ok) {
        fprintf(stderr, "encode \"%s\": got", text);
        for (int i = 0; i < n; i++)
            fprintf(stderr, " [%s]", ids[i] >= 0 && ids[i] < v->n ? v->v[ids[i]] : "?");
        fprintf(stderr, "\n");
    }
    free(ids);
    assert_true(ok);
}
#define EXPECT(t, v, text, bos, sp, ...)                                                           \
    do {                                                                                           \
        const char *const w_[] = {__VA_ARGS__};                                                    \
        expect(t, v, text, strlen(text), bos, sp, w_, (int)(sizeof w_ / sizeof *w_));              \
    } while (0)

#define SP "\xe2\x96\x81"
#define G "\xc4\xa0"
#define NL "\xc4\x8a"

/* ---- SentencePiece ---- */

static void spm_merges_by_score_and_prefixes_a_space(void **st) {
    vocab v;
    tok_tokenizer *t = spm(&v, NULL);
    assert_string_equal(tok_model_name(t), "llama");
    assert_true(tok_add_bos(t));
    EXPECT(t, &v, "hello world", 1, 1, "<s>", SP "hello", SP "world");
    EXPECT(t, &v, "hello world", 0, 1, SP "hello", SP "world");
    /* "abc": "bc" (-0.5) beats "ab" (-1.0) */
    EXPECT(t, &v, "abc", 0, 0, SP, "a", "bc");
    /* after a special token the text gets the space prefix again; specials only when asked */
    EXPECT(t, &v, "<s>hello", 0, 1, "<s>", SP "hello");
    EXPECT(t, &v, "</s>", 0, 0, SP, "<0x3C>", "<0x2F>", "<0x73>", "<0x3E>");
    tok_free(t);
}

static void spm_falls_back_to_byte_tokens_even_for_invalid_utf8(void **st) {
    vocab v;
    tok_tokenizer *t = spm(&v, NULL);
    EXPECT(t, &v, "hi\xe2\x82\xac", 0, 0, SP "h", "<0x69>", "<0xE2>", "<0x82>", "<0xAC>");
    EXPECT(t, &v, "\xff", 0, 0, SP, "<0xFF>");
    EXPECT(t, &v, "o\xe2\x82", 0, 0, SP, "o", "<0xE2>", "<0x82>");
    int32_t *ids;
    int n;
    md_err e = {0};
    assert_int_equal(tok_encode(t, "", 0, 1, 1, &ids, &n, &e), 0);
    assert_int_equal(n, 1); /* just BOS, like SentencePiece's encode('') */
    free(ids);
    /* decode: ▁ is a space, byte tokens are their bytes */
    const char *const w[] = {SP "h", "<0x69>", "<0xE2>", "<0x82>", "<0xAC>"};
    int32_t in[5];
    for (int i = 0; i < 5; i++)
        in[i] = vid(&v, w[i]);
    char *s;
    size_t len;
    assert_int_equal(tok_decode(t, in, 5, 0, &s, &len, &e), 0);
    assert_string_equal(s, " hi\xe2\x82\xac");
    free(s);
    tok_free(t);
}

/* ---- byte-level BPE and the pre-tokenizers ---- */

static void gpt2_splits_contractions_words_numbers_and_space_runs(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "gpt-2", 0);
    assert_string_equal(tok_pre_name(t), "gpt-2");
    EXPECT(t, &v, "12345", 0, 0, "123", "45");   /* \p{N}+ is one word */
    EXPECT(t, &v, "it'S", 0, 0, "it", "'", "S"); /* 'S is no contraction for gpt2 */
    EXPECT(t, &v, "(hello", 0, 0, "(", "hello");
    /* "a   b": \s+(?!\S) leaves the last space to " b" */
    EXPECT(t, &v, "a   b", 0, 0, "a", G G, G "b");
    EXPECT(t, &v, " \n\n", 0, 0, G NL NL); /* one whitespace word, merged */
    /* "! !" (rank 16) twice before "!! !" (rank 17) can apply: lowest rank first */
    EXPECT(t, &v, "!!!!", 0, 0, "!!", "!!");
    EXPECT(t, &v, "!!!", 0, 0, "!!!");
    tok_free(t);
}

static void smollm_and_qwen2_split_every_digit(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "smollm", 0);
    EXPECT(t, &v, "12345", 0, 0, "1", "2", "3", "4", "5");
    EXPECT(t, &v, "a   b", 0, 0, "a", G G, G "b");
    tok_free(t);
    t = bpe(&v, "qwen2", 0);
    EXPECT(t, &v, "12345", 0, 0, "1", "2", "3", "4", "5");
    EXPECT(t, &v, "it'S", 0, 0, "it", "'S");                 /* case-insensitive contractions */
    EXPECT(t, &v, "(hello", 0, 0, "(h", "e", "l", "l", "o"); /* "(hello" is one word */
    tok_free(t);
}

static void llama3_groups_three_digits_and_ignores_merges_for_whole_tokens(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "llama-bpe", 1);
    assert_false(tok_add_bos(t)); /* the GGUF's add_bos_token = false beats llama-bpe's default */
    EXPECT(t, &v, "12345", 0, 0, "123", "45");
    EXPECT(t, &v, "it'S", 0, 0, "it", "'S");
    EXPECT(t, &v, " \n\n", 0, 0, G NL NL); /* \s*[\r\n]+ */
    EXPECT(t, &v, "xyz", 0, 0, "xyz");     /* a whole-word token wins without merges */
    tok_free(t);
    t = bpe(&v, "gpt-2", 1);
    EXPECT(t, &v, "xyz", 0, 0, "x", "y", "z");
    tok_free(t);
}

static void default_pre_tokenizer_splits_punctuation_first(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, NULL, 0); /* no tokenizer.ggml.pre: llama.cpp's default */
    assert_string_equal(tok_pre_name(t), "default");
    EXPECT(t, &v, "(hello", 0, 0, "(", "hello");
    EXPECT(t, &v, "12345", 0, 0, "123", "45");
    tok_free(t);
}

static void bpe_merges_through_strings_that_are_not_tokens(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "gpt-2", 0);
    /* "a b" makes "ab" (not a token), "ab c" makes "abc" (a token) */
    EXPECT(t, &v, "abc", 0, 0, "abc");
    /* "ab" alone is not a token: its single bytes stand in */
    EXPECT(t, &v, "ab", 0, 0, "a", "b");
    tok_free(t);
}

static void bpe_special_and_user_defined_tokens(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "gpt-2", 0);
    EXPECT(t, &v, "<|im_start|>hello<|im_end|>", 0, 1, "<|im_start|>", "hello", "<|im_end|>");
    /* without parse_special the control tokens are text, user-defined ones still match */
    EXPECT(t, &v, "x<tool>y", 0, 0, "x", "<tool>", "y");
    EXPECT(t, &v, "<|", 0, 1, "<", "|");
    assert_true(tok_is_eog(t, vid(&v, "<|im_end|>")));
    assert_true(tok_is_eog(t, vid(&v, "<|endoftext|>")));
    assert_false(tok_is_eog(t, vid(&v, "<|im_start|>")));
    tok_free(t);
}

static void bpe_invalid_utf8_becomes_replacement_characters(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "gpt-2", 0);
    /* U+FFFD is EF BF BD: three alphabet characters, no merges */
    char ef[4], bf[4], bd[4];
    alpha(0xEF, ef);
    alpha(0xBF, bf);
    alpha(0xBD, bd);
    EXPECT(t, &v, "\xff", 0, 0, ef, bf, bd);
    /* an overlong "A" (C1 81) is repaired to "A" */
    EXPECT(t, &v, "\xc1\x81", 0, 0, "A");
    /* encoded surrogates pass through as their bytes */
    char ed[4], a0[4], x80[4];
    alpha(0xED, ed);
    alpha(0xA0, a0);
    alpha(0x80, x80);
    EXPECT(t, &v, "\xed\xa0\x80", 0, 0, ed, a0, x80);
    tok_free(t);
}

/* ---- loader errors ---- */

static void loader_refuses_bad_vocabularies_with_a_sentence(void **st) {
    tok_tokenizer *t = NULL;
    md_err e = {0};
    gw g = gw_begin();
    kv_str(&g, "general.architecture", "llama");
    kv_str(&g, "tokenizer.ggml.model", "bert");
    assert_int_equal(load(&g, &t, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "bert"));
    free(g.p);

    g = gw_begin();
    kv_str(&g, "tokenizer.ggml.model", "llama");
    assert_int_equal(load(&g, &t, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.tokens"));
    free(g.p);

    const char *toks[] = {"a", "b"};
    float sc[1] = {0};
    g = gw_begin();
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 2);
    kv_f32s(&g, "tokenizer.ggml.scores", sc, 1);
    assert_int_equal(load(&g, &t, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "tokenizer.ggml.scores"));
    free(g.p);

    g = gw_begin();
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 2);
    assert_int_equal(load(&g, &t, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "merges"));
    free(g.p);

    const char *merges[] = {"a b"};
    g = gw_begin();
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "klingon");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 2);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 1);
    assert_int_equal(load(&g, &t, &e), MD_EUNSUPP); /* llama.cpp refuses it too */
    assert_non_null(strstr(e.msg, "klingon"));
    free(g.p);

    g = gw_begin();
    key(&g, "tokenizer.ggml.model", GGUF_T_UINT32);
    u32(&g, 7);
    assert_int_equal(load(&g, &t, &e), MD_EFORMAT);
    free(g.p);
    assert_null(t);
}

/* ---- bad input never crashes; decoding always gives valid UTF-8 ---- */

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        int k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + (size_t)k > n)
            return 0;
        for (int j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80)
                return 0;
        i += (size_t)k;
    }
    return 1;
}

static void random_bytes_and_ids_never_crash_and_decode_to_valid_utf8(void **st) {
    vocab v1, v2;
    tok_tokenizer *ts[2] = {spm(&v1, NULL), bpe(&v2, "smollm", 1)};
    uint64_t x = 88172645463325252ULL;
    for (int k = 0; k < 2; k++) {
        tok_tokenizer *t = ts[k];
        for (int it = 0; it < 400; it++) {
            char buf[64];
            int len = (int)((x >> 33) % 64);
            for (int i = 0; i < len; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                /* bias towards UTF-8 lead/continuation bytes and ASCII */
                buf[i] = (char)(it % 3 ? (x & 0xFF) : (0x80 | (x & 0x7F)) - (x & 1) * 0x40);
            }
            int32_t *ids;
            int n;
            md_err e = {0};
            int rc = tok_encode(t, buf, (size_t)len, it & 1, it & 2, &ids, &n, &e);
            assert_true(rc == 0 || rc == MD_EINVAL);
            if (rc)
                continue;
            char *s;
            size_t sl;
            assert_int_equal(tok_decode(t, ids, n, it & 1, &s, &sl, &e), 0);
            assert_true(valid_utf8(s, sl));
            free(s);
            tok_stream ss;
            tok_stream_init(&ss);
            char out[128];
            for (int i = 0; i < n; i++) {
                size_t w = tok_stream_push(t, &ss, ids[i], out, sizeof out);
                assert_true(valid_utf8(out, w));
            }
            free(ids);
            /* random ids: out of range ones are refused by decode, skipped by the stream */
            int32_t rid[8];
            for (int i = 0; i < 8; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                rid[i] = (int32_t)(x % 700) - 50;
            }
            rc = tok_decode(t, rid, 8, 1, &s, &sl, &e);
            if (rc == 0) {
                assert_true(valid_utf8(s, sl));
                free(s);
            } else {
                assert_int_equal(rc, MD_EINVAL);
            }
            for (int i = 0; i < 8; i++) {
                size_t w = tok_stream_push(t, &ss, rid[i], out, sizeof out);
                assert_true(valid_utf8(out, w));
            }
            assert_true(valid_utf8(out, tok_stream_flush(&ss, out, sizeof out)));
        }
        tok_free(t);
    }
}

/* ---- chat templates detected from the GGUF's template text ---- */

static tok_template detect_and_render(const char *tmpl, const tok_chat_msg *m, int n, char **out,
                                      md_err *e) {
    vocab v;
    tok_tokenizer *t = spm(&v, tmpl);
    tok_template k = tok_chat_template(t);
    *out = NULL;
    if (tok_chat_apply(t, m, n, 1, out, e))
        *out = NULL;
    size_t len;
    assert_string_equal(tok_chat_template_text(t, &len), tmpl);
    assert_int_equal(len, strlen(tmpl));
    tok_free(t);
    return k;
}

static void chat_templates_are_recognised_from_their_text(void **st) {
    const tok_chat_msg m[] = {{"system", "Sys"}, {"user", " Hello "}};
    char *p;
    md_err e = {0};
    /* Llama 3 Instruct */
    assert_int_equal(
        detect_and_render("{% set loop_messages = messages %}{% for message in loop_messages %}"
                          "{% set content = '<|start_header_id|>' + message['role'] + "
                          "'<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
                          "{% endfor %}",
                          m, 2, &p, &e),
        TOK_TMPL_LLAMA3);
    assert_string_equal(p, "<|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(p);
    /* Llama 2 chat: <<SYS>> and content.strip() */
    assert_int_equal(detect_and_render("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + "
                                       "content.strip() + ' [/INST]' }}",
                                       m, 2, &p, &e),
                     TOK_TMPL_LLAMA2);
    assert_string_equal(p, "[INST] <<SYS>>\nSys\n<</SYS>>\n\nHello [/INST]");
    free(p);
    /* Mistral v0.1 has [INST] but no system support: llama2 without <<SYS>> */
    assert_int_equal(detect_and_render("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + "
                                       "message['content'] + ' [/INST]' }}{% endfor %}",
                                       m, 2, &p, &e),
                     TOK_TMPL_LLAMA2);
    assert_string_equal(p, "[INST] Sys\n Hello  [/INST]");
    free(p);
    /* Mistral v7 */
    assert_int_equal(
        detect_and_render("{{ '[SYSTEM_PROMPT] ' + system }}{{ '[INST] ' + c }}", m, 2, &p, &e),
        TOK_TMPL_MISTRAL);
    assert_string_equal(p, "[SYSTEM_PROMPT] Sys[/SYSTEM_PROMPT][INST]  Hello [/INST]");
    free(p);
    /* Qwen2.5: its default system turn, with \n escaped in the template source */
    const tok_chat_msg u[] = {{"user", "Hi"}};
    assert_int_equal(detect_and_render("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>"
                                       "system\\n' + messages[0]['content'] }}{%- else %}{{- "
                                       "'<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}",
                                       u, 1, &p, &e),
                     TOK_TMPL_CHATML);
    assert_string_equal(p, "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nHi"
                           "<|im_end|>\n<|im_start|>assistant\n");
    free(p);
    /* Zephyr (TinyLlama chat) and Phi-4 are not supported: a clear error, no prompt */
    assert_int_equal(detect_and_render("{% for message in messages %}<|user|>\n{{ "
                                       "message['content'] }}</s>{% endfor %}",
                                       m, 2, &p, &e),
                     TOK_TMPL_NONE);
    assert_null(p);
    assert_int_equal(e.code, MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "<|user|>"));
    assert_int_equal(detect_and_render("<|im_start|>user<|im_sep|>", m, 2, &p, &e), TOK_TMPL_NONE);
    assert_null(p);
}

/* Long texts go through a per-call word cache: the ids must be those of the uncached path
 * (short texts), unit by unit. 20000 distinct numbers also force the cache to be cleared. */
static void long_texts_give_the_same_ids_as_short_ones(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "smollm", 0);
    size_t cap = 2 * 1000 * 1000, len = 0;
    char *text = malloc(cap);
    int32_t *want = malloc(cap * sizeof *want);
    size_t nw = 0;
    md_err e = {0};
    for (int i = 0; i < 40000; i++) {
        char unit[64];
        int n = snprintf(unit, sizeof unit, " hello abc!! w%d", i % 20000 + (i / 20000) * 7);
        int32_t *ids;
        int k;
        assert_int_equal(tok_encode(t, unit, (size_t)n, 0, 0, &ids, &k, &e), 0);
        memcpy(want + nw, ids, (size_t)k * sizeof *ids);
        nw += (size_t)k;
        free(ids);
        memcpy(text + len, unit, (size_t)n);
        len += (size_t)n;
    }
    int32_t *ids;
    int k;
    assert_int_equal(tok_encode(t, text, len, 0, 0, &ids, &k, &e), 0);
    assert_int_equal((size_t)k, nw);
    assert_memory_equal(ids, want, nw * sizeof *ids);
    free(ids);
    free(want);
    free(text);
    tok_free(t);
}

/* SentencePiece byte tokens spell characters a byte at a time: the stream holds them until
 * the character is whole, and a character cut short becomes U+FFFD, each byte emitted once. */
static void stream_assembles_byte_tokens_and_replaces_broken_characters(void **st) {
    vocab v;
    tok_tokenizer *t = spm(&v, NULL);
    char out[64];
    tok_stream s;
    tok_stream_init(&s);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0xE2>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0x82>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0xAC>"), out, sizeof out), 3);
    assert_string_equal(out, "\xe2\x82\xac");
    /* F0 9F then "A": the 4-byte character never completes; one U+FFFD for both bytes */
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0xF0>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0x9F>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0x41>"), out, sizeof out), 4);
    assert_string_equal(out, "\xef\xbf\xbd"
                             "A");
    /* a stray continuation byte and a surrogate's start are one U+FFFD each */
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0x80>"), out, sizeof out), 3);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0xED>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0xA0>"), out, sizeof out), 6);
    assert_string_equal(out, "\xef\xbf\xbd\xef\xbf\xbd");
    /* a held start followed by a normal piece */
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "<0xC3>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, SP "hello"), out, sizeof out), 9);
    assert_string_equal(out, "\xef\xbf\xbd hello");
    /* control tokens add nothing, and too small a buffer cuts at a character */
    assert_int_equal(tok_stream_push(t, &s, vid(&v, "</s>"), out, sizeof out), 0);
    assert_int_equal(tok_stream_push(t, &s, vid(&v, SP "hello"), out, 4), 3);
    assert_string_equal(out, " he");
    tok_free(t);
}

/* One tokenizer, four threads encoding at once: each gets what it gets alone. */
typedef struct {
    tok_tokenizer *t;
    const char *text;
    int32_t *ids;
    int n, rc;
} job;

static void *encode_job(void *arg) {
    job *j = arg;
    md_err e = {0};
    for (int r = 0; r < 50 && !j->rc; r++) {
        free(j->ids);
        j->rc = tok_encode(j->t, j->text, strlen(j->text), 1, 1, &j->ids, &j->n, &e);
    }
    return NULL;
}

static void threads_share_one_tokenizer(void **st) {
    vocab v;
    tok_tokenizer *t = bpe(&v, "llama-bpe", 1);
    static char texts[4][8192];
    for (int k = 0; k < 4; k++) {
        size_t w = 0;
        for (int i = 0; w + 64 < sizeof texts[k]; i++)
            w += (size_t)snprintf(texts[k] + w, sizeof texts[k] - w, "%s%d (hello) it'S !!!\n",
                                  k % 2 ? "<|im_start|>" : " xyz ", i * (k + 1));
    }
    job jobs[4];
    pthread_t th[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (job){t, texts[k], NULL, 0, 0};
        assert_int_equal(pthread_create(&th[k], NULL, encode_job, &jobs[k]), 0);
    }
    for (int k = 0; k < 4; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(jobs[k].rc, 0);
        int32_t *ids;
        int n;
        md_err e = {0};
        assert_int_equal(tok_encode(t, texts[k], strlen(texts[k]), 1, 1, &ids, &n, &e), 0);
        assert_int_equal(n, jobs[k].n);
        assert_memory_equal(ids, jobs[k].ids, (size_t)n * sizeof *ids);
        free(ids);
        free(jobs[k].ids);
    }
    tok_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(spm_merges_by_score_and_prefixes_a_space),
        cmocka_unit_test(spm_falls_back_to_byte_tokens_even_for_invalid_utf8),
        cmocka_unit_test(gpt2_splits_contractions_words_numbers_and_space_runs),
        cmocka_unit_test(smollm_and_qwen2_split_every_digit),
        cmocka_unit_test(llama3_groups_three_digits_and_ignores_merges_for_whole_tokens),
        cmocka_unit_test(default_pre_tokenizer_splits_punctuation_first),
        cmocka_unit_test(bpe_merges_through_strings_that_are_not_tokens),
        cmocka_unit_test(bpe_special_and_user_defined_tokens),
        cmocka_unit_test(bpe_invalid_utf8_becomes_replacement_characters),
        cmocka_unit_test(loader_refuses_bad_vocabularies_with_a_sentence),
        cmocka_unit_test(random_bytes_and_ids_never_crash_and_decode_to_valid_utf8),
        cmocka_unit_test(chat_templates_are_recognised_from_their_text),
        cmocka_unit_test(long_texts_give_the_same_ids_as_short_ones),
        cmocka_unit_test(stream_assembles_byte_tokens_and_replaces_broken_characters),
        cmocka_unit_test(threads_share_one_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
