/* tokenizer_wordpiece.c — BERT's tokenizer as a tokenizer.json describes it, equal to
 * Hugging Face's `tokenizers` (facts from its documentation and behaviour, our own code).
 *
 * A text fragment goes through four stages, one character at a time, so memory stays small
 * whatever the text's length:
 *   1. BertNormalizer's clean_text (drop NUL, U+FFFD and control/format/private-use
 *      characters; every whitespace becomes ' ') and handle_chinese_chars (spaces around
 *      CJK ideographs);
 *   2. strip_accents: NFD (libutf8proc; combining marks put in canonical order) without
 *      nonspacing marks (Mn);
 *   3. lowercase: Unicode's full lowercase of each character (U+0130 becomes "i" U+0307);
 *   4. BertPreTokenizer: whitespace ends a word, punctuation (ASCII punctuation and the P*
 *      categories) is a word of its own;
 * then WordPiece: the longest vocabulary string at the start of the word, the longest
 * continuation-prefixed one after it, and so on; a word with no such cover, or longer than
 * max_input_chars_per_word characters, is one unk token.
 *
 * The categories are libutf8proc's, corrected by tokenizer_wordpiece_ucd.c to the older
 * Unicode tables `tokenizers` uses (docs/tokenizer.md, "WordPiece"). */
#include "engine/tokenizer/tokenizer_wordpiece.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "common/util.h"
#include "engine/tokenizer/tokenizer_wordpiece_ucd.h"

/* ---- loading ---- */

static int bool_at(json_t *obj, const char *key, int *out, const char *file, const char *path,
                   md_err *e) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return md_errf(e, MD_EFORMAT, "%s: %s '%s' is %s, expected true or false", file, path, key,
                       md_json_type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* A string option of at most cap-1 bytes into out (kept when absent or null). */
static int prefix_at(json_t *obj, const char *key, char *out, size_t cap, size_t *len,
                     const char *file, const char *path, md_err *e) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return md_errf(e, MD_EFORMAT, "%s: %s '%s' is %s, expected a string", file, path, key,
                       md_json_type_name(v));
    size_t n = json_string_length(v);
    if (n >= cap)
        return md_errf(e, MD_EUNSUPP, "%s: %s '%s' is %zu bytes long, more than %zu", file, path,
                       key, n, cap - 1);
    memcpy(out, json_string_value(v), n);
    out[n] = '\0';
    *len = n;
    return 0;
}

int tok_wp_load_model(tok_tokenizer *t, json_t *model, json_t *added, const char *file, md_err *e) {
    t->kind = TOK_KIND_WP;
    memcpy(t->wp.prefix, "##", 3);
    t->wp.prefix_len = 2;
    t->wp.max_chars = 100;
    int rc = prefix_at(model, "continuing_subword_prefix", t->wp.prefix, sizeof t->wp.prefix,
                       &t->wp.prefix_len, file, "model", e);
    if (rc)
        return rc;
    json_t *mx = json_object_get(model, "max_input_chars_per_word");
    if (mx && !json_is_null(mx)) {
        if (!json_is_integer(mx) || json_integer_value(mx) < 0 ||
            json_integer_value(mx) > (1 << 30))
            return md_errf(e, MD_EFORMAT,
                           "%s: model.max_input_chars_per_word is %s, expected an integer in "
                           "0..2^30",
                           file, json_is_integer(mx) ? "out of range" : md_json_type_name(mx));
        t->wp.max_chars = (int)json_integer_value(mx);
    }
    json_t *unk = json_object_get(model, "unk_token");
    if (!json_is_string(unk))
        return md_errf(e, MD_EFORMAT, "%s: model.unk_token is %s, expected a token string", file,
                       unk ? md_json_type_name(unk) : "missing");
    t->unk = tok_find(t, json_string_value(unk), json_string_length(unk));
    if (t->unk < 0)
        return md_errf(e, MD_EFORMAT, "%s: model.unk_token '%.60s' is not in model.vocab", file,
                       json_string_value(unk));
    if (t->attr[t->unk] & TOK_A_CONTROL)
        t->attr[t->unk] = TOK_A_UNKNOWN;
    /* added tokens missing from model.vocab are not WordPiece's to produce */
    json_t *vocab = json_object_get(model, "vocab");
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        const char *c = json_string_value(json_object_get(a, "content"));
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        if (c && !json_object_get(vocab, c) && id >= 0 && id < t->n_vocab)
            t->tok_flags[id] |= TOK_F_ADDED_ONLY;
    }
    return 0;
}

