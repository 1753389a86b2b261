/* test_tok_wordpiece.c — BERT's WordPiece from a tokenizer.json
 * (engine/tokenizer/tokenizer_wordpiece.c) on a small hand-written vocabulary: each rule of
 * BertNormalizer (clean_text, Chinese characters, strip_accents and its null default,
 * lowercase), BertPreTokenizer, the longest-match WordPiece with its "##" prefix, unk for a
 * word with no cover or longer than max_input_chars_per_word, [CLS] ... [SEP] from both
 * post-processors, decoding; and hostile files (unknown model type, components BERT does
 * not have, bad options), each refused with the JSON path. Runs under ASan+UBSan too.
 * Agreement with Hugging Face's library on the real all-MiniLM-L6-v2 vocabulary is
 * tok_wordpiece_match.py. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer.h"

/* ids: 0 [PAD] 1 [UNK] 2 [CLS] 3 [SEP] 4 un 5 ##aff 6 ##able 7 hello 8 ! 9 , 10 cafe 11 北
 * 12 京 13 a 14 ##b 15 ##c 16 i 17 ##̇ (U+0307) 18 caf 19 ##é 20 Hello 21 . 22 ab */
#define VOCAB                                                                                      \
    "{\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"un\": 4, \"##aff\": 5, "           \
    "\"##able\": 6, \"hello\": 7, \"!\": 8, \",\": 9, \"cafe\": 10, \"\xe5\x8c\x97\": 11, "        \
    "\"\xe4\xba\xac\": 12, \"a\": 13, \"##b\": 14, \"##c\": 15, \"i\": 16, \"##\xcc\x87\": 17, "   \
    "\"caf\": 18, \"##\xc3\xa9\": 19, \"Hello\": 20, \".\": 21, \"ab\": 22}"
#define ADDED                                                                                      \
    "[{\"id\": 0, \"content\": \"[PAD]\", \"special\": true}, {\"id\": 1, \"content\": "           \
    "\"[UNK]\", \"special\": true}, {\"id\": 2, \"content\": \"[CLS]\", \"special\": true}, "      \
    "{\"id\": 3, \"content\": \"[SEP]\", \"special\": true}]"
#define NORM_LOWER                                                                                 \
    "{\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "        \
    "\"strip_accents\": null, \"lowercase\": true}"
#define NORM_CASED                                                                                 \
    "{\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "        \
    "\"strip_accents\": null, \"lowercase\": false}"
#define TEMPLATE                                                                                   \
    "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"[CLS]\", "      \
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": "       \
    "{\"id\": \"[SEP]\", \"type_id\": 0}}], \"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", "  \
    "\"ids\": [2], \"tokens\": [\"[CLS]\"]}, \"[SEP]\": {\"id\": \"[SEP]\", \"ids\": [3], "        \
    "\"tokens\": [\"[SEP]\"]}}}"
#define BERTPROC "{\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 3], \"cls\": [\"[CLS]\", 2]}"
#define PRE "{\"type\": \"BertPreTokenizer\"}"
#define DECODER "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}"

#define DOC_FMT                                                                                    \
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, \"added_tokens\": " ADDED     \
    ", \"normalizer\": %s, \"pre_tokenizer\": %s, \"post_processor\": %s, \"decoder\": %s, "       \
    "\"model\": {\"type\": \"WordPiece\", %s\"vocab\": " VOCAB "}}"
#define STD "\"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "

static char *doc(const char *norm, const char *pre, const char *post, const char *dec,
                 const char *model_extra) {
    int n = snprintf(NULL, 0, DOC_FMT, norm, pre, post, dec, model_extra);
    char *out = malloc((size_t)n + 1);
    assert_non_null(out);
    snprintf(out, (size_t)n + 1, DOC_FMT, norm, pre, post, dec, model_extra);
    return out;
}

static tok_tokenizer *load(const char *norm, const char *post, const char *extra) {
    char *j = doc(norm, PRE, post, DECODER, extra);
    tok_tokenizer *t = NULL;
    md_err e = {0};
    if (tok_load_hf_mem(j, strlen(j), NULL, 0, &t, &e))
        fail_msg("load: %s", e.msg);
    free(j);
    return t;
}

static void expect(const tok_tokenizer *t, const char *text, int add, const int32_t *want,
                   int n_want) {
    int32_t *ids;
    int n;
    md_err e = {0};
    if (tok_encode(t, text, strlen(text), add, 1, &ids, &n, &e))
        fail_msg("encode '%s': %s", text, e.msg);
    int same = n == n_want;
    for (int i = 0; same && i < n; i++)
        same = ids[i] == want[i];
    if (!same) {
        char got[512] = "";
        size_t w = 0;
        for (int i = 0; i < n && w < sizeof got - 16; i++)
            w += (size_t)snprintf(got + w, sizeof got - w, "%d ", ids[i]);
        fail_msg("encode '%s': got [%s], %d ids (want %d)", text, got, n, n_want);
    }
    free(ids);
}

