/* test_tok_hf_fuzz.c — hostile tokenizer.json files, made by mutating valid ones: values
 * swapped for other types, huge and negative ids, keys deleted, components renamed, and raw
 * byte flips and truncations of the text. Every file must either load, and then encode and
 * decode texts (valid and invalid UTF-8) without a crash, or be refused with a message and no
 * tokenizer. Deterministic (fixed seed); run under ASan+UBSan by scripts/test.sh (label fuzz).
 * The libFuzzer target is tests/fuzz/fuzz_tok_hf.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer.h"
#include "fuzz/fuzz_tok.h"
#include "fuzz/fuzz_util.h"

static const char *const k_seeds[] = {
    /* byte-level: Digits + ByteLevel, string and pair merges, a special token */
    "{\"added_tokens\": [{\"id\": 9, \"content\": \"<|end|>\", \"special\": true, \"lstrip\": "
    "true, \"rstrip\": true, \"single_word\": false}], \"normalizer\": {\"type\": \"Sequence\", "
    "\"normalizers\": [{\"type\": \"NFC\"}]}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
    "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+|\\\\p{L}+\"}, "
    "\"behavior\": \"MergedWithPrevious\", \"invert\": false}, {\"type\": \"Digits\", "
    "\"individual_digits\": true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
    "\"use_regex\": true}]}, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
    "[{\"SpecialToken\": {\"id\": \"<|end|>\"}}, {\"Sequence\": {\"id\": \"A\"}}], "
    "\"special_tokens\": {\"<|end|>\": {\"ids\": [9]}}}, \"decoder\": {\"type\": \"ByteLevel\"}, "
    "\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"h\": 0, \"e\": 1, "
    "\"l\": 2, \"o\": 3, \"\xc4\xa0\": 4, \"he\": 5, \"ll\": 6, \"hell\": 7, \"hello\": 8, "
    "\"<|end|>\": 9, \"1\": 10, \"2\": 11}, \"merges\": [\"h e\", \"l l\", [\"he\", \"ll\"], "
    "\"hell o\"]}}",
    /* character-level: Metaspace, byte fallback, unk, Prepend/Replace normalizers */
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, "
    "\"content\": \"<s>\", \"special\": true}], \"normalizer\": {\"type\": \"Sequence\", "
    "\"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"}, {\"type\": "
    "\"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xe2\x96\x81\"}]}, "
    "\"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", "
    "\"prepend_scheme\": \"first\", \"split\": true}, \"post_processor\": null, \"decoder\": "
    "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\"}, {\"type\": "
    "\"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\"}]}, \"model\": {\"type\": "
    "\"BPE\", \"byte_fallback\": true, \"fuse_unk\": true, \"unk_token\": \"<unk>\", \"vocab\": "
    "{\"<unk>\": 0, \"<s>\": 1, \"<0x41>\": 2, \"\xe2\x96\x81\": 3, \"a\": 4, \"b\": 5, "
    "\"\xe2\x96\x81"
    "a\": 6, \"ab\": 7, \"\xe2\x96\x81"
    "ab\": 8}, \"merges\": [[\"\xe2\x96\x81\", \"a\"], [\"\xe2\x96\x81"
    "a\", \"b\"], \"a b\"]}}",
    /* WordPiece: BertNormalizer, BertPreTokenizer, [CLS] A [SEP], the WordPiece decoder */
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"[UNK]\", \"special\": true}, {\"id\": 1, "
    "\"content\": \"[CLS]\", \"special\": true}, {\"id\": 2, \"content\": \"[SEP]\", "
    "\"special\": true}], \"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, "
    "\"handle_chinese_chars\": true, \"strip_accents\": null, \"lowercase\": true}, "
    "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}, \"post_processor\": {\"type\": "
    "\"BertProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}, \"decoder\": "
    "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}, \"model\": {\"type\": "
    "\"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
    "\"max_input_chars_per_word\": 12, \"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, "
    "\"he\": 3, \"##llo\": 4, \"a\": 5, \"##b\": 6, \".\": 7, \"\xe5\x8c\x97\": 8, \"##\": "
    "9}}}",
};

static const char *const k_texts[] = {
    "hello hello<|end|>12",
    "ab aAzz <s>ab  \n\t x",
    "he\xff\xc3llo \xed\xa0\x80 e\xcc\x81",
    "",
    "                                                  ",
    "<|end|><|end|> <|end|>h",
    "[CLS]HELLO. ab\xcc\x81"
    "b \xe5\x8c\x97\xe4\xba\xac ##b abbbbbbbbbbbbbbbbbb\x01[SEP]",
};

static json_t *random_value(void) {
    static const char *const strs[] = {
        "",
        "x",
        "a b",
        "\xe2\x96\x81",
        "(",
        "[",
        "\\",
        "Sequence",
        "ByteLevel",
        "Split",
        "Metaspace",
        "Digits",
        "NFC",
        "Prepend",
        "Replace",
        "TemplateProcessing",
        "Isolated",
        "Removed",
        "MergedWithNext",
        "Contiguous",
        "first",
        "always",
        "BPE",
        "<|end|>",
        "h e",
    };
    switch (fuzz_below(10)) {
    case 0: return json_null();
    case 1: return json_boolean(fuzz_below(2));
    case 2: return json_integer((json_int_t)fuzz_below(16) - 2);
    case 3: return json_integer(fuzz_below(2) ? 4000000000LL : -4000000000LL);
    case 4: return json_real(fuzz_below(2) ? 1e308 : 0.5);
    case 5: return json_array();
    case 6: return json_object();
    case 7: {
        json_t *a = json_array();
        json_array_append_new(a, json_string(strs[fuzz_below(25)]));
        json_array_append_new(a, json_string(strs[fuzz_below(25)]));
        return a;
    }
    default: return json_string(strs[fuzz_below(25)]);
    }
}

