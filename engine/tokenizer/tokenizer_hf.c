/* tokenizer_hf.c — a Hugging Face tokenizer.json (and tokenizer_config.json) loaded into the
 * tokenizer machinery of vocab.c / tokenizer_bpe.c. docs/models.md ("Tokenizers") lists
 * what is supported.
 *
 * What the JSON says maps onto the same tables a GGUF vocabulary fills: model.vocab and
 * added_tokens give the strings by id, model.merges the merge table (ranked by position;
 * both "a b" and ["a", "b"] forms), the pre_tokenizer sequence becomes PCRE2 stages with
 * Hugging Face's split behaviours (Split, ByteLevel's GPT-2 regex, Digits, Metaspace's split),
 * and the normalizers (NFC through utf8proc, Prepend, Replace) plus Metaspace's replacement
 * and ByteLevel's add_prefix_space run on each text fragment before the stages. A tokenizer
 * with a ByteLevel pre-tokenizer is byte-level BPE; one without is character-level BPE
 * (SentencePiece-style, with byte_fallback to <0xXX> tokens). A WordPiece model (BERT) takes
 * its options, BertNormalizer and WordPiece decoder through tokenizer_wordpiece.c and allows
 * only BERT's components beside it; BertProcessing gives BOS / EOS like TemplateProcessing.
 *
 * Anything medley does not implement is refused with the JSON path and the value, never
 * approximated: a tokenizer that splits differently would give the model the wrong ids.
 * Every value is type-checked; a hostile file gets an error, never a crash.
 *
 * Memory: the JSON is parsed with jansson and released before returning; the tokenizer
 * owns copies of everything it keeps. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "common/util.h"
#include "engine/tokenizer/tokenizer_bpe.h"
#include "engine/tokenizer/tokenizer_wordpiece.h"

/* Twice Gemma 3's 33 MB tokenizer.json. jansson's tree takes up to ~35x the text for dense
 * arrays (a 60 MB file of short merges: 2.1 GB), so this cap is what bounds load memory. */
#define HF_MAX_FILE_BYTES ((size_t)64 << 20)
#define HF_MAX_TOKENS (1 << 24) /* ids past 16 M are refused, not allocated */

typedef struct {
    tok_tokenizer *t;
    md_err *e;
    const char *file; /* name used in messages: "tokenizer.json" or its path */
    int n_pre;        /* elementary pre-tokenizers seen so far */
    int byte_level;   /* a ByteLevel pre-tokenizer was seen */
    int have_suffix;  /* TemplateProcessing appends a token (eos) */
} hf_ld;

