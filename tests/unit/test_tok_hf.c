/* test_tok_hf.c — tokenizer.json loading (engine/tokenizer/tokenizer_hf.c) on small hand-written files:
 * what a valid file encodes to, tokenizer_config.json's tokens and chat template, the chat
 * template choice (--chat-template), and hostile files: each one refused with the JSON path
 * and the value in the message, never a crash (this test also runs under ASan+UBSan).
 * Agreement with Hugging Face's own library on real vocabularies is tok_hf_match.py. */
#define _GNU_SOURCE /* strndup, mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/tokenizer/tokenizer.h"

/* Byte-level BPE: "hello" in four merges (string and pair forms), a space, a special token. */
#define VOCAB                                                                                      \
    "{\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3, \"\xc4\xa0\": 4, \"he\": 5, \"ll\": 6, "             \
    "\"hell\": 7, \"hello\": 8, \"<|end|>\": 9, \"1\": 10, \"2\": 11}"
#define MERGES "[\"h e\", \"l l\", [\"he\", \"ll\"], \"hell o\"]"
#define ADDED "[{\"id\": 9, \"content\": \"<|end|>\", \"special\": true}]"
#define PRE                                                                                        \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", \"individual_digits\": "  \
    "true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}]}"

#define DOC_FMT                                                                                    \
    "{\"version\": \"1.0\", \"added_tokens\": %s, \"normalizer\": %s, \"pre_tokenizer\": %s, "     \
    "\"post_processor\": %s, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": "       \
    "\"BPE\", "                                                                                    \
    "%s\"vocab\": %s, \"merges\": %s}}"

/* A tokenizer.json from its parts (malloc'd). */
static char *doc(const char *model_extra, const char *vocab, const char *merges, const char *added,
                 const char *pre, const char *norm, const char *post) {
    int n = snprintf(NULL, 0, DOC_FMT, added, norm, pre, post, model_extra, vocab, merges);
    char *out = malloc((size_t)n + 1);
    assert_non_null(out);
    snprintf(out, (size_t)n + 1, DOC_FMT, added, norm, pre, post, model_extra, vocab, merges);
    return out;
}

static char *good(void) {
    return doc("", VOCAB, MERGES, ADDED, PRE, "null", "null");
}

static tok_tokenizer *load_ok(const char *json, const char *cfg) {
    tok_tokenizer *t = NULL;
    md_err e = {0};
    if (tok_load_hf_mem(json, strlen(json), cfg, cfg ? strlen(cfg) : 0, &t, &e))
        fail_msg("load: %s", e.msg);
    return t;
}

