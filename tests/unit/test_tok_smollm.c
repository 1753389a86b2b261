/* test_tok_smollm.c — SmolLM2's tokenizer (byte-level BPE, "smollm" pre-tokenizer) against
 * llama.cpp on the fixture corpus tests/fixtures/tokenizer/smollm2_corpus.json (312 texts,
 * made by make_fixture.py there), plus decoding, streaming, EOG and the chat template on the
 * real vocabulary. Needs the SmolLM2-135M-Instruct GGUF (skipped when it is not fetched), so
 * it is labelled e2e although it runs in well under a second. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/weights/gguf.h"
#include "engine/tokenizer/tokenizer.h"

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static const char *model_path(void) {
    static char path[4096];
    const char *d = getenv("MEDLEY_MODELS"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (d && *d)
        snprintf(path, sizeof path, "%s/%s", d, MODEL_FILE);
    else if (x && *x)
        snprintf(path, sizeof path, "%s/medley/models/%s", x, MODEL_FILE);
    else
        snprintf(path, sizeof path, "%s/.cache/medley/models/%s", h ? h : ".", MODEL_FILE);
    return access(path, R_OK) == 0 ? path : NULL;
}

static tok_tokenizer *g_tok;

static int setup(void **st) {
    const char *p = model_path();
    if (!p) {
        fprintf(stderr,
                "test_tok_smollm: %s not fetched (scripts/fetch-model.sh); skipping its tests\n",
                MODEL_FILE);
        return 0;
    }
    gguf_file *f;
    md_err e = {0};
    if (gguf_open(p, &f, &e) || tok_load(f, &g_tok, &e)) {
        fprintf(stderr, "loading %s: %s\n", p, e.msg);
        return -1;
    }
    gguf_close(f);
    return 0;
}

static int teardown(void **st) {
    tok_free(g_tok);
    return 0;
}

#define NEED_MODEL()                                                                               \
    do {                                                                                           \
        if (!g_tok)                                                                                \
            skip();                                                                                \
    } while (0)

static unsigned char *case_bytes(json_t *c, size_t *n) {
    json_t *t = json_object_get(c, "text");
    if (t) {
        *n = json_string_length(t);
        unsigned char *b = malloc(*n + 1);
        memcpy(b, json_string_value(t), *n);
        return b;
    }
    const char *hex = json_string_value(json_object_get(c, "hex"));
    *n = strlen(hex) / 2;
    unsigned char *b = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    return b;
}

static int same_ids(const int32_t *a, int na, json_t *want, int idx, const char *what) {
    size_t nw = json_array_size(want);
    int ok = (size_t)na == nw;
    for (size_t i = 0; ok && i < nw; i++)
        ok = a[i] == json_integer_value(json_array_get(want, i));
    if (!ok) {
        fprintf(stderr, "case %d (%s): medley", idx, what);
        for (int i = 0; i < na; i++)
            fprintf(stderr, " %d", a[i]);
        fprintf(stderr, "\n   llama.cpp");
        for (size_t i = 0; i < nw; i++)
            fprintf(stderr, " %lld", json_integer_value(json_array_get(want, i)));
        fprintf(stderr, "\n");
    }
    return ok;
}

/* ---- other tokenizer families, checked against llama.cpp too (make_variants.py) ---- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
} gw;

static void put(gw *g, const void *d, size_t n) {
    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2 + 4096;
        g->p = realloc(g->p, g->cap);
    }
    memcpy(g->p + g->n, d, n);
    g->n += n;
}
static void put_u32(gw *g, uint32_t v) {
    put(g, &v, 4);
}
static void put_u64(gw *g, uint64_t v) {
    put(g, &v, 8);
}
static void put_str(gw *g, const char *s, size_t n) {
    put_u64(g, n);
    put(g, s, n);
}
static void put_key(gw *g, const char *k, uint32_t type) {
    put_str(g, k, strlen(k));
    put_u32(g, type);
    g->n_kv++;
}

/* The tensor-less GGUF make_variants.py writes: SmolLM2's vocabulary with another pre. */
static gw relabel(gguf_file *m, const char *pre) {
    gw g = {0};
    put(&g, "GGUF", 4);
    put_u32(&g, 3);
    put_u64(&g, 0);
    put_u64(&g, 0);
    put_key(&g, "general.architecture", GGUF_T_STRING);
    put_str(&g, "llama", 5);
    put_key(&g, "tokenizer.ggml.model", GGUF_T_STRING);
    put_str(&g, "gpt2", 4);
    put_key(&g, "tokenizer.ggml.pre", GGUF_T_STRING);
    put_str(&g, pre, strlen(pre));
    const char *arrays[] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (int a = 0; a < 2; a++) {
        gguf_vtype et;
        uint64_t n;
        md_err e;
        assert_int_equal(gguf_get_arr(m, arrays[a], &et, &n, &e), 0);
        put_key(&g, arrays[a], GGUF_T_ARRAY);
        put_u32(&g, GGUF_T_STRING);
        put_u64(&g, n);
        for (uint64_t i = 0; i < n; i++) {
            const char *s;
            size_t l;
            assert_int_equal(gguf_arr_str(m, arrays[a], i, &s, &l, &e), 0);
            put_str(&g, s, l);
        }
    }
    gguf_vtype et;
    uint64_t n;
    const void *types;
    md_err e;
    assert_int_equal(gguf_get_arr(m, "tokenizer.ggml.token_type", &et, &n, &e), 0);
    assert_int_equal(gguf_arr_data(m, "tokenizer.ggml.token_type", &types, &e), 0);
    put_key(&g, "tokenizer.ggml.token_type", GGUF_T_ARRAY);
    put_u32(&g, GGUF_T_INT32);
    put_u64(&g, n);
    put(&g, types, n * 4);
    put_key(&g, "tokenizer.ggml.bos_token_id", GGUF_T_UINT32);
    put_u32(&g, 1);
    put_key(&g, "tokenizer.ggml.eos_token_id", GGUF_T_UINT32);
    put_u32(&g, 2);
    put_key(&g, "tokenizer.ggml.add_bos_token", GGUF_T_BOOL);
    put(&g, "", 1);
    memcpy(g.p + 16, &g.n_kv, 8);
    while (g.n % 32)
        put(&g, "", 1);
    return g;
}