/* "FILE: PATH <message>" */
static int fail(hf_ld *L, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(hf_ld *L, int code, const char *path, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return md_errf(L->e, code, "%s: %s%s%s", L->file, path, *path ? " " : "", msg);
}

/* String value at obj.key: *out NULL when absent or null (and !required). */
static int get_str(hf_ld *L, json_t *obj, const char *key, const char *path, int required,
                   const char **out, size_t *len) {
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (len)
        *len = 0;
    if (!v || json_is_null(v)) {
        if (required)
            return fail(L, MD_EFORMAT, path, "has no '%s'", key);
        return 0;
    }
    if (!json_is_string(v))
        return fail(L, MD_EFORMAT, path, "'%s' is %s, expected a string", key,
                    md_json_type_name(v));
    *out = json_string_value(v);
    if (len)
        *len = json_string_length(v);
    return 0;
}

static int get_bool(hf_ld *L, json_t *obj, const char *key, const char *path, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 0; /* keep the default */
    if (!json_is_boolean(v))
        return fail(L, MD_EFORMAT, path, "'%s' is %s, expected true or false", key,
                    md_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* The "type" of a component; a missing or non-string type is a format error. */
static int get_type(hf_ld *L, json_t *obj, const char *path, const char **type) {
    if (!json_is_object(obj))
        return fail(L, MD_EFORMAT, path, "is %s, expected an object", md_json_type_name(obj));
    return get_str(L, obj, "type", path, 1, type, NULL);
}

/* The type of a component at Sequence depth `depth`; deeper than 4 is refused. */
static int component_type(hf_ld *L, json_t *p, const char *path, int depth, const char **type) {
    if (depth > 4)
        return fail(L, MD_EUNSUPP, path, "nests Sequences too deep");
    return get_type(L, p, path, type);
}

static int unsupported(hf_ld *L, const char *path, const char *type, const char *supported) {
    return fail(L, MD_EUNSUPP, "", "%s.type '%.60s' is not supported (medley reads %s)", path, type,
                supported);
}

/* A component's Sequence: each item of the array p[key] through load, one level deeper. */
typedef int (*hf_loader)(hf_ld *L, json_t *p, const char *path, int depth);
static int load_sequence(hf_ld *L, json_t *p, const char *path, const char *key, int depth,
                         hf_loader load) {
    json_t *list = json_object_get(p, key);
    if (!json_is_array(list))
        return fail(L, MD_EFORMAT, path, "'%s' is %s, expected an array", key,
                    list ? md_json_type_name(list) : "missing");
    for (size_t i = 0; i < json_array_size(list); i++) {
        char sub[160];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", path, key, i);
        int rc = load(L, json_array_get(list, i), sub, depth + 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* One UTF-8 character, exactly (for Metaspace's replacement). */
static int one_char(const char *s, size_t n) {
    utf8proc_int32_t c;
    return n > 0 && n <= 4 &&
           utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c) ==
               (utf8proc_ssize_t)n;
}

/* ---- vocabulary: model.vocab and added_tokens ---- */

/* The text of every id while the vocabulary is read: model.vocab, then added_tokens. */
typedef struct {
    const char **text; /* by id; NULL: not given yet */
    size_t *len;
    size_t cap;    /* ids must be below it: vocab entries + added tokens */
    size_t max_id; /* the largest id given */
} hf_ids;

/* model.vocab {"text": id, ...}: one text per id, ids below cap. */
static int vocab_ids(hf_ld *L, json_t *vocab, hf_ids *ids) {
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v))
            return fail(L, MD_EFORMAT, "model.vocab", "['%.60s'] is %s, expected an integer id",
                        key, md_json_type_name(v));
        json_int_t id = json_integer_value(v);
        if (id < 0 || (size_t)id >= ids->cap)
            return fail(L, MD_ERANGE, "model.vocab",
                        "['%.60s'] = %lld is not an id in 0..%zu (ids must be dense)", key,
                        (long long)id, ids->cap - 1);
        if (ids->text[id])
            return fail(L, MD_EFORMAT, "model.vocab", "gives id %lld to both '%.60s' and '%.60s'",
                        (long long)id, ids->text[id], key);
        ids->text[id] = key;
        ids->len[id] = strlen(key); /* jansson keys have no NUL (JSON_ALLOW_NUL is off) */
        if ((size_t)id > ids->max_id)
            ids->max_id = (size_t)id;
    }
    return 0;
}

/* added_tokens [{"id": N, "content": "text", ...}]: an added token may repeat the text its id
 * has in model.vocab, not give the id another one. */
static int added_ids(hf_ld *L, json_t *added, size_t n_added, hf_ids *ids) {
    int rc;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        char path[48];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        if (!json_is_object(a))
            return fail(L, MD_EFORMAT, path, "is %s, expected an object", md_json_type_name(a));
        json_t *jid = json_object_get(a, "id");
        const char *content;
        size_t clen;
        if (!json_is_integer(jid))
            return fail(L, MD_EFORMAT, path, "'id' is %s, expected an integer",
                        jid ? md_json_type_name(jid) : "missing");
        if ((rc = get_str(L, a, "content", path, 1, &content, &clen)))
            return rc;
        if (clen == 0)
            return fail(L, MD_EFORMAT, path, "'content' is empty");
        json_int_t id = json_integer_value(jid);
        if (id < 0 || (size_t)id >= ids->cap)
            return fail(L, MD_ERANGE, path, "'id' %lld is not an id in 0..%zu (ids must be dense)",
                        (long long)id, ids->cap - 1);
        if (ids->text[id] && (ids->len[id] != clen || memcmp(ids->text[id], content, clen)))
            return fail(L, MD_EFORMAT, path, "gives id %lld to '%.60s', which is '%.60s' already",
                        (long long)id, content, ids->text[id]);
        ids->text[id] = content;
        ids->len[id] = clen;
        if ((size_t)id > ids->max_id)
            ids->max_id = (size_t)id;
    }
    return 0;
}

/* The string table from ids 0..max_id, all given (an empty text gets a placeholder, as for
 * GGUF); no text may have two ids. */
static int intern_ids(hf_ld *L, hf_ids *ids) {
    tok_tokenizer *t = L->t;
    for (size_t id = 0; id <= ids->max_id; id++)
        if (!ids->text[id])
            return fail(L, MD_EFORMAT, "model.vocab",
                        "has no token with id %zu (ids must be dense, 0..%zu)", id, ids->max_id);
    t->n_vocab = (int)(ids->max_id + 1);
    for (int id = 0; id < t->n_vocab; id++) {
        int32_t got;
        char empty[32];
        size_t len = ids->len[id];
        const char *text = ids->text[id];
        if (len == 0) {
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%d]", id);
            text = empty;
        }
        if (tok_strtab_add(t, text, len, &got))
            return md_errf(L->e, MD_ENOMEM, "%s: out of memory reading model.vocab", L->file);
    }
    if (tok_index_strings(t))
        return md_errf(L->e, MD_ENOMEM, "%s: out of memory indexing the vocabulary", L->file);
    /* one text with two ids (an added token repeating a vocab string or another one) */
    for (int id = 0; id < t->n_vocab; id++) {
        const char *s = t->arena + t->str_off[id];
        int32_t other = tok_str_lookup(t, s, t->str_len[id]);
        if (other != id)
            return fail(L, MD_EFORMAT, "added_tokens", "give '%.60s' two ids (%d and %d)", s, id,
                        other);
    }
    return 0;
}

/* Per-token arrays: every token normal, added ones control (special) or user-defined with
 * their lstrip / rstrip / single_word flags. */
static int token_attrs(hf_ld *L, json_t *added, size_t n_added) {
    tok_tokenizer *t = L->t;
    int rc;
    t->scores = calloc((size_t)t->n_vocab, sizeof *t->scores);
    t->attr = calloc((size_t)t->n_vocab, 1);
    t->is_eog = calloc((size_t)t->n_vocab, 1);
    t->tok_flags = calloc((size_t)t->n_vocab, 1);
    if (!t->scores || !t->attr || !t->is_eog || !t->tok_flags)
        return md_errf(L->e, MD_ENOMEM, "%s: out of memory reading the vocabulary", L->file);
    for (int id = 0; id < t->n_vocab; id++)
        t->attr[id] = TOK_A_NORMAL;
    for (size_t i = 0; i < n_added; i++) {
        json_t *a = json_array_get(added, i);
        char path[48];
        snprintf(path, sizeof path, "added_tokens[%zu]", i);
        int special = 0, lstrip = 0, rstrip = 0, single = 0, normalized = 0;
        if ((rc = get_bool(L, a, "special", path, &special)) ||
            (rc = get_bool(L, a, "lstrip", path, &lstrip)) ||
            (rc = get_bool(L, a, "rstrip", path, &rstrip)) ||
            (rc = get_bool(L, a, "single_word", path, &single)) ||
            (rc = get_bool(L, a, "normalized", path, &normalized)))
            return rc;
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        t->attr[id] = special ? TOK_A_CONTROL : TOK_A_USER;
        t->tok_flags[id] = (uint8_t)((lstrip ? TOK_F_LSTRIP : 0) | (rstrip ? TOK_F_RSTRIP : 0) |
                                     (single ? TOK_F_SINGLE_WORD : 0));
    }
    return 0;
}

/* Strings by id, dense ids, no id given two strings. */
static int load_vocab(hf_ld *L, json_t *model, json_t *added) {
    json_t *vocab = json_object_get(model, "vocab");
    if (!vocab)
        return fail(L, MD_EFORMAT, "model", "has no 'vocab'");
    if (!json_is_object(vocab))
        return fail(L, MD_EFORMAT, "model.vocab", "is %s, expected an object of token: id",
                    md_json_type_name(vocab));
    if (added && !json_is_null(added) && !json_is_array(added))
        return fail(L, MD_EFORMAT, "added_tokens", "is %s, expected an array",
                    md_json_type_name(added));
    size_t n_added = json_is_array(added) ? json_array_size(added) : 0;
    hf_ids ids = {NULL, NULL, json_object_size(vocab) + n_added, 0};
    if (ids.cap == 0)
        return fail(L, MD_EFORMAT, "model.vocab", "is empty");
    if (ids.cap > HF_MAX_TOKENS)
        return fail(L, MD_ERANGE, "model.vocab", "has %zu tokens, more than %d", ids.cap,
                    HF_MAX_TOKENS);
    ids.text = calloc(ids.cap, sizeof *ids.text);
    ids.len = calloc(ids.cap, sizeof *ids.len);
    int rc;
    if (!ids.text || !ids.len)
        rc = md_errf(L->e, MD_ENOMEM, "%s: out of memory reading model.vocab", L->file);
    else if (!(rc = vocab_ids(L, vocab, &ids)) && !(rc = added_ids(L, added, n_added, &ids)) &&
             !(rc = intern_ids(L, &ids)))
        rc = token_attrs(L, added, n_added);
    free(ids.text);
    free(ids.len);
    return rc;
}

/* ---- model: BPE options and merges ---- */

static int load_merge(hf_ld *L, json_t *m, size_t i, const char **a, size_t *al, const char **b,
                      size_t *bl) {
    char path[48];
    snprintf(path, sizeof path, "model.merges[%zu]", i);
    if (json_is_string(m)) { /* "a b": exactly one space, as Hugging Face requires */
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp - s) - 1) || sp == s || sp == s + n - 1)
            return fail(L, MD_EFORMAT, path, "'%.60s' is not two tokens separated by one space", s);
        *a = s, *al = (size_t)(sp - s);
        *b = sp + 1, *bl = n - *al - 1;
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *al = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *bl = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return fail(L, MD_EFORMAT, path, "is %s, expected \"a b\" or [\"a\", \"b\"]",
                md_json_type_name(m));
}