int tok_wp_load_normalizer(tok_tokenizer *t, json_t *p, const char *file, const char *path,
                           md_err *e) {
    if (t->wp.have_norm)
        return md_errf(e, MD_EUNSUPP, "%s: %s: a second BertNormalizer is not supported", file,
                       path);
    int clean = 1, chinese = 1, lower = 1, strip = -1, rc;
    if ((rc = bool_at(p, "clean_text", &clean, file, path, e)) ||
        (rc = bool_at(p, "handle_chinese_chars", &chinese, file, path, e)) ||
        (rc = bool_at(p, "lowercase", &lower, file, path, e)) ||
        (rc = bool_at(p, "strip_accents", &strip, file, path, e)))
        return rc;
    t->wp.have_norm = 1;
    t->wp.clean_text = clean;
    t->wp.chinese = chinese;
    t->wp.lowercase = lower;
    t->wp.strip_accents = strip < 0 ? lower : strip; /* null: as lowercase (BERT's rule) */
    return 0;
}

int tok_wp_load_decoder(tok_tokenizer *t, json_t *p, const char *file, const char *path,
                        md_err *e) {
    t->wp.decoder = 1;
    t->wp.cleanup = 1;
    memcpy(t->wp.dec_prefix, "##", 3);
    t->wp.dec_prefix_len = 2;
    int rc = prefix_at(p, "prefix", t->wp.dec_prefix, sizeof t->wp.dec_prefix,
                       &t->wp.dec_prefix_len, file, path, e);
    return rc ? rc : bool_at(p, "cleanup", &t->wp.cleanup, file, path, e);
}

void tok_wp_finish(tok_tokenizer *t) {
    snprintf(t->model_name, sizeof t->model_name, "hf-wordpiece");
    t->wp.max_tok = 0;
    for (int id = 0; id < t->n_vocab; id++)
        if (t->str_len[id] > t->wp.max_tok)
            t->wp.max_tok = t->str_len[id];
}

/* ---- character classes ---- */

static int in_ranges(const tok_ucd_range *r, size_t n, uint32_t c, uint32_t *hi) {
    size_t lo = 0;
    while (lo < n) {
        size_t mid = lo + (n - lo) / 2;
        if (c < r[mid].lo)
            n = mid;
        else if (c > r[mid].hi)
            lo = mid + 1;
        else {
            if (hi)
                *hi = r[mid].hi;
            return 1;
        }
    }
    return 0;
}

/* libutf8proc's category test, flipped where `tokenizers` answers otherwise. */
static int ucd_is(int k, uint32_t c) {
    int cat = utf8proc_category((utf8proc_int32_t)c), base;
    if (k == TOK_UCD_OTHER)
        base = cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
               cat == UTF8PROC_CATEGORY_CO;
    else if (k == TOK_UCD_PUNCT)
        base = cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO;
    else
        base = cat == UTF8PROC_CATEGORY_MN;
    return base ^ in_ranges(tok_ucd_flips[k], tok_ucd_n_flips[k], c, NULL);
}

static uint32_t ucd_lower(uint32_t c) {
    uint32_t l;
    if (in_ranges(tok_ucd_lower_pairs, tok_ucd_n_lower_pairs, c, &l))
        return l;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
}

static int is_space(uint32_t c) { /* Rust's char::is_whitespace (White_Space) */
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* The CJK ideograph blocks BertNormalizer surrounds with spaces. */
static int is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int is_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r')
        return 0;
    return ucd_is(TOK_UCD_OTHER, c);
}