static int corpus_against(tok_tokenizer *t, json_t *cases, json_t *want, const char *name) {
    int bad = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        size_t n;
        unsigned char *b = case_bytes(json_array_get(cases, i), &n);
        int32_t *ids;
        int nids;
        md_err e = {0};
        assert_int_equal(tok_encode(t, (char *)b, n, 1, 1, &ids, &nids, &e), 0);
        bad += !same_ids(ids, nids, json_array_get(want, i), (int)i, name);
        free(ids);
        free(b);
    }
    return bad;
}

static json_t *load_json(const char *name, size_t flags) {
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/tokenizer/%s", MEDLEY_FIXTURES, name);
    json_t *j = json_load_file(path, flags, &je);
    if (!j)
        fail_msg("fixture %s: %s (line %d)", path, je.text, je.line);
    return j;
}

/* gpt-2, llama-bpe (Llama 3), qwen2 and default pre-tokenizers on SmolLM2's vocabulary,
 * against llama.cpp's ids. */
static void other_bpe_pre_tokenizers_match_llama_cpp_exactly(void **st) {
    NEED_MODEL();
    json_t *doc = load_json("smollm2_corpus.json", JSON_ALLOW_NUL);
    json_t *var = load_json("variants_corpus.json", 0);
    json_t *cases = json_object_get(doc, "cases");
    assert_int_equal(json_integer_value(json_object_get(var, "cases")), json_array_size(cases));
    gguf_file *m;
    md_err e = {0};
    assert_int_equal(gguf_open(model_path(), &m, &e), 0);
    const char *pres[] = {"gpt-2", "llama-bpe", "qwen2", "default"};
    int bad = 0;
    for (int k = 0; k < 4; k++) {
        gw g = relabel(m, pres[k]);
        gguf_file *f;
        tok_tokenizer *t;
        assert_int_equal(gguf_open_mem(g.p, g.n, &f, &e), 0);
        assert_int_equal(tok_load(f, &t, &e), 0);
        gguf_close(f);
        assert_string_equal(tok_pre_name(t), pres[k]);
        bad += corpus_against(t, cases, json_object_get(var, pres[k]), pres[k]);
        tok_free(t);
        free(g.p);
    }
    gguf_close(m);
    json_decref(doc);
    json_decref(var);
    assert_int_equal(bad, 0);
}