static int load_model(hf_ld *L, json_t *model) {
    tok_tokenizer *t = L->t;
    const char *unk, *prefix, *suffix;
    size_t unk_len;
    int rc;
    if ((rc = get_bool(L, model, "byte_fallback", "model", &t->byte_fallback)) ||
        (rc = get_bool(L, model, "fuse_unk", "model", &t->fuse_unk)) ||
        (rc = get_bool(L, model, "ignore_merges", "model", &t->ignore_merges)) ||
        (rc = get_str(L, model, "unk_token", "model", 0, &unk, &unk_len)) ||
        (rc = get_str(L, model, "continuing_subword_prefix", "model", 0, &prefix, NULL)) ||
        (rc = get_str(L, model, "end_of_word_suffix", "model", 0, &suffix, NULL)))
        return rc;
    if ((prefix && *prefix) || (suffix && *suffix))
        return fail(L, MD_EUNSUPP, "model", "%s '%.40s' is not supported",
                    prefix && *prefix ? "continuing_subword_prefix" : "end_of_word_suffix",
                    prefix && *prefix ? prefix : suffix);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return fail(L, MD_EUNSUPP, "model.dropout",
                    "is not supported (null only: medley is "
                    "deterministic)");
    t->unk = -1;
    if (unk) {
        t->unk = tok_find(t, unk, unk_len);
        if (t->unk < 0)
            return fail(L, MD_EFORMAT, "model.unk_token", "'%.60s' is not in model.vocab", unk);
        if (t->attr[t->unk] & TOK_A_CONTROL)
            t->attr[t->unk] = TOK_A_UNKNOWN;
    }
    json_t *merges = json_object_get(model, "merges");
    if (!merges)
        return fail(L, MD_EFORMAT, "model", "has no 'merges'");
    if (!json_is_array(merges))
        return fail(L, MD_EFORMAT, "model.merges", "is %s, expected an array",
                    md_json_type_name(merges));
    size_t n = json_array_size(merges);
    if (n > HF_MAX_TOKENS)
        return fail(L, MD_ERANGE, "model.merges", "has %zu entries, more than %d", n,
                    HF_MAX_TOKENS);
    if (tok_merges_alloc(t, n))
        return md_errf(L->e, MD_ENOMEM, "%s: out of memory reading model.merges", L->file);
    char small[512];
    for (size_t i = 0; i < n; i++) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if ((rc = load_merge(L, json_array_get(merges, i), i, &a, &al, &b, &bl)))
            return rc;
        char path[48];
        snprintf(path, sizeof path, "model.merges[%zu]", i);
        int32_t l = tok_find(t, a, al), r = tok_find(t, b, bl);
        if (l < 0 || r < 0)
            return fail(L, MD_EFORMAT, path, "'%.60s' is not in model.vocab", l < 0 ? a : b);
        char *cat = al + bl <= sizeof small ? small : malloc(al + bl);
        if (!cat)
            return md_errf(L->e, MD_ENOMEM, "%s: out of memory reading model.merges", L->file);
        memcpy(cat, a, al);
        memcpy(cat + al, b, bl);
        int32_t m = tok_find(t, cat, al + bl);
        if (m < 0)
            rc = fail(L, MD_EFORMAT, path, "makes '%.*s', which is not in model.vocab",
                      (int)(al + bl > 60 ? 60 : al + bl), cat);
        if (cat != small)
            free(cat);
        if (rc)
            return rc;
        /* a later duplicate replaces the earlier one (Hugging Face builds a map) */
        tok_merge_put(t, l, r, (int32_t)i, m, 1);
    }
    return 0;
}