#define EXPECT(t, text, add, ...)                                                                  \
    do {                                                                                           \
        const int32_t w_[] = {__VA_ARGS__};                                                        \
        expect(t, text, add, w_, (int)(sizeof w_ / sizeof *w_));                                   \
    } while (0)

static void normalizer_pretokenizer_and_longest_match(void **st) {
    (void)st;
    tok_tokenizer *t = load(NORM_LOWER, TEMPLATE, STD);
    assert_string_equal(tok_model_name(t), "hf-wordpiece");
    assert_int_equal(tok_bos(t), 2);
    assert_int_equal(tok_eos(t), 3);
    EXPECT(t, "unaffable", 1, 2, 4, 5, 6, 3);
    EXPECT(t, "unaffable", 0, 4, 5, 6);
    EXPECT(t, "", 1, 2, 3);
    /* lowercase, then punctuation is its own word, whitespace of every kind splits */
    EXPECT(t, "HELLO!,\t\xe3\x80\x80hello\xc2\x85.", 0, 7, 8, 9, 7, 21);
    /* strip_accents null follows lowercase: café -> cafe */
    EXPECT(t, "Caf\xc3\xa9", 0, 10);
    /* clean_text drops NUL, U+FFFD, controls and format characters (U+200B is Cf) */
    EXPECT(t, "he\x01l\xe2\x80\x8blo\xef\xbf\xbd", 0, 7);
    /* invalid UTF-8 becomes U+FFFD, which clean_text drops */
    EXPECT(t, "hel\xfflo\xc3", 0, 7);
    /* CJK ideographs are words of their own */
    EXPECT(t, "a\xe5\x8c\x97\xe4\xba\xac", 0, 13, 11, 12);
    /* greedy: "ab" is a token, then "##c"; "abc" with no cover is one unk */
    EXPECT(t, "abc", 0, 22, 15);
    EXPECT(t, "abx hello", 0, 1, 7);
    /* U+0130: NFD is I + U+0307, the mark goes, I lowercases */
    EXPECT(t, "\xc4\xb0", 0, 16);
    /* special tokens in the text */
    EXPECT(t, "hello[SEP]hello", 0, 7, 3, 7);
    tok_free(t);
}

static void max_chars_cased_and_bert_processing(void **st) {
    (void)st;
    tok_tokenizer *t = load(NORM_CASED, BERTPROC, STD "\"max_input_chars_per_word\": 4, ");
    EXPECT(t, "Hello", 1, 2, 1, 3);            /* 5 characters > 4: unk */
    EXPECT(t, "caf\xc3\xa9", 1, 2, 18, 19, 3); /* cased: the accent stays */
    EXPECT(t, "ab ab", 0, 22, 22);
    tok_free(t);
    /* lowercase without strip_accents: U+0130 lowercases to i + U+0307, which stays */
    t = load("{\"type\": \"BertNormalizer\", \"strip_accents\": false}", TEMPLATE, STD);
    EXPECT(t, "\xc4\xb0", 0, 16, 17);
    EXPECT(t, "caf\xc3\xa9", 0, 18, 19);
    tok_free(t);
}

static void decode_as_the_wordpiece_decoder(void **st) {
    (void)st;
    tok_tokenizer *t = load(NORM_LOWER, TEMPLATE, STD);
    const int32_t ids[] = {2, 4, 5, 6, 9, 7, 21, 3};
    char *s;
    size_t n;
    md_err e = {0};
    assert_int_equal(tok_decode(t, ids, 8, 0, &s, &n, &e), 0);
    assert_string_equal(s, "unaffable, hello.");
    free(s);
    assert_int_equal(tok_decode(t, ids, 8, 1, &s, &n, &e), 0);
    assert_string_equal(s, "[CLS] unaffable, hello. [SEP]");
    free(s);
    const int32_t cont[] = {5, 7};
    assert_int_equal(tok_decode(t, cont, 2, 0, &s, &n, &e), 0);
    assert_string_equal(s, "##aff hello"); /* a first continuation keeps its prefix */
    free(s);
    /* streaming gives the same text */
    tok_stream ts;
    tok_stream_init(&ts);
    char out[64], all[256] = "";
    for (int i = 0; i < 8; i++) {
        tok_stream_push(t, &ts, ids[i], out, sizeof out);
        strcat(all, out);
    }
    assert_string_equal(all, "unaffable, hello.");
    tok_free(t);
}

/* A special added token missing from model.vocab: split out of the text when special tokens
 * are parsed, never a WordPiece piece when they are not (ids checked with tokenizers). */