/* A small SentencePiece vocabulary (spm_tiny.gguf, no model needed) against llama.cpp. */
static void sentencepiece_matches_llama_cpp_exactly(void **st) {
    json_t *doc = load_json("smollm2_corpus.json", JSON_ALLOW_NUL);
    json_t *var = load_json("variants_corpus.json", 0);
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/spm_tiny.gguf", MEDLEY_FIXTURES);
    gguf_file *f;
    tok_tokenizer *t;
    md_err e = {0};
    assert_int_equal(gguf_open(path, &f, &e), 0);
    assert_int_equal(tok_load(f, &t, &e), 0);
    gguf_close(f);
    assert_string_equal(tok_model_name(t), "llama");
    int bad = corpus_against(t, json_object_get(doc, "cases"), json_object_get(var, "spm_tiny"),
                             "spm_tiny");
    tok_free(t);
    json_decref(doc);
    json_decref(var);
    assert_int_equal(bad, 0);
}

static void corpus_matches_llama_cpp_exactly(void **st) {
    NEED_MODEL();
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/smollm2_corpus.json", MEDLEY_FIXTURES);
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!doc)
        fail_msg("fixture %s: %s (line %d)", path, je.text, je.line);
    json_t *cases = json_object_get(doc, "cases");
    assert_true(json_array_size(cases) >= 200);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        size_t n;
        unsigned char *b = case_bytes(c, &n);
        int32_t *ids;
        int nids;
        md_err e = {0};
        assert_int_equal(tok_encode(g_tok, (char *)b, n, 1, 1, &ids, &nids, &e), 0);
        bad += !same_ids(ids, nids, json_object_get(c, "special"), (int)i, "special");
        free(ids);
        assert_int_equal(tok_encode(g_tok, (char *)b, n, 1, 0, &ids, &nids, &e), 0);
        bad += !same_ids(ids, nids, json_object_get(c, "plain"), (int)i, "plain");
        free(ids);
        free(b);
    }
    json_decref(doc);
    assert_int_equal(bad, 0);
}

/* Byte-level BPE loses nothing: decoding the tokens of valid UTF-8 gives the text back, and
 * streaming the same ids one at a time gives the same bytes. */
static void decode_and_stream_round_trip_valid_text(void **st) {
    NEED_MODEL();
    const char *texts[] = {
        "Hello world",
        "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 "
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
        "  spaces\n\n\ttabs  ",
        "x=1;\r\ny=2",
        "\xd8\xa7\xd9\x84\xd8\xb9\xd8\xb1\xd8\xa8\xd9\x8a\xd8\xa9",
    };
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        int32_t *ids;
        int n;
        md_err e = {0};
        assert_int_equal(tok_encode(g_tok, texts[k], strlen(texts[k]), 0, 0, &ids, &n, &e), 0);
        char *dec;
        size_t len;
        assert_int_equal(tok_decode(g_tok, ids, n, 0, &dec, &len, &e), 0);
        assert_string_equal(dec, texts[k]);
        char acc[512] = "", out[512];
        tok_stream s;
        tok_stream_init(&s);
        for (int i = 0; i < n; i++) {
            size_t w = tok_stream_push(g_tok, &s, ids[i], out, sizeof out);
            assert_int_equal(w, strlen(out));
            strcat(acc, out);
        }
        assert_int_equal(tok_stream_flush(&s, out, sizeof out), 0);
        assert_string_equal(acc, texts[k]);
        free(dec);
        free(ids);
    }
}

/* " \xf0\x9f\x98\x80" is two tokens here, the emoji's bytes split between them: the stream
 * holds the first part back and never emits a broken character. */
static void stream_holds_a_character_split_over_tokens(void **st) {
    NEED_MODEL();
    int32_t *ids;
    int n;
    md_err e = {0};
    const char *txt = " \xf0\x9f\x98\x80";
    assert_int_equal(tok_encode(g_tok, txt, strlen(txt), 0, 0, &ids, &n, &e), 0);
    assert_int_equal(n, 2);
    char out[64];
    tok_stream s;
    tok_stream_init(&s);
    assert_int_equal(tok_stream_push(g_tok, &s, ids[0], out, sizeof out), 1);
    assert_string_equal(out, " ");
    assert_true(s.n_pending > 0);
    assert_int_equal(tok_stream_push(g_tok, &s, ids[1], out, sizeof out), 4);
    assert_string_equal(out, "\xf0\x9f\x98\x80");
    /* the first part alone, then the end: U+FFFD, not raw bytes */
    tok_stream_init(&s);
    assert_int_equal(tok_stream_push(g_tok, &s, ids[0], out, sizeof out), 1);
    assert_int_equal(tok_stream_flush(&s, out, sizeof out), 3);
    assert_string_equal(out, "\xef\xbf\xbd");
    free(ids);
}