static int is_punct(uint32_t c) {
    if (c < 128)
        return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
               (c >= 123 && c <= 126);
    return ucd_is(TOK_UCD_PUNCT, c);
}

/* ---- encoding: the stages ---- */

typedef struct {
    const tok_tokenizer *t;
    tok_scratch *sc;
    tok_out *out;
    size_t word_len, word_chars; /* the word so far: hf_buf[0][0..word_len) */
    size_t n_marks;              /* sc->marks[0..n_marks): combining marks not yet emitted */
} wp_state;

/* Append the UTF-8 of c to sc->hf_buf[i] at *len. */
static int put_utf8(tok_scratch *sc, int i, size_t *len, uint32_t c) {
    if (tok_grow((void **)&sc->hf_buf[i], &sc->hf_cap[i], *len + 4, 1))
        return MD_ENOMEM;
    *len += (size_t)utf8proc_encode_char((utf8proc_int32_t)c, (uint8_t *)sc->hf_buf[i] + *len);
    return 0;
}

static int is_token(const tok_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && !(t->tok_flags[id] & TOK_F_ADDED_ONLY);
}

/* WordPiece on w[0..n): greedy longest match from the left. On failure the word's pieces
 * are taken back and it is one unk. */
static int wordpiece(wp_state *s, const char *w, size_t n) {
    const tok_tokenizer *t = s->t;
    size_t pl = t->wp.prefix_len, mark = s->out->n;
    /* candidate buffer: prefix + the rest of the word */
    if (tok_grow((void **)&s->sc->hf_buf[1], &s->sc->hf_cap[1], pl + n, 1))
        return MD_ENOMEM;
    char *cand = s->sc->hf_buf[1];
    memcpy(cand, t->wp.prefix, pl);
    size_t start = 0;
    while (start < n) {
        size_t skip = start ? 0 : pl; /* the first piece has no prefix */
        memcpy(cand + pl, w + start, n - start);
        size_t end = n, used = start ? pl : 0;
        size_t room = t->wp.max_tok > used ? t->wp.max_tok - used : 0;
        if (end - start > room) { /* nothing longer than the longest token can match */
            end = start + room;
            while (end > start && ((uint8_t)w[end] & 0xC0) == 0x80)
                end--;
        }
        int32_t id = -1;
        while (end > start) {
            int32_t f = tok_str_lookup(t, cand + skip, pl - skip + end - start);
            if (is_token(t, f)) {
                id = f;
                break;
            }
            do
                end--;
            while (end > start && ((uint8_t)w[end] & 0xC0) == 0x80);
        }
        if (id < 0) {
            s->out->n = mark;
            return tok_out_push(s->out, t->unk);
        }
        if (tok_out_push(s->out, id))
            return MD_ENOMEM;
        start = end;
    }
    return 0;
}

static int end_word(wp_state *s) {
    if (s->word_chars == 0)
        return 0;
    int rc = s->word_chars > (size_t)s->t->wp.max_chars
                 ? tok_out_push(s->out, s->t->unk)
                 : wordpiece(s, s->sc->hf_buf[0], s->word_len);
    s->word_len = s->word_chars = 0;
    return rc;
}

/* Stage 4: BertPreTokenizer. A word longer than max_chars is only counted. */
static int pre_tokenize(wp_state *s, uint32_t c) {
    int rc;
    if (s->t->wp.bert_pre) {
        if (is_space(c))
            return end_word(s);
        if (is_punct(c) && (rc = end_word(s)))
            return rc;
    }
    if (++s->word_chars <= (size_t)s->t->wp.max_chars && put_utf8(s->sc, 0, &s->word_len, c))
        return MD_ENOMEM;
    return s->t->wp.bert_pre && is_punct(c) ? end_word(s) : 0;
}