/* ---- pre-tokenizers ---- */

/* Hugging Face's regexes are Oniguruma's; PCRE2's \s lacks U+0085, so \s and \S become the
 * White_Space property (the same set as Oniguruma's Unicode \s). *out is malloc'd. */
static int translate_regex(const char *re, size_t n, char **out, size_t *out_len) {
    char *o = malloc(n * 16 + 1);
    if (!o)
        return MD_ENOMEM;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '\\' && i + 1 < n) {
            if (re[i + 1] == 's' || re[i + 1] == 'S') {
                const char *p = re[i + 1] == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
                memcpy(o + w, p, strlen(p));
                w += strlen(p);
            } else {
                o[w++] = re[i];
                o[w++] = re[i + 1];
            }
            i++;
            continue;
        }
        o[w++] = re[i];
    }
    o[w] = '\0';
    *out = o;
    *out_len = w;
    return 0;
}

static const struct {
    const char *name;
    int behavior;
} k_behaviors[] = {
    {"Isolated", TOK_SPLIT_ISOLATED},
    {"Removed", TOK_SPLIT_REMOVED},
    {"MergedWithPrevious", TOK_SPLIT_MERGED_PREV},
    {"MergedWithNext", TOK_SPLIT_MERGED_NEXT},
    {"Contiguous", TOK_SPLIT_CONTIGUOUS},
};

static int add_stage(hf_ld *L, const char *path, const char *pattern, size_t len, int literal,
                     int behavior, int invert) {
    md_err tmp = {0};
    int rc = tok_re_add(L->t, pattern, len, literal, behavior, invert, &tmp);
    if (rc)
        return fail(L, rc == MD_ERANGE ? MD_EUNSUPP : MD_EFORMAT, path, "%s", tmp.msg);
    return 0;
}

static int load_split(hf_ld *L, json_t *p, const char *path) {
    char sub[160];
    json_t *pat = json_object_get(p, "pattern");
    snprintf(sub, sizeof sub, "%s.pattern", path);
    if (!json_is_object(pat))
        return fail(L, MD_EFORMAT, sub, "is %s, expected {\"Regex\": ...} or {\"String\": ...}",
                    pat ? md_json_type_name(pat) : "missing");
    const char *re, *str, *beh;
    size_t re_len, str_len;
    int rc, invert = 0;
    if ((rc = get_str(L, pat, "Regex", sub, 0, &re, &re_len)) ||
        (rc = get_str(L, pat, "String", sub, 0, &str, &str_len)) ||
        (rc = get_str(L, p, "behavior", path, 1, &beh, NULL)) ||
        (rc = get_bool(L, p, "invert", path, &invert)))
        return rc;
    if (!re == !str)
        return fail(L, MD_EFORMAT, sub, "needs exactly one of Regex and String");
    int behavior = -1;
    for (size_t i = 0; i < sizeof k_behaviors / sizeof *k_behaviors; i++)
        if (!strcmp(beh, k_behaviors[i].name))
            behavior = k_behaviors[i].behavior;
    if (behavior < 0)
        return fail(L, MD_EUNSUPP, path,
                    "behavior '%.40s' is not one of Isolated, Removed, MergedWithPrevious, "
                    "MergedWithNext, Contiguous",
                    beh);
    if (str) {
        if (str_len == 0)
            return fail(L, MD_EFORMAT, sub, "String is empty");
        return add_stage(L, sub, str, str_len, 1, behavior, invert);
    }
    char *pcre;
    size_t pcre_len;
    if (translate_regex(re, re_len, &pcre, &pcre_len))
        return md_errf(L->e, MD_ENOMEM, "%s: out of memory", L->file);
    rc = add_stage(L, sub, pcre, pcre_len, 0, behavior, invert);
    free(pcre);
    return rc;
}