static void invalid_utf8_past_u10ffff_is_refused_with_its_offset(void **st) {
    NEED_MODEL();
    int32_t *ids = (int32_t *)1;
    int n = 7;
    md_err e = {0};
    const char bad[] = "ok \xf5\x80\x80\x80";
    assert_int_equal(tok_encode(g_tok, bad, sizeof bad - 1, 0, 0, &ids, &n, &e), MD_EINVAL);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_non_null(strstr(e.msg, "byte 3"));
}

static void eog_and_special_ids_follow_the_vocabulary(void **st) {
    NEED_MODEL();
    assert_int_equal(tok_n_vocab(g_tok), 49152);
    assert_int_equal(tok_bos(g_tok), 1);
    assert_int_equal(tok_eos(g_tok), 2);
    assert_false(tok_add_bos(g_tok));
    assert_true(tok_is_eog(g_tok, 2)); /* <|im_end|> */
    assert_true(tok_is_eog(g_tok, 0)); /* <|endoftext|> */
    assert_false(tok_is_eog(g_tok, 1));
    assert_false(tok_is_eog(g_tok, 19556));
    assert_false(tok_is_eog(g_tok, -1));
    assert_int_equal(tok_find(g_tok, "<|im_start|>", 12), 1);
    assert_string_equal(tok_pre_name(g_tok), "smollm");
    assert_string_equal(tok_model_name(g_tok), "gpt2");
    size_t len;
    tok_piece(g_tok, 2, 0, &len);
    assert_int_equal(len, 0); /* control tokens render nothing unless asked */
    assert_string_equal(tok_piece(g_tok, 2, 1, &len), "<|im_end|>");
}

static void smollm2_chat_template_is_chatml_with_its_default_system_turn(void **st) {
    NEED_MODEL();
    assert_int_equal(tok_chat_template(g_tok), TOK_TMPL_CHATML);
    tok_chat_msg m[] = {{"user", "Hi there"}};
    char *p;
    md_err e = {0};
    assert_int_equal(tok_chat_apply(g_tok, m, 1, 1, &p, &e), 0);
    assert_string_equal(p, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                           "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi "
                           "there<|im_end|>\n<|im_start|>assistant\n");
    free(p);
    tok_chat_msg m2[] = {{"system", "Be brief."}, {"user", "Hi"}};
    assert_int_equal(tok_chat_apply(g_tok, m2, 2, 0, &p, &e), 0);
    assert_string_equal(
        p, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    /* the rendered prompt tokenizes with its special tokens as single ids */
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(g_tok, p, strlen(p), 1, 1, &ids, &n, &e), 0);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[n - 1], 198);
    assert_int_equal(ids[n - 2], 2);
    free(ids);
    free(p);
}

/* SmolLM2's template as Jinja2 renders it (make_chat_fixture.py): 16 conversations. */
static void chat_template_matches_jinja(void **st) {
    NEED_MODEL();
    json_t *doc = load_json("chat_smollm2.json", 0);
    json_t *cases = json_object_get(doc, "cases");
    assert_true(json_array_size(cases) >= 16);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i), *ms = json_object_get(c, "messages");
        tok_chat_msg m[8];
        size_t n = json_array_size(ms);
        assert_true(n <= 8);
        for (size_t k = 0; k < n; k++) {
            m[k].role = json_string_value(json_object_get(json_array_get(ms, k), "role"));
            m[k].content = json_string_value(json_object_get(json_array_get(ms, k), "content"));
        }
        char *p;
        md_err e = {0};
        assert_int_equal(tok_chat_apply(g_tok, m, (int)n,
                                        json_is_true(json_object_get(c, "add_generation_prompt")),
                                        &p, &e),
                         0);
        assert_string_equal(p, json_string_value(json_object_get(c, "prompt")));
        free(p);
    }
    json_decref(doc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(corpus_matches_llama_cpp_exactly),
        cmocka_unit_test(other_bpe_pre_tokenizers_match_llama_cpp_exactly),
        cmocka_unit_test(sentencepiece_matches_llama_cpp_exactly),
        cmocka_unit_test(decode_and_stream_round_trip_valid_text),
        cmocka_unit_test(stream_holds_a_character_split_over_tokens),
        cmocka_unit_test(invalid_utf8_past_u10ffff_is_refused_with_its_offset),
        cmocka_unit_test(eog_and_special_ids_follow_the_vocabulary),
        cmocka_unit_test(smollm2_chat_template_is_chatml_with_its_default_system_turn),
        cmocka_unit_test(chat_template_matches_jinja),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