/* Every node of v (containers and values) in walk order. */
static void collect(json_t *v, json_t ***nodes, size_t *n, size_t *cap) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *nodes = realloc(*nodes, *cap * sizeof **nodes);
        assert_non_null(*nodes);
    }
    (*nodes)[(*n)++] = v;
    const char *k;
    json_t *c;
    size_t i;
    if (json_is_object(v))
        json_object_foreach(v, k, c) collect(c, nodes, n, cap);
    else if (json_is_array(v))
        json_array_foreach(v, i, c) collect(c, nodes, n, cap);
}

/* One structural mutation of root: a child replaced, deleted or duplicated. */
static void mutate(json_t *root) {
    json_t **nodes = NULL;
    size_t n = 0, cap = 0;
    collect(root, &nodes, &n, &cap);
    json_t *pick = NULL;
    for (int tries = 0; tries < 8 && !pick; tries++) {
        json_t *c = nodes[fuzz_below(n)];
        if ((json_is_object(c) && json_object_size(c)) || (json_is_array(c) && json_array_size(c)))
            pick = c;
    }
    if (pick && json_is_object(pick)) {
        size_t k = fuzz_below(json_object_size(pick)), i = 0;
        const char *key;
        json_t *c;
        json_object_foreach(pick, key, c) {
            if (i++ != k)
                continue;
            char name[256];
            snprintf(name, sizeof name, "%s", key);
            if (fuzz_below(5) == 0)
                json_object_del(pick, name);
            else
                json_object_set_new(pick, name, random_value());
            break;
        }
    } else if (pick) {
        size_t k = fuzz_below(json_array_size(pick));
        switch (fuzz_below(3)) {
        case 0: json_array_remove(pick, k); break;
        case 1: json_array_append(pick, json_array_get(pick, k)); break;
        default: json_array_set_new(pick, k, random_value()); break;
        }
    }
    free(nodes);
}

/* Load; on success encode and decode every text, else insist on a message. */
static void try_load(const char *text, size_t len, const char *cfg) {
    tok_tokenizer *t = (tok_tokenizer *)1;
    md_err e = {0};
    int rc = tok_load_hf_mem(text, len, cfg, cfg ? strlen(cfg) : 0, &t, &e);
    if (rc) {
        if (t || !e.msg[0])
            fail_msg("refused without a message or with a tokenizer: %s", text);
        return;
    }
    tok_chat_choose(t, NULL, &e);
    fuzz_tok_roundtrip(t, k_texts, sizeof k_texts / sizeof *k_texts);
    tok_free(t);
}

static void mutated_documents_load_or_fail_cleanly(void **st) {
    int loaded = 0, total = 0;
    for (int s = 0; s < (int)(sizeof k_seeds / sizeof *k_seeds); s++) {
        json_error_t je;
        json_t *seed = json_loads(k_seeds[s], 0, &je);
        if (!seed)
            fail_msg("seed %d: %s", s, je.text);
        try_load(k_seeds[s], strlen(k_seeds[s]), NULL);
        for (int it = 0; it < 1500; it++) {
            json_t *doc = json_deep_copy(seed);
            for (int m = 1 + (int)fuzz_below(3); m > 0; m--)
                mutate(doc);
            char *text = json_dumps(doc, JSON_COMPACT);
            md_err e = {0};
            tok_tokenizer *t = NULL;
            if (tok_load_hf_mem(text, strlen(text), NULL, 0, &t, &e) == 0) {
                loaded++;
                tok_free(t);
            }
            try_load(text, strlen(text), fuzz_below(4) ? NULL : "{\"bos_token\": \"h\"}");
            total++;
            free(text);
            json_decref(doc);
        }
        json_decref(seed);
    }
    /* the mutations must leave some documents valid, or encoding is never exercised */
    assert_true(loaded > total / 20);
    assert_true(loaded < total);
}

static void flipped_and_truncated_bytes_load_or_fail_cleanly(void **st) {
    for (int s = 0; s < (int)(sizeof k_seeds / sizeof *k_seeds); s++) {
        size_t n = strlen(k_seeds[s]);
        char *buf = malloc(n + 1);
        assert_non_null(buf);
        for (size_t cut = 0; cut < n; cut += 7)
            try_load(k_seeds[s], cut, NULL);
        for (int it = 0; it < 1500; it++) {
            memcpy(buf, k_seeds[s], n + 1);
            for (int f = 1 + (int)fuzz_below(4); f > 0; f--)
                buf[fuzz_below(n)] = (char)fuzz_below(256);
            try_load(buf, n, NULL);
        }
        free(buf);
    }
}

int main(void) {
    fuzz_seed(0x746f6b5f6866ULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mutated_documents_load_or_fail_cleanly),
        cmocka_unit_test(flipped_and_truncated_bytes_load_or_fail_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