static int load_pre(hf_ld *L, json_t *p, const char *path, int depth) {
    tok_tokenizer *t = L->t;
    const char *type;
    int rc;
    if ((rc = component_type(L, p, path, depth, &type)))
        return rc;
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, p, path, "pretokenizers", depth, load_pre);
    int first = L->n_pre++ == 0;
    if ((t->kind == TOK_KIND_WP) != !strcmp(type, "BertPreTokenizer"))
        return fail(
            L, MD_EUNSUPP, "", "%s.type '%.60s' is not supported with a %s model (medley reads %s)",
            path, type, t->kind == TOK_KIND_WP ? "WordPiece" : "BPE",
            t->kind == TOK_KIND_WP ? "BertPreTokenizer" : "Split, ByteLevel, Digits, Metaspace");
    if (!strcmp(type, "BertPreTokenizer")) {
        t->wp.bert_pre = 1;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        int prefix = 1, use_regex = 1;
        if ((rc = get_bool(L, p, "add_prefix_space", path, &prefix)) ||
            (rc = get_bool(L, p, "use_regex", path, &use_regex)))
            return rc;
        if (prefix && !first)
            return fail(L, MD_EUNSUPP, path,
                        "add_prefix_space is supported only on the first pre-tokenizer");
        t->prefix_space = prefix;
        L->byte_level = 1;
        return use_regex
                   ? add_stage(L, path, tok_re_gpt2, strlen(tok_re_gpt2), 0, TOK_SPLIT_ISOLATED, 0)
                   : 0;
    }
    if (L->byte_level &&
        (!strcmp(type, "Split") || !strcmp(type, "Digits") || !strcmp(type, "Metaspace")))
        return fail(L, MD_EUNSUPP, path, "'%s' after ByteLevel is not supported", type);
    if (!strcmp(type, "Split"))
        return load_split(L, p, path);
    if (!strcmp(type, "Digits")) {
        int individual = 0;
        if ((rc = get_bool(L, p, "individual_digits", path, &individual)))
            return rc;
        const char *re = individual ? "\\p{N}" : "\\p{N}+";
        return add_stage(L, path, re, strlen(re), 0, TOK_SPLIT_ISOLATED, 0);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = "\xe2\x96\x81", *scheme;
        size_t rep_len = 3;
        int split = 1, legacy = -1;
        if ((rc = get_str(L, p, "replacement", path, 0, &rep, &rep_len)) ||
            (rc = get_str(L, p, "prepend_scheme", path, 0, &scheme, NULL)) ||
            (rc = get_bool(L, p, "add_prefix_space", path, &legacy)) ||
            (rc = get_bool(L, p, "split", path, &split)))
            return rc;
        if (!rep)
            rep = "\xe2\x96\x81", rep_len = 3;
        if (!one_char(rep, rep_len))
            return fail(L, MD_EFORMAT, path, "replacement '%.20s' is not one character", rep);
        if (!first)
            return fail(L, MD_EUNSUPP, path,
                        "Metaspace is supported only as the first "
                        "pre-tokenizer");
        memcpy(t->metaspace, rep, rep_len);
        t->metaspace[rep_len] = '\0';
        if (scheme) {
            if (!strcmp(scheme, "always"))
                t->meta_prepend = 2;
            else if (!strcmp(scheme, "first"))
                t->meta_prepend = 1;
            else if (!strcmp(scheme, "never"))
                t->meta_prepend = 0;
            else
                return fail(L, MD_EUNSUPP, path,
                            "prepend_scheme '%.40s' is not one of always, first, never", scheme);
        } else {
            t->meta_prepend = legacy != 0 ? 2 : 0; /* older files: add_prefix_space */
        }
        return split ? add_stage(L, path, rep, rep_len, 1, TOK_SPLIT_MERGED_NEXT, 0) : 0;
    }
    return unsupported(L, path, type, "Sequence, Split, ByteLevel, Digits, Metaspace");
}

/* ---- normalizers ---- */

static int add_norm(hf_ld *L, int kind, const char *a, size_t al, const char *b, size_t bl) {
    tok_tokenizer *t = L->t;
    tok_norm_step *n = realloc(t->norm, ((size_t)t->n_norm + 1) * sizeof *n);
    if (!n)
        return md_errf(L->e, MD_ENOMEM, "%s: out of memory", L->file);
    t->norm = n;
    tok_norm_step *s = &t->norm[t->n_norm];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    if ((a && !(s->a = malloc(al + 1))) || (b && !(s->b = malloc(bl + 1)))) {
        free(s->a);
        return md_errf(L->e, MD_ENOMEM, "%s: out of memory", L->file);
    }
    if (a)
        memcpy(s->a, a, al), s->a_len = al;
    if (b)
        memcpy(s->b, b, bl), s->b_len = bl;
    t->n_norm++;
    return 0;
}

static int load_norm(hf_ld *L, json_t *p, const char *path, int depth) {
    const char *type;
    int rc;
    char sub[160];
    if (!p || json_is_null(p))
        return 0;
    if ((rc = component_type(L, p, path, depth, &type)))
        return rc;
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, p, path, "normalizers", depth, load_norm);
    if ((L->t->kind == TOK_KIND_WP) != !strcmp(type, "BertNormalizer"))
        return fail(
            L, MD_EUNSUPP, "", "%s.type '%.60s' is not supported with a %s model (medley reads %s)",
            path, type, L->t->kind == TOK_KIND_WP ? "WordPiece" : "BPE",
            L->t->kind == TOK_KIND_WP ? "BertNormalizer" : "Sequence, NFC, Prepend, Replace");
    if (!strcmp(type, "BertNormalizer"))
        return tok_wp_load_normalizer(L->t, p, L->file, path, L->e);
    if (!strcmp(type, "NFC"))
        return add_norm(L, TOK_NORM_NFC, NULL, 0, NULL, 0);
    if (!strcmp(type, "Prepend")) {
        const char *s;
        size_t n;
        if ((rc = get_str(L, p, "prepend", path, 1, &s, &n)))
            return rc;
        return add_norm(L, TOK_NORM_PREPEND, s, n, NULL, 0);
    }
    if (!strcmp(type, "Replace")) {
        json_t *pat = json_object_get(p, "pattern");
        const char *from, *re, *to;
        size_t fl, tl;
        snprintf(sub, sizeof sub, "%s.pattern", path);
        if (!json_is_object(pat))
            return fail(L, MD_EFORMAT, sub, "is %s, expected {\"String\": ...}",
                        pat ? md_json_type_name(pat) : "missing");
        if ((rc = get_str(L, pat, "Regex", sub, 0, &re, NULL)) ||
            (rc = get_str(L, pat, "String", sub, 0, &from, &fl)) ||
            (rc = get_str(L, p, "content", path, 1, &to, &tl)))
            return rc;
        if (re)
            return fail(L, MD_EUNSUPP, sub, "Regex is not supported in Replace (String only)");
        if (!from || fl == 0)
            return fail(L, MD_EFORMAT, sub, "needs a non-empty String");
        return add_norm(L, TOK_NORM_REPLACE, from, fl, to, tl);
    }
    return unsupported(L, path, type, "Sequence, NFC, Prepend, Replace");
}