static void added_tokens_outside_the_vocab_are_not_pieces(void **st) {
    (void)st;
    const char *j =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"[UNK]\", \"special\": true}, {\"id\": 3, "
        "\"content\": \"zz\", \"special\": true}], \"normalizer\": null, \"pre_tokenizer\": "
        "{\"type\": \"BertPreTokenizer\"}, \"post_processor\": null, \"decoder\": null, "
        "\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": {\"[UNK]\": 0, "
        "\"z\": 1, \"##z\": 2}}}";
    tok_tokenizer *t = NULL;
    md_err e = {0};
    assert_int_equal(tok_load_hf_mem(j, strlen(j), NULL, 0, &t, &e), 0);
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(t, "zz a", 4, 1, 0, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 0);
    free(ids);
    EXPECT(t, "zz a", 1, 3, 0);
    tok_free(t);
}

typedef struct {
    const char *what;
    char *json;
    int code;
    const char *msg;
} bad_case;

static void hostile_files_are_refused_naming_the_json_path(void **st) {
    (void)st;
    bad_case c[] = {
        {"unknown model", strdup("{\"model\": {\"type\": \"Morpheme\", \"vocab\": {}}}"),
         MD_EUNSUPP, "model.type 'Morpheme' is not supported (medley reads BPE, WordPiece)"},
        {"unk missing", doc(NORM_LOWER, PRE, TEMPLATE, DECODER, "\"unk_token\": \"<unk>\", "),
         MD_EFORMAT, "model.unk_token '<unk>' is not in model.vocab"},
        {"max chars string",
         doc(NORM_LOWER, PRE, TEMPLATE, DECODER, STD "\"max_input_chars_per_word\": \"9\", "),
         MD_EFORMAT, "model.max_input_chars_per_word is a string"},
        {"prefix number",
         doc(NORM_LOWER, PRE, TEMPLATE, DECODER, "\"continuing_subword_prefix\": 5, "), MD_EFORMAT,
         "'continuing_subword_prefix' is an integer"},
        {"lowercase string",
         doc("{\"type\": \"BertNormalizer\", \"lowercase\": \"yes\"}", PRE, TEMPLATE, DECODER, STD),
         MD_EFORMAT, "normalizer 'lowercase' is a string"},
        {"nfc with wordpiece", doc("{\"type\": \"NFC\"}", PRE, TEMPLATE, DECODER, STD), MD_EUNSUPP,
         "normalizer.type 'NFC' is not supported with a WordPiece model"},
        {"whitespace pre", doc(NORM_LOWER, "{\"type\": \"Whitespace\"}", TEMPLATE, DECODER, STD),
         MD_EUNSUPP, "pre_tokenizer.type 'Whitespace' is not supported with a WordPiece model"},
        {"bytelevel decoder", doc(NORM_LOWER, PRE, TEMPLATE, "{\"type\": \"ByteLevel\"}", STD),
         MD_EUNSUPP, "decoder.type 'ByteLevel' is not supported with a WordPiece model"},
        {"bert post bad id",
         doc(NORM_LOWER, PRE,
             "{\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 9], \"cls\": [\"[CLS]\", 2]}",
             DECODER, STD),
         MD_EFORMAT, "'sep' ['[SEP]', 9] is not that token"},
        {"two normalizers",
         doc("{\"type\": \"Sequence\", \"normalizers\": [" NORM_LOWER ", " NORM_LOWER "]}", PRE,
             TEMPLATE, DECODER, STD),
         MD_EUNSUPP, "a second BertNormalizer"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        tok_tokenizer *t = (tok_tokenizer *)1;
        md_err e = {0};
        int rc = tok_load_hf_mem(c[i].json, strlen(c[i].json), NULL, 0, &t, &e);
        if (rc != c[i].code || t || !strstr(e.msg, c[i].msg))
            fail_msg("%s: rc %d (want %d), message '%s' (want '%s')", c[i].what, rc, c[i].code,
                     e.msg, c[i].msg);
        free(c[i].json);
    }
}

/* A 10 MB word with no spaces: one unk, memory bounded by max_input_chars_per_word. */
static void a_huge_word_is_one_unk(void **st) {
    (void)st;
    tok_tokenizer *t = load(NORM_LOWER, TEMPLATE, STD);
    size_t n = 10u << 20;
    char *s = malloc(n + 1);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++)
        s[i] = (char)('a' + i % 3);
    s[n] = '\0';
    EXPECT(t, s, 1, 2, 1, 3);
    free(s);
    tok_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(normalizer_pretokenizer_and_longest_match),
        cmocka_unit_test(max_chars_cased_and_bert_processing),
        cmocka_unit_test(decode_as_the_wordpiece_decoder),
        cmocka_unit_test(added_tokens_outside_the_vocab_are_not_pieces),
        cmocka_unit_test(hostile_files_are_refused_naming_the_json_path),
        cmocka_unit_test(a_huge_word_is_one_unk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