static void expect_ids(const tok_tokenizer *t, const char *text, int special, const int32_t *want,
                       int n_want) {
    int32_t *ids;
    int n;
    md_err e = {0};
    assert_int_equal(tok_encode(t, text, strlen(text), 1, special, &ids, &n, &e), 0);
    if (n != n_want || memcmp(ids, want, (size_t)n * sizeof *ids)) {
        fprintf(stderr, "'%s': got", text);
        for (int i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
        fail_msg("ids differ for '%s'", text);
    }
    free(ids);
}

static void byte_level_bpe_merges_both_merge_forms_and_splits_digits(void **st) {
    char *j = good();
    tok_tokenizer *t = load_ok(j, NULL);
    assert_int_equal(tok_n_vocab(t), 12);
    assert_string_equal(tok_model_name(t), "hf-bpe");
    expect_ids(t, "hello hello<|end|>12", 1, (int32_t[]){8, 4, 8, 9, 10, 11}, 6);
    /* without special-token parsing the text <|end|> is not a token; the bytes that are not
     * in this vocabulary are dropped, as Hugging Face drops them: "e" is left */
    expect_ids(t, "hello<|end|>", 0, (int32_t[]){8, 1}, 2);
    size_t len;
    assert_memory_equal(tok_piece(t, 4, 1, &len), " ", 1);
    tok_free(t);
    free(j);
}

static void config_gives_bos_eos_add_bos_and_the_chat_template(void **st) {
    char *j = good();
    const char *cfg = "{\"bos_token\": {\"content\": \"h\"}, \"eos_token\": \"<|end|>\", "
                      "\"add_bos_token\": true, \"chat_template\": [{\"name\": \"tool_use\", "
                      "\"template\": \"x\"}, {\"name\": \"default\", \"template\": "
                      "\"{{ '<|im_start|>' + m }}\"}]}";
    tok_tokenizer *t = load_ok(j, cfg);
    assert_int_equal(tok_bos(t), 0);
    assert_int_equal(tok_eos(t), 9);
    assert_true(tok_is_eog(t, 9));
    assert_true(tok_add_bos(t));
    expect_ids(t, "hello", 1, (int32_t[]){0, 8}, 2);
    assert_int_equal(tok_chat_template(t), TOK_TMPL_CHATML);
    tok_free(t);
    free(j);
}

static void template_processing_adds_bos_and_metaspace_char_level_falls_back_to_bytes(void **st) {
    const char *vocab = "{\"<unk>\": 0, \"<s>\": 1, \"<0x41>\": 2, \"\xe2\x96\x81\": 3, \"a\": 4, "
                        "\"b\": 5, \"\xe2\x96\x81"
                        "a\": 6, \"ab\": 7, \"\xe2\x96\x81"
                        "ab\": 8}";
    const char *merges = "[[\"\xe2\x96\x81\", \"a\"], [\"\xe2\x96\x81"
                         "a\", \"b\"], [\"a\", \"b\"]]";
    const char *added = "[{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, "
                        "\"content\": \"<s>\", \"special\": true}]";
    const char *pre = "{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", "
                      "\"prepend_scheme\": \"first\", \"split\": false}";
    const char *post = "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                       "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
                       "\"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", "
                       "\"ids\": [1], \"tokens\": [\"<s>\"]}}}";
    char *j = doc("\"byte_fallback\": true, \"unk_token\": \"<unk>\", \"fuse_unk\": true, ", vocab,
                  merges, added, pre, "null", post);
    tok_tokenizer *t = load_ok(j, NULL);
    assert_string_equal(tok_model_name(t), "hf-char");
    /* "ab aAzz": ▁ab, ▁a, A by byte fallback, z z unknown and fused into one <unk> */
    expect_ids(t, "ab aAzz", 1, (int32_t[]){1, 8, 6, 2, 0}, 5);
    /* "first": no ▁ after a special token */
    expect_ids(t, "<s>ab", 1, (int32_t[]){1, 1, 7}, 3);
    size_t len;
    assert_memory_equal(tok_piece(t, 2, 1, &len), "A", 1);
    assert_memory_equal(tok_piece(t, 8, 1, &len), " ab", 3);
    tok_free(t);
    free(j);
}

static void chat_template_choice_is_checked_at_load(void **st) {
    char *j = good();
    tok_tokenizer *t = load_ok(j, "{\"chat_template\": \"{{ zephyr <|user|> }}\"}");
    md_err e = {0};
    assert_int_equal(tok_chat_choose(t, NULL, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "--chat-template"));
    assert_non_null(strstr(e.msg, "chatml, llama3, llama2, mistral, gemma"));
    assert_int_equal(tok_chat_choose(t, "vicuna", &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "'vicuna'"));
    assert_int_equal(tok_chat_choose(t, "gemma", &e), 0);
    assert_int_equal(tok_chat_template(t), TOK_TMPL_GEMMA);
    tok_chat_msg m[] = {{"system", "Be brief."}, {"user", " Hi "}};
    char *p = NULL;
    assert_int_equal(tok_chat_apply(t, m, 2, 1, &p, &e), 0);
    assert_string_equal(p, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                           "<start_of_turn>model\n");
    free(p);
    assert_int_equal(tok_chat_choose(t, "none", &e), 0);
    assert_int_equal(tok_chat_apply(t, m, 2, 1, &p, &e), MD_EUNSUPP);
    assert_non_null(strstr(e.msg, "raw prompt"));
    tok_free(t);
    /* a template medley knows, or none at all, is fine without a flag */
    t = load_ok(j, "{\"chat_template\": \"<start_of_turn>{{ m }}\"}");
    assert_int_equal(tok_chat_choose(t, NULL, &e), 0);
    assert_int_equal(tok_chat_template(t), TOK_TMPL_GEMMA);
    tok_free(t);
    t = load_ok(j, NULL);
    assert_int_equal(tok_chat_choose(t, NULL, &e), 0);
    tok_free(t);
    free(j);
}

typedef struct {
    const char *what;
    char *json; /* owned */
    const char *cfg;
    int code;
    const char *msg; /* a substring of the error */
} bad_case;

static void hostile_files_are_refused_naming_the_json_path(void **st) {
    const char *str_vocab = "{\"h\": \"0\"}";
    bad_case c[] = {
        {"truncated", NULL, NULL, MD_EFORMAT, "not valid JSON"},
        {"root array", strdup("[1, 2]"), NULL, MD_EFORMAT, "tokenizer.json: is an array"},
        {"no model", strdup("{\"version\": \"1.0\"}"), NULL, MD_EFORMAT, "has no model"},
        {"unigram", strdup("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}"), NULL, MD_EUNSUPP,
         "model.type 'Unigram' is not supported"},
        {"vocab array", doc("", "[]", MERGES, ADDED, PRE, "null", "null"), NULL, MD_EFORMAT,
         "model.vocab is an array"},
        {"vocab string id", doc("", str_vocab, "[]", "[]", "null", "null", "null"), NULL,
         MD_EFORMAT, "model.vocab ['h'] is a string"},
        {"huge id", doc("", "{\"h\": 4000000000}", "[]", "[]", "null", "null", "null"), NULL,
         MD_ERANGE, "= 4000000000 is not an id"},
        {"negative id", doc("", "{\"h\": -1}", "[]", "[]", "null", "null", "null"), NULL, MD_ERANGE,
         "= -1 is not an id"},
        {"duplicate id", doc("", "{\"h\": 0, \"e\": 0}", "[]", "[]", "null", "null", "null"), NULL,
         MD_EFORMAT, "gives id 0 to both"},
        {"gap",
         doc("", "{\"h\": 0, \"e\": 2}", "[]", "[{\"id\": 2, \"content\": \"e\"}]", "null", "null",
             "null"),
         NULL, MD_EFORMAT, "no token with id 1"},
        {"duplicate key", strdup("{\"model\": {\"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}"),
         NULL, MD_EFORMAT, "duplicate object key"},
        {"merge unknown", doc("", VOCAB, "[\"h x\"]", ADDED, PRE, "null", "null"), NULL, MD_EFORMAT,
         "model.merges[0] 'x' is not in model.vocab"},
        {"merge result unknown", doc("", VOCAB, "[\"e h\"]", ADDED, PRE, "null", "null"), NULL,
         MD_EFORMAT, "model.merges[0] makes 'eh', which is not in model.vocab"},
        {"merge no space", doc("", VOCAB, "[\"he\"]", ADDED, PRE, "null", "null"), NULL, MD_EFORMAT,
         "model.merges[0] 'he' is not two tokens"},
        {"merge number", doc("", VOCAB, "[\"h e\", 7]", ADDED, PRE, "null", "null"), NULL,
         MD_EFORMAT, "model.merges[1] is an integer"},
        {"merge triple", doc("", VOCAB, "[[\"h\", \"e\", \"l\"]]", ADDED, PRE, "null", "null"),
         NULL, MD_EFORMAT, "model.merges[0] is an array"},
        {"merges object", doc("", VOCAB, "{}", ADDED, PRE, "null", "null"), NULL, MD_EFORMAT,
         "model.merges is an object"},
        {"bad regex",
         doc("", VOCAB, MERGES, ADDED,
             "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(ab\"}, \"behavior\": \"Isolated\"}",
             "null", "null"),
         NULL, MD_EFORMAT, "pre_tokenizer.pattern regex: missing closing parenthesis"},
        {"whitespace",
         doc("", VOCAB, MERGES, ADDED,
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"ByteLevel\", "
             "\"add_prefix_space\": false}, {\"type\": \"Whitespace\"}]}",
             "null", "null"),
         NULL, MD_EUNSUPP, "pre_tokenizer.pretokenizers[1].type 'Whitespace' is not supported"},
        {"split behavior",
         doc("", VOCAB, MERGES, ADDED,
             "{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": \"Bogus\"}",
             "null", "null"),
         NULL, MD_EUNSUPP, "behavior 'Bogus'"},
        {"metaspace two chars",
         doc("", VOCAB, MERGES, ADDED, "{\"type\": \"Metaspace\", \"replacement\": \"ab\"}", "null",
             "null"),
         NULL, MD_EFORMAT, "replacement 'ab' is not one character"},
        {"lowercase", doc("", VOCAB, MERGES, ADDED, PRE, "{\"type\": \"Lowercase\"}", "null"), NULL,
         MD_EUNSUPP, "normalizer.type 'Lowercase' is not supported"},
        {"normalizer no type", doc("", VOCAB, MERGES, ADDED, PRE, "{}", "null"), NULL, MD_EFORMAT,
         "normalizer has no 'type'"},
        {"type number", doc("", VOCAB, MERGES, ADDED, "{\"type\": 3}", "null", "null"), NULL,
         MD_EFORMAT, "pre_tokenizer 'type' is an integer"},
        {"bert post", doc("", VOCAB, MERGES, ADDED, PRE, "null", "{\"type\": \"BertProcessing\"}"),
         NULL, MD_EFORMAT, "post_processor 'cls' is missing, expected [\"token\", id]"},
        {"roberta post",
         doc("", VOCAB, MERGES, ADDED, PRE, "null", "{\"type\": \"RobertaProcessing\"}"), NULL,
         MD_EUNSUPP, "post_processor.type 'RobertaProcessing'"},
        {"added mismatch",
         doc("", VOCAB, MERGES, "[{\"id\": 0, \"content\": \"x\", \"special\": true}]", PRE, "null",
             "null"),
         NULL, MD_EFORMAT, "added_tokens[0] gives id 0 to 'x', which is 'h' already"},
        {"added id string",
         doc("", VOCAB, MERGES, "[{\"id\": \"9\", \"content\": \"x\"}]", PRE, "null", "null"), NULL,
         MD_EFORMAT, "added_tokens[0] 'id' is a string"},
        {"added twice",
         doc("", VOCAB, MERGES,
             "[{\"id\": 12, \"content\": \"<x>\"}, {\"id\": 13, \"content\": \"<x>\"}]", PRE,
             "null", "null"),
         NULL, MD_EFORMAT, "give '<x>' two ids"},
        {"added special string",
         doc("", VOCAB, MERGES, "[{\"id\": 9, \"content\": \"<|end|>\", \"special\": \"yes\"}]",
             PRE, "null", "null"),
         NULL, MD_EFORMAT, "added_tokens[0] 'special' is a string, expected true or false"},
        {"byte_fallback string",
         doc("\"byte_fallback\": \"no\", ", VOCAB, MERGES, ADDED, PRE, "null", "null"), NULL,
         MD_EFORMAT, "model 'byte_fallback' is a string"},
        {"unk unknown",
         doc("\"unk_token\": \"<unk>\", ", VOCAB, MERGES, ADDED, PRE, "null", "null"), NULL,
         MD_EFORMAT, "model.unk_token '<unk>' is not in model.vocab"},
        {"dropout", doc("\"dropout\": 0.1, ", VOCAB, MERGES, ADDED, PRE, "null", "null"), NULL,
         MD_EUNSUPP, "model.dropout"},
        {"deep",
         doc("", VOCAB, MERGES, ADDED,
             "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Sequence\", "
             "\"pretokenizers\": [{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
             "\"Sequence\", \"pretokenizers\": [{\"type\": \"Sequence\", \"pretokenizers\": "
             "[{\"type\": \"Sequence\", \"pretokenizers\": []}]}]}]}]}]}",
             "null", "null"),
         NULL, MD_EUNSUPP, "nests Sequences too deep"},
        {"config bos unknown", good(), "{\"bos_token\": \"<s>\"}", MD_EFORMAT,
         "tokenizer_config.json: bos_token '<s>' is not in the vocabulary"},
        {"config not json", good(), "{\"bos_token\": ", MD_EFORMAT,
         "tokenizer_config.json: not valid JSON"},
        {"config add_bos number", good(), "{\"add_bos_token\": 1}", MD_EFORMAT,
         "tokenizer_config.json: 'add_bos_token' is a number"},
        {"config template number", good(), "{\"chat_template\": 5}", MD_EFORMAT,
         "chat_template is a number"},
    };
    char *g = good();
    c[0].json = strndup(g, strlen(g) / 2);
    free(g);
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        tok_tokenizer *t = (tok_tokenizer *)1;
        md_err e = {0};
        int rc = tok_load_hf_mem(c[i].json, strlen(c[i].json), c[i].cfg,
                                 c[i].cfg ? strlen(c[i].cfg) : 0, &t, &e);
        if (rc != c[i].code || t || !strstr(e.msg, c[i].msg))
            fail_msg("%s: rc %d (want %d), message '%s' (want '%s')", c[i].what, rc, c[i].code,
                     e.msg, c[i].msg);
        free(c[i].json);
    }
}