/* Stage 3: lowercase (Unicode's full mapping: only U+0130 lowercases to two characters). */
static int lowercase(wp_state *s, uint32_t c) {
    if (!s->t->wp.lowercase)
        return pre_tokenize(s, c);
    if (c == 0x130) {
        int rc = pre_tokenize(s, 'i');
        return rc ? rc : pre_tokenize(s, 0x307);
    }
    return pre_tokenize(s, ucd_lower(c));
}

/* The held combining marks in canonical order (stable by combining class), less the
 * nonspacing ones, to stage 3. Counting sort: a run of marks may be arbitrarily long. */
static int flush_marks(wp_state *s) {
    uint32_t *m = s->sc->marks;
    size_t n = s->n_marks;
    s->n_marks = 0;
    if (n == 0)
        return 0;
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++)
        count[utf8proc_get_property((utf8proc_int32_t)m[i])->combining_class + 1]++;
    for (int k = 1; k < 257; k++)
        count[k] += count[k - 1];
    for (int ccc = 1; ccc < 256; ccc++) { /* emit class by class, in input order */
        if (count[ccc + 1] == count[ccc])
            continue;
        for (size_t i = 0; i < n; i++) {
            if (utf8proc_get_property((utf8proc_int32_t)m[i])->combining_class != ccc ||
                ucd_is(TOK_UCD_MN, m[i]))
                continue;
            int rc = lowercase(s, m[i]);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Stage 2: strip_accents (NFD, then drop Mn). */
static int strip_accents(wp_state *s, uint32_t c) {
    if (!s->t->wp.strip_accents)
        return lowercase(s, c);
    utf8proc_int32_t d[32];
    int last = 0;
    utf8proc_ssize_t n =
        utf8proc_decompose_char((utf8proc_int32_t)c, d, 32, UTF8PROC_DECOMPOSE, &last);
    if (n < 0 || n > 32) { /* not a character utf8proc knows: itself */
        d[0] = (utf8proc_int32_t)c;
        n = 1;
    }
    for (utf8proc_ssize_t i = 0; i < n; i++) {
        uint32_t x = (uint32_t)d[i];
        int rc;
        if (utf8proc_get_property(d[i])->combining_class) {
            if (tok_grow((void **)&s->sc->marks, &s->sc->marks_cap, s->n_marks + 1,
                         sizeof *s->sc->marks))
                return MD_ENOMEM;
            s->sc->marks[s->n_marks++] = x;
            continue;
        }
        if ((rc = flush_marks(s)))
            return rc;
        if (!ucd_is(TOK_UCD_MN, x) && (rc = lowercase(s, x)))
            return rc;
    }
    return 0;
}

/* Stage 1: clean_text and handle_chinese_chars. */
static int clean(wp_state *s, uint32_t c) {
    const tok_tokenizer *t = s->t;
    if (t->wp.clean_text) {
        if (c == 0 || c == 0xFFFD || is_control(c))
            return 0;
        if (is_space(c))
            c = ' ';
    }
    if (t->wp.chinese && is_cjk(c)) {
        int rc;
        if ((rc = strip_accents(s, ' ')) || (rc = strip_accents(s, c)))
            return rc;
        return strip_accents(s, ' ');
    }
    return strip_accents(s, c);
}

int tok_wp_encode(const tok_tokenizer *t, tok_scratch *sc, const char *text, size_t len,
                  tok_out *out, md_err *e) {
    wp_state s = {t, sc, out, 0, 0, 0};
    const uint8_t *p = (const uint8_t *)text;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        uint32_t c;
        int inc = 0, bad = 1;
        int l = tok_utf8_strict(p + i, len - i, &c, &inc, &bad);
        if (l > 0) {
            i += (size_t)l;
        } else { /* one U+FFFD per maximal invalid subpart (a cut-off start: the rest) */
            c = 0xFFFD;
            i = inc ? len : i + (size_t)(bad > 0 ? bad : 1);
        }
        rc = clean(&s, c);
    }
    if (!rc)
        rc = flush_marks(&s);
    if (!rc)
        rc = end_word(&s);
    if (rc)
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    return 0;
}
