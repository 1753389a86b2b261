/* logprobs.c — see logprobs.h. */
#include "worker/logprobs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Length of the well-formed UTF-8 character at s[0..n) (Unicode Table 3-7), or 0 with *bad
 * the length of the maximal invalid subpart there (at least 1). */
static size_t utf8_char(const unsigned char *s, size_t n, size_t *bad) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0)
        need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        need = 2;
    else if (c == 0xED)
        need = 2, hi = 0x9F; /* no surrogates */
    else if (c == 0xF0)
        need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4)
        need = 3, hi = 0x8F; /* nothing past U+10FFFF */
    else {
        *bad = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= n || s[i] < lo || s[i] > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80, hi = 0xBF;
    }
    return need + 1;
}

size_t wk_utf8_sanitize(const char *bytes, size_t n, char *out) {
    const unsigned char *s = (const unsigned char *)bytes;
    size_t i = 0, w = 0;
    while (i < n) {
        size_t bad = 0, l = utf8_char(s + i, n - i, &bad);
        if (l) {
            memcpy(out + w, s + i, l);
            w += l;
            i += l;
        } else {
            memcpy(out + w, "\xef\xbf\xbd", 3);
            w += 3;
            i += bad;
        }
    }
    out[w] = 0;
    return w;
}

/* A logprob as JSON can hold it: a token whose raw logit was -inf gets -9999, the value
 * OpenAI gives tokens it deems impossible (JSON has no infinity). */
static double lp_value(float lp) {
    return isfinite(lp) ? (double)lp : -9999.0;
}

/* Appends v (stolen) to arr. Returns 0, or -1 when v is NULL or the append fails. */
static int append(json_t *arr, json_t *v) {
    if (!v)
        return -1;
    return json_array_append_new(arr, v);
}

/* {"token", "logprob", "bytes"} of a token's bytes; NULL out of memory. */
static json_t *token_obj(const char *b, size_t nb, float logprob, char *buf) {
    json_t *bytes = json_array();
    if (!bytes)
        return NULL;
    for (size_t k = 0; k < nb; k++)
        if (append(bytes, json_integer((unsigned char)b[k]))) {
            json_decref(bytes);
            return NULL;
        }
    size_t n = wk_utf8_sanitize(b, nb, buf);
    return json_pack("{s:s%, s:f, s:o}", "token", buf, n, "logprob", lp_value(logprob), "bytes",
                     bytes);
}

/* One chat entry: the token's object with "top_logprobs": its alternatives' objects, most
 * likely first; NULL out of memory. */
static json_t *chat_entry(const wk_token_lp *t, char *buf) {
    json_t *e = token_obj(t->bytes, t->n_bytes, t->logprob, buf), *top = json_array();
    int bad = !e || !top;
    for (int j = 0; j < t->n_top && !bad; j++)
        bad = append(top, token_obj(t->top[j].bytes, t->top[j].n_bytes, t->top[j].logprob, buf));
    if (bad) {
        json_decref(e);
        json_decref(top);
        return NULL;
    }
    if (json_object_set_new(e, "top_logprobs", top)) { /* top is released either way */
        json_decref(e);
        return NULL;
    }
    return e;
}

static json_t *chat_json(const wk_result *res, char *buf) {
    json_t *content = json_array();
    if (!content)
        return NULL;
    for (int i = 0; i < res->n_lp; i++)
        if (append(content, chat_entry(&res->lp[i], buf))) {
            json_decref(content);
            return NULL;
        }
    return json_pack("{s:o}", "content", content);
}

/* A completion token's alternatives as OpenAI's legacy object, text -> logprob. Two
 * alternatives can decode to the same text (after U+FFFD replacement): the first, more
 * likely one is kept. NULL out of memory. */
static json_t *completion_top(const wk_token_lp *t, char *buf) {
    json_t *o = json_object();
    for (int j = 0; j < t->n_top && o; j++) {
        size_t n = wk_utf8_sanitize(t->top[j].bytes, t->top[j].n_bytes, buf);
        if (memchr(buf, 0, n)) /* a key cannot hold NUL: such a token is left out */
            continue;
        if (!json_object_get(o, buf) &&
            json_object_set_new(o, buf, json_real(lp_value(t->top[j].logprob)))) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

static json_t *completion_json(const wk_result *res, char *buf) {
    json_t *tokens = json_array(), *lps = json_array(), *offsets = json_array();
    json_t *tops = res->top_logprobs > 0 ? json_array() : json_null();
    int bad = !tokens || !lps || !offsets || !tops;
    for (int i = 0; i < res->n_lp && !bad; i++) {
        const wk_token_lp *t = &res->lp[i];
        size_t n = wk_utf8_sanitize(t->bytes, t->n_bytes, buf);
        bad = append(tokens, json_stringn(buf, n)) ||
              append(lps, json_real(lp_value(t->logprob))) ||
              append(offsets, json_integer((json_int_t)t->text_offset)) ||
              (res->top_logprobs > 0 && append(tops, completion_top(t, buf)));
    }
    if (bad) {
        json_decref(tokens);
        json_decref(lps);
        json_decref(offsets);
        json_decref(tops);
        return NULL;
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offsets);
}

json_t *wk_logprobs_json(const wk_result *res, int chat) {
    if (!res->logprobs)
        return json_null();
    size_t longest = 0;
    for (int i = 0; i < res->n_lp; i++) {
        if (res->lp[i].n_bytes > longest)
            longest = res->lp[i].n_bytes;
        for (int j = 0; j < res->lp[i].n_top; j++)
            if (res->lp[i].top[j].n_bytes > longest)
                longest = res->lp[i].top[j].n_bytes;
    }
    char *buf = malloc(3 * longest + 1);
    if (!buf)
        return NULL;
    json_t *v = chat ? chat_json(res, buf) : completion_json(res, buf);
    free(buf);
    return v;
}