/* ---- decoder and post-processor ---- */

static int load_decoder(hf_ld *L, json_t *p, const char *path, int depth) {
    static const char *const known[] = {"ByteLevel", "Metaspace", "ByteFallback",
                                        "Fuse",      "Strip",     "Replace"};
    const char *type;
    int rc;
    if (!p || json_is_null(p))
        return 0;
    if ((rc = component_type(L, p, path, depth, &type)))
        return rc;
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, p, path, "decoders", depth, load_decoder);
    if ((L->t->kind == TOK_KIND_WP) != !strcmp(type, "WordPiece"))
        return fail(L, MD_EUNSUPP, "", "%s.type '%.60s' is not supported with a %s model", path,
                    type, L->t->kind == TOK_KIND_WP ? "WordPiece" : "BPE");
    if (!strcmp(type, "WordPiece"))
        return tok_wp_load_decoder(L->t, p, L->file, path, L->e);
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (!strcmp(type, known[i]))
            return 0;
    return unsupported(L, path, type,
                       "Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, "
                       "Strip, Replace");
}

/* The id a TemplateProcessing item {"SpecialToken": {"id": NAME}} stands for. */
static int template_token(hf_ld *L, json_t *proc, json_t *item, const char *path, int32_t *id) {
    json_t *st = json_object_get(item, "SpecialToken");
    const char *name;
    size_t n;
    int rc = get_str(L, st, "id", path, 1, &name, &n);
    if (rc)
        return rc;
    json_t *sp = json_object_get(json_object_get(proc, "special_tokens"), name);
    json_t *ids = json_object_get(sp, "ids");
    if (json_is_array(ids)) {
        json_t *first = json_array_get(ids, 0);
        if (json_array_size(ids) != 1 || !json_is_integer(first))
            return fail(L, MD_EUNSUPP, path, "special token '%.40s' must be one integer id", name);
        json_int_t v = json_integer_value(first);
        if (v < 0 || v >= L->t->n_vocab)
            return fail(L, MD_ERANGE, path,
                        "special token '%.40s' has id %lld, past the %d "
                        "tokens",
                        name, (long long)v, L->t->n_vocab);
        *id = (int32_t)v;
        return 0;
    }
    *id = tok_find(L->t, name, n);
    if (*id < 0)
        return fail(L, MD_EFORMAT, path, "special token '%.40s' is not in the vocabulary", name);
    return 0;
}

/* BertProcessing's cls / sep: ["[CLS]", 101], the id the one the vocabulary gives the text. */
static int bert_special(hf_ld *L, json_t *p, const char *key, const char *path, int32_t *id) {
    json_t *v = json_object_get(p, key);
    json_t *text = json_array_get(v, 0), *num = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(text) ||
        !json_is_integer(num))
        return fail(L, MD_EFORMAT, path, "'%s' is %s, expected [\"token\", id]", key,
                    v ? md_json_type_name(v) : "missing");
    *id = tok_find(L->t, json_string_value(text), json_string_length(text));
    if (*id < 0 || *id != json_integer_value(num))
        return fail(L, MD_EFORMAT, path, "'%s' ['%.40s', %lld] is not that token of the vocabulary",
                    key, json_string_value(text), (long long)json_integer_value(num));
    return 0;
}

static int load_post(hf_ld *L, json_t *p, const char *path, int depth) {
    const char *type;
    int rc;
    char sub[160];
    if (!p || json_is_null(p))
        return 0;
    if ((rc = component_type(L, p, path, depth, &type)))
        return rc;
    if (!strcmp(type, "ByteLevel"))
        return 0; /* offsets only */
    if (!strcmp(type, "Sequence"))
        return load_sequence(L, p, path, "processors", depth, load_post);
    if (!strcmp(type, "BertProcessing")) { /* [CLS] A [SEP] */
        if ((rc = bert_special(L, p, "cls", path, &L->t->bos)) ||
            (rc = bert_special(L, p, "sep", path, &L->t->eos)))
            return rc;
        L->t->add_bos = L->t->add_eos = L->have_suffix = 1;
        return 0;
    }
    if (strcmp(type, "TemplateProcessing"))
        return unsupported(L, path, type,
                           "ByteLevel, TemplateProcessing, BertProcessing, Sequence");
    /* single: [SpecialToken]? Sequence A [SpecialToken]? -> BOS / EOS */
    json_t *single = json_object_get(p, "single");
    snprintf(sub, sizeof sub, "%s.single", path);
    if (!json_is_array(single))
        return fail(L, MD_EFORMAT, sub, "is %s, expected an array",
                    single ? md_json_type_name(single) : "missing");
    int seen_seq = 0, n_pre = 0, n_post = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        json_t *item = json_array_get(single, i);
        char ip[192];
        snprintf(ip, sizeof ip, "%s[%zu]", sub, i);
        if (json_object_get(item, "Sequence")) {
            if (seen_seq)
                return fail(L, MD_EUNSUPP, ip, "a second Sequence is not supported");
            seen_seq = 1;
            continue;
        }
        if (!json_is_object(json_object_get(item, "SpecialToken")))
            return fail(L, MD_EFORMAT, ip, "is neither a SpecialToken nor a Sequence");
        int32_t id = -1;
        if ((rc = template_token(L, p, item, ip, &id)))
            return rc;
        if (seen_seq ? n_post++ : n_pre++)
            return fail(L, MD_EUNSUPP, ip,
                        "more than one special token on a side is not "
                        "supported");
        if (seen_seq) {
            L->t->eos = id;
            L->t->add_eos = 1;
            L->have_suffix = 1;
        } else {
            L->t->bos = id;
            L->t->add_bos = 1;
        }
    }
    if (!seen_seq)
        return fail(L, MD_EFORMAT, sub, "has no Sequence");
    return 0;
}

