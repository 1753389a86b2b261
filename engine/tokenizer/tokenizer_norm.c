/* tokenizer_norm.c — tokenizer.json normalization of one text fragment at encode time: the
 * normalizer steps tokenizer_hf.c loaded (NFC through utf8proc, Prepend, Replace), then
 * Metaspace's replacement and ByteLevel's add_prefix_space, ping-ponging between two scratch
 * buffers so a fragment allocates nothing once they have grown. */
#define _GNU_SOURCE /* memmem */
#include "engine/tokenizer/tokenizer_norm.h"

#include <string.h>

#include <utf8proc.h>

static int reserve(tok_scratch *sc, int k, size_t need) {
    if (need <= sc->hf_cap[k])
        return 0;
    size_t c = sc->hf_cap[k] ? sc->hf_cap[k] : 256;
    while (c < need)
        c *= 2;
    char *n = realloc(sc->hf_buf[k], c);
    if (!n)
        return MD_ENOMEM;
    sc->hf_buf[k] = n;
    sc->hf_cap[k] = c;
    return 0;
}

/* NFC of in[0..n) into buffer k; runs of encoded surrogates (which utf8proc refuses) are
 * copied as they are. Text below U+0300 is NFC already and is returned unchanged. */
static int nfc(tok_scratch *sc, int k, const char *in, size_t n, const char **out,
               size_t *out_len) {
    size_t i = 0;
    while (i < n && (uint8_t)in[i] < 0xCC)
        i++;
    if (i == n) {
        *out = in;
        *out_len = n;
        return 0;
    }
    size_t w = 0;
    for (size_t start = 0; start < n;) {
        size_t end = start;
        while (end < n &&
               !((uint8_t)in[end] == 0xED && end + 1 < n && (uint8_t)in[end + 1] >= 0xA0))
            end++;
        if (end > start) {
            utf8proc_uint8_t *d = NULL;
            utf8proc_ssize_t m =
                utf8proc_map((const utf8proc_uint8_t *)in + start, (utf8proc_ssize_t)(end - start),
                             &d, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (m < 0) { /* not expected after repair: keep the text */
                free(d);
                d = NULL;
                m = (utf8proc_ssize_t)(end - start);
            }
            if (reserve(sc, k, w + (size_t)m + 4)) {
                free(d);
                return MD_ENOMEM;
            }
            memcpy(sc->hf_buf[k] + w, d ? (const char *)d : in + start, (size_t)m);
            w += (size_t)m;
            free(d);
        }
        if (end < n) { /* one surrogate: 3 bytes */
            size_t l = n - end < 3 ? n - end : 3;
            if (reserve(sc, k, w + l + 4))
                return MD_ENOMEM;
            memcpy(sc->hf_buf[k] + w, in + end, l);
            w += l;
            end += l;
        }
        start = end;
    }
    *out = sc->hf_buf[k];
    *out_len = w;
    return 0;
}

/* in with every `from` replaced by `to` (and `pre` prepended) into buffer k. */
static int replace(tok_scratch *sc, int k, const char *pre, size_t pre_len, const char *in,
                   size_t n, const char *from, size_t fl, const char *to, size_t tl,
                   const char **out, size_t *out_len) {
    size_t count = 0;
    if (fl)
        for (const char *p = in; (p = memmem(p, n - (size_t)(p - in), from, fl)); p += fl)
            count++;
    size_t need = pre_len + n + count * (tl > fl ? tl - fl : 0) + 4;
    if (reserve(sc, k, need))
        return MD_ENOMEM;
    char *o = sc->hf_buf[k];
    size_t w = pre_len;
    if (pre_len)
        memcpy(o, pre, pre_len);
    const char *p = in, *end = in + n;
    while (fl && p < end) {
        const char *m = memmem(p, (size_t)(end - p), from, fl);
        if (!m)
            break;
        memcpy(o + w, p, (size_t)(m - p));
        w += (size_t)(m - p);
        memcpy(o + w, to, tl);
        w += tl;
        p = m + fl;
    }
    memcpy(o + w, p, (size_t)(end - p));
    w += (size_t)(end - p);
    *out = o;
    *out_len = w;
    return 0;
}

int tok_hf_normalize(const tok_tokenizer *t, tok_scratch *sc, const char *in, size_t n,
                     int at_start, const char **out, size_t *out_len, md_err *e) {
    const char *cur = in;
    size_t len = n;
    int k = 0, rc = 0;
    for (int i = 0; i < t->n_norm && !rc; i++) {
        const tok_norm_step *s = &t->norm[i];
        const char *next = cur;
        size_t nl = len;
        if (s->kind == TOK_NORM_NFC)
            rc = nfc(sc, k, cur, len, &next, &nl);
        else if (s->kind == TOK_NORM_PREPEND && len == 0) /* only a non-empty text */
            next = cur, nl = len;
        else if (s->kind == TOK_NORM_PREPEND)
            rc = replace(sc, k, s->a, s->a_len, cur, len, NULL, 0, NULL, 0, &next, &nl);
        else
            rc = replace(sc, k, NULL, 0, cur, len, s->a, s->a_len, s->b, s->b_len, &next, &nl);
        if (next != cur)
            k ^= 1;
        cur = next;
        len = nl;
    }
    if (!rc && t->metaspace[0]) {
        size_t ml = strlen(t->metaspace);
        int prepend = (t->meta_prepend == 2 || (t->meta_prepend == 1 && at_start));
        const char *next = cur;
        size_t nl = len;
        /* spaces first; then the replacement is prepended unless the text starts with one */
        rc = replace(sc, k, NULL, 0, cur, len, " ", 1, t->metaspace, ml, &next, &nl);
        k ^= 1;
        cur = next;
        len = nl;
        if (!rc && prepend && (len < ml || memcmp(cur, t->metaspace, ml))) {
            rc = replace(sc, k, t->metaspace, ml, cur, len, NULL, 0, NULL, 0, &next, &nl);
            k ^= 1;
            cur = next;
            len = nl;
        }
    }
    if (!rc && t->prefix_space && (len == 0 || cur[0] != ' ')) {
        const char *next = cur;
        size_t nl = len;
        rc = replace(sc, k, " ", 1, cur, len, NULL, 0, NULL, 0, &next, &nl);
        cur = next;
        len = nl;
    }
    if (rc)
        return md_errf(e, MD_ENOMEM, "tokenize: out of memory");
    *out = cur;
    *out_len = len;
    return 0;
}