static void invalid_utf8_json_and_text_are_handled(void **st) {
    /* a tokenizer.json that is not UTF-8 is not JSON */
    char *g = good();
    size_t at = (size_t)(strstr(g, "\"hello\"") - g);
    g[at + 2] = (char)0xff;
    tok_tokenizer *t = NULL;
    md_err e = {0};
    assert_int_equal(tok_load_hf_mem(g, strlen(g), NULL, 0, &t, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "not valid JSON"));
    free(g);
    /* text that is not UTF-8 is repaired (U+FFFD per bad byte) and encoded, never a crash */
    g = good();
    t = load_ok(g, NULL);
    int32_t *ids;
    int n;
    assert_int_equal(tok_encode(t, "he\xff\xc3llo", 7, 1, 1, &ids, &n, &e), 0);
    free(ids);
    tok_free(t);
    free(g);
}

static void a_directory_or_file_path_is_read_and_a_missing_one_named(void **st) {
    char dir[] = "/tmp/medley-tokhf-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128], cfg[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    tok_tokenizer *t = NULL;
    md_err e = {0};
    assert_int_equal(tok_load_hf(dir, &t, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "tokenizer.json"));
    char *g = good();
    FILE *f = fopen(path, "w");
    fputs(g, f);
    fclose(f);
    f = fopen(cfg, "w");
    fputs("{\"eos_token\": \"<|end|>\", \"chat_template\": \"<|im_start|>\"}", f);
    fclose(f);
    assert_int_equal(tok_load_hf(dir, &t, &e), 0);
    assert_int_equal(tok_eos(t), 9);
    assert_int_equal(tok_chat_template(t), TOK_TMPL_CHATML);
    tok_free(t);
    assert_int_equal(tok_load_hf(path, &t, &e), 0);
    assert_int_equal(tok_eos(t), 9);
    tok_free(t);
    /* a broken config is an error naming its path */
    f = fopen(cfg, "w");
    fputs("{\"eos_token\": [1]}", f);
    fclose(f);
    assert_int_equal(tok_load_hf(dir, &t, &e), MD_EFORMAT);
    assert_non_null(strstr(e.msg, "tokenizer_config.json: eos_token is an array"));
    unlink(path);
    unlink(cfg);
    rmdir(dir);
    free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(byte_level_bpe_merges_both_merge_forms_and_splits_digits),
        cmocka_unit_test(config_gives_bos_eos_add_bos_and_the_chat_template),
        cmocka_unit_test(template_processing_adds_bos_and_metaspace_char_level_falls_back_to_bytes),
        cmocka_unit_test(chat_template_choice_is_checked_at_load),
        cmocka_unit_test(hostile_files_are_refused_naming_the_json_path),
        cmocka_unit_test(invalid_utf8_json_and_text_are_handled),
        cmocka_unit_test(a_directory_or_file_path_is_read_and_a_missing_one_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