/* ---- tokenizer_config.json ---- */

/* bos_token / eos_token: a string, an AddedToken object {"content": ...}, or null. */
static int config_token(hf_ld *L, json_t *cfg, const char *key, int32_t *id) {
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return fail(L, MD_EFORMAT, key, "is %s, expected a token string",
                    v ? md_json_type_name(v) : "an object without content");
    *id = tok_find(L->t, json_string_value(v), json_string_length(v));
    if (*id < 0)
        return fail(L, MD_EFORMAT, key, "'%.60s' is not in the vocabulary", json_string_value(v));
    return 0;
}

static int load_config(hf_ld *L, json_t *cfg) {
    tok_tokenizer *t = L->t;
    int rc;
    if (!json_is_object(cfg))
        return fail(L, MD_EFORMAT, "", "is %s, expected an object", md_json_type_name(cfg));
    int32_t bos = -1, eos = -1;
    if ((rc = config_token(L, cfg, "bos_token", &bos)) ||
        (rc = config_token(L, cfg, "eos_token", &eos)) ||
        (rc = get_bool(L, cfg, "add_bos_token", "", &t->add_bos)) ||
        (rc = get_bool(L, cfg, "add_eos_token", "", &t->add_eos)))
        return rc;
    if (bos >= 0)
        t->bos = bos;
    if (eos >= 0) {
        if (!L->have_suffix)
            t->eos = eos;
        t->is_eog[eos] = 1;
    }
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct))
        return tok_set_chat_template(t, json_string_value(ct), json_string_length(ct), L->e);
    if (json_is_array(ct)) { /* [{"name": ..., "template": ...}]: the "default" one */
        json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *it = json_array_get(ct, i), *name = json_object_get(it, "name");
            if (!json_is_string(json_object_get(it, "template")))
                return fail(L, MD_EFORMAT, "chat_template", "[%zu] has no template string", i);
            if (!pick || (json_is_string(name) && !strcmp(json_string_value(name), "default")))
                pick = json_object_get(it, "template");
        }
        return pick ? tok_set_chat_template(t, json_string_value(pick), json_string_length(pick),
                                            L->e)
                    : 0;
    }
    if (ct && !json_is_null(ct))
        return fail(L, MD_EFORMAT, "chat_template", "is %s, expected a string",
                    md_json_type_name(ct));
    return 0;
}

/* ---- load ---- */

static json_t *parse(hf_ld *L, const char *text, size_t len, size_t flags, int *rc) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES | flags, &jerr);
    if (!root) {
        *rc = md_errf(L->e, MD_EFORMAT, "%s: not valid JSON: %s (line %d, column %d)", L->file,
                      jerr.text, jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        *rc = fail(L, MD_EFORMAT, "", "is %s, expected an object", md_json_type_name(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

static int load(const char *json, size_t len, const char *cfg_text, size_t cfg_len,
                const char *json_name, const char *cfg_name, tok_tokenizer **out, md_err *e) {
    *out = NULL;
    if (!json)
        return md_errf(e, MD_EINVAL, "%s: no text", json_name);
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return md_errf(e, MD_ENOMEM, "out of memory loading the tokenizer");
    t->hf = 1;
    t->bos = t->eos = t->eot = t->eom = t->unk = -1;
    snprintf(t->pre_name, sizeof t->pre_name, "tokenizer.json");
    hf_ld L = {t, e, json_name, 0, 0, 0};
    int rc = 0;
    json_t *root = parse(&L, json, len, 0, &rc), *cfg = NULL;
    if (!root)
        goto fail;
    json_t *model = json_object_get(root, "model");
    const char *type = NULL;
    if (!model) {
        rc = fail(&L, MD_EFORMAT, "", "has no model");
        goto fail;
    }
    if (!json_is_object(model)) {
        rc = fail(&L, MD_EFORMAT, "model", "is %s, expected an object", md_json_type_name(model));
        goto fail;
    }
    if ((rc = get_str(&L, model, "type", "model", 0, &type, NULL)))
        goto fail;
    int wp = type && !strcmp(type, "WordPiece");
    if (type && !wp && strcmp(type, "BPE")) {
        rc = unsupported(&L, "model", type, "BPE, WordPiece");
        goto fail;
    }
    json_t *added = json_object_get(root, "added_tokens");
    if ((rc = load_vocab(&L, model, added)) ||
        (rc = wp ? tok_wp_load_model(t, model, added, L.file, e) : load_model(&L, model)) ||
        (rc = load_norm(&L, json_object_get(root, "normalizer"), "normalizer", 0)))
        goto fail;
    json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre) && (rc = load_pre(&L, pre, "pre_tokenizer", 0)))
        goto fail;
    if ((rc = load_decoder(&L, json_object_get(root, "decoder"), "decoder", 0)) ||
        (rc = load_post(&L, json_object_get(root, "post_processor"), "post_processor", 0)))
        goto fail;
    if (wp) {
        tok_wp_finish(t);
    } else if (L.byte_level) {
        t->kind = TOK_KIND_BPE;
        snprintf(t->model_name, sizeof t->model_name, "hf-bpe");
        tok_byte_tables(t);
        /* Hugging Face drops a byte whose alphabet character is not a token; no fallback */
        for (int b = 0; b < 256; b++)
            t->single_byte_tok[b] = -1;
    } else {
        t->kind = TOK_KIND_SPM; /* pieces: U+2581 is a space, <0xXX> a byte */
        t->char_level = 1;
        snprintf(t->model_name, sizeof t->model_name, "hf-char");
        for (int b = 0; b < 256; b++) {
            char buf[8];
            snprintf(buf, sizeof buf, "<0x%02X>", b);
            t->byte_tok[b] = t->byte_fallback ? tok_find(t, buf, 6) : -1;
            if (t->byte_tok[b] >= 0 && t->attr[t->byte_tok[b]] == TOK_A_NORMAL)
                t->attr[t->byte_tok[b]] = TOK_A_BYTE;
        }
    }
    if (!wp && (rc = tok_bpe_init(t, e)))
        goto fail;
    if (cfg_text) {
        L.file = cfg_name;
        /* INT_AS_REAL: save_pretrained writes model_max_length 1e30 as an integer; no integer
         * of tokenizer_config.json is read */
        if (!(cfg = parse(&L, cfg_text, cfg_len, JSON_DECODE_INT_AS_REAL, &rc)) ||
            (rc = load_config(&L, cfg)))
            goto fail;
    }
    int32_t fim[3] = {-1, -1, -1};
    tok_mark_eog(t, fim, 0);
    if ((rc = tok_list_special(t, e)))
        goto fail;
    if ((rc = tok_build_pieces(t))) {
        rc = md_errf(e, rc, "out of memory building token pieces");
        goto fail;
    }
    json_decref(root);
    json_decref(cfg);
    md_err_clear(e);
    *out = t;
    return 0;
fail:
    json_decref(root);
    json_decref(cfg);
    tok_free(t);
    return rc;
}

int tok_load_hf_mem(const char *json, size_t len, const char *config, size_t config_len,
                    tok_tokenizer **out, md_err *e) {
    return load(json, len, config, config_len, "tokenizer.json", "tokenizer_config.json", out, e);
}

/* Whole file into a malloc'd buffer (NUL-terminated). MD_ENOTFOUND when it does not exist. */
static int read_all(const char *path, char **buf, size_t *len, md_err *e) {
    *buf = NULL;
    *len = 0;
    struct stat pre; /* a FIFO would block fopen forever */
    if (stat(path, &pre) == 0 && !S_ISREG(pre.st_mode))
        return md_errf(e, MD_EIO, "%s: not a regular file", path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return md_errf(e, errno == ENOENT ? MD_ENOTFOUND : MD_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
        fclose(f);
        return md_errf(e, MD_EIO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size > HF_MAX_FILE_BYTES) {
        fclose(f);
        return md_errf(e, MD_ERANGE, "%s: %lld bytes, more than the %zu a tokenizer may have", path,
                       (long long)st.st_size, HF_MAX_FILE_BYTES);
    }
    char *b = malloc((size_t)st.st_size + 1);
    if (!b) {
        fclose(f);
        return md_errf(e, MD_ENOMEM, "%s: out of memory", path);
    }
    size_t n = fread(b, 1, (size_t)st.st_size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n != (size_t)st.st_size) {
        free(b);
        return md_errf(e, MD_EIO, "%s: read failed", path);
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

int tok_load_hf(const char *path, tok_tokenizer **out, md_err *e) {
    *out = NULL;
    struct stat st;
    if (!path || stat(path, &st))
        return md_errf(e, MD_ENOTFOUND, "%s: %s", path ? path : "(null)",
                       path ? strerror(errno) : "no path");
    size_t pl = strlen(path);
    char *dir = malloc(pl + 2), *json_path = malloc(pl + 32), *cfg_path = malloc(pl + 32),
         *jinja_path = malloc(pl + 32);
    char *json = NULL, *cfg = NULL, *jinja = NULL;
    size_t json_len = 0, cfg_len = 0, jinja_len = 0;
    int rc;
    if (!dir || !json_path || !cfg_path || !jinja_path) {
        rc = md_errf(e, MD_ENOMEM, "out of memory");
        goto done;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, pl + 2, "%s", path);
        snprintf(json_path, pl + 32, "%s/tokenizer.json", dir);
    } else {
        snprintf(json_path, pl + 32, "%s", path);
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(dir, pl + 2, "%.*s", (int)(slash - path), path);
        else
            snprintf(dir, pl + 2, ".");
    }
    snprintf(cfg_path, pl + 32, "%s/tokenizer_config.json", dir);
    snprintf(jinja_path, pl + 32, "%s/chat_template.jinja", dir);
    if ((rc = read_all(json_path, &json, &json_len, e)))
        goto done;
    md_err tmp = {0};
    if ((rc = read_all(cfg_path, &cfg, &cfg_len, &tmp)) && rc != MD_ENOTFOUND) {
        *e = tmp;
        goto done;
    }
    if ((rc = load(json, json_len, cfg, cfg_len, json_path, cfg_path, out, e)))
        goto done;
    /* newer checkpoints keep the template in its own file */
    if (!(*out)->chat_template && read_all(jinja_path, &jinja, &jinja_len, &tmp) == 0 &&
        (rc = tok_set_chat_template(*out, jinja, jinja_len, e))) {
        tok_free(*out);
        *out = NULL;
    }
done:
    free(dir);
    free(json_path);
    free(cfg_path);
    free(jinja_path);
    free(json);
    free(cfg);
    free(jinja);
    return rc;
}
