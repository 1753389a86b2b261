/* gr_build.c — the expression builder every front end uses: byte classes, sequences,
 * alternatives, bounded repetitions and named rules (gr_compile.c turns them into the grammar
 * the matcher runs). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/grammar_int.h"

void gb_init(gr_builder *b, md_err *e) {
    memset(b, 0, sizeof *b);
    b->e = e;
}

void gb_free(gr_builder *b) {
    for (int i = 0; i < b->nrules; i++)
        free(b->rules[i].name);
    free(b->rules);
    free(b->ex);
    free(b->cls);
    memset(b, 0, sizeof *b);
}

int gb_fail(gr_builder *b, int code, const char *fmt, ...) {
    if (!b->failed) {
        va_list ap;
        va_start(ap, fmt);
        md_verrf(b->e, code, fmt, ap);
        va_end(ap);
    }
    b->failed = 1;
    return -1;
}

int gb_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = nc;
    return 0;
}

static int add_expr(gr_builder *b, uint8_t kind, int a, int bb, int lo, int hi) {
    if (b->failed)
        return -1;
    if (b->nex >= GR_MAX_EXPRS)
        return gb_fail(b, MD_ENOMEM, "grammar too large: more than %d expression nodes",
                       GR_MAX_EXPRS);
    if (gb_grow((void **)&b->ex, &b->cex, b->nex + 1, sizeof *b->ex))
        return gb_fail(b, MD_ENOMEM, "out of memory building a grammar");
    gr_expr *x = &b->ex[b->nex];
    x->kind = kind;
    x->a = a;
    x->b = bb;
    x->lo = lo;
    x->hi = hi;
    return b->nex++;
}

int gb_empty(gr_builder *b) {
    return add_expr(b, GX_EMPTY, 0, 0, 0, 0);
}
int gb_none(gr_builder *b) {
    return add_expr(b, GX_NONE, 0, 0, 0, 0);
}

int gb_cls(gr_builder *b, const gr_cls *c) {
    if (b->failed)
        return -1;
    if (!(c->w[0] | c->w[1] | c->w[2] | c->w[3]))
        return gb_none(b);
    /* Classes repeat a lot (digits, string bytes): reuse the last few. */
    for (int i = b->ncls - 1; i >= 0 && i >= b->ncls - 16; i--)
        if (!memcmp(&b->cls[i], c, sizeof *c))
            return add_expr(b, GX_CLS, i, 0, 0, 0);
    if (gb_grow((void **)&b->cls, &b->ccls, b->ncls + 1, sizeof *b->cls))
        return gb_fail(b, MD_ENOMEM, "out of memory building a grammar");
    b->cls[b->ncls] = *c;
    return add_expr(b, GX_CLS, b->ncls++, 0, 0, 0);
}

int gb_byte(gr_builder *b, unsigned char c) {
    return gb_range(b, c, c);
}

int gb_range(gr_builder *b, unsigned lo, unsigned hi) {
    gr_cls c = {{0}};
    for (unsigned i = lo; i <= hi && i < 256; i++)
        gr_cls_set(&c, i);
    return gb_cls(b, &c);
}

int gb_lit(gr_builder *b, const char *s, size_t n) {
    int x = gb_empty(b);
    for (size_t i = 0; i < n; i++)
        x = gb_seq(b, x, gb_byte(b, (unsigned char)s[i]));
    return x;
}

int gb_str(gr_builder *b, const char *s) {
    return gb_lit(b, s, strlen(s));
}

int gb_seq(gr_builder *b, int x, int y) {
    if (x < 0 || y < 0)
        return -1;
    if (b->ex[x].kind == GX_EMPTY || b->ex[y].kind == GX_NONE)
        return y;
    if (b->ex[y].kind == GX_EMPTY || b->ex[x].kind == GX_NONE)
        return x;
    return add_expr(b, GX_SEQ, x, y, 0, 0);
}

int gb_seq3(gr_builder *b, int x, int y, int z) {
    return gb_seq(b, gb_seq(b, x, y), z);
}

int gb_alt(gr_builder *b, int x, int y) {
    if (x < 0 || y < 0)
        return -1;
    if (b->ex[x].kind == GX_NONE)
        return y;
    if (b->ex[y].kind == GX_NONE)
        return x;
    return add_expr(b, GX_ALT, x, y, 0, 0);
}

int gb_rep(gr_builder *b, int x, int lo, int hi) {
    if (x < 0)
        return -1;
    if (hi >= 0 && hi < lo)
        return gb_none(b);
    if (hi == 0)
        return gb_empty(b);
    if (lo == 1 && hi == 1)
        return x;
    return add_expr(b, GX_REP, x, 0, lo, hi);
}

int gb_opt(gr_builder *b, int x) {
    return gb_rep(b, x, 0, 1);
}
int gb_ref(gr_builder *b, int rule) {
    return rule < 0 ? -1 : add_expr(b, GX_REF, rule, 0, 0, 0);
}

static int rule_add(gr_builder *b, const char *name) {
    if (b->nrules >= GR_MAX_RULES)
        return gb_fail(b, MD_ENOMEM, "grammar too large: more than %d rules", GR_MAX_RULES);
    if (gb_grow((void **)&b->rules, &b->crules, b->nrules + 1, sizeof *b->rules))
        return gb_fail(b, MD_ENOMEM, "out of memory building a grammar");
    char *n = strdup(name);
    if (!n)
        return gb_fail(b, MD_ENOMEM, "out of memory building a grammar");
    b->rules[b->nrules].name = n;
    b->rules[b->nrules].expr = -1;
    return b->nrules++;
}

int gb_rule(gr_builder *b, const char *name) {
    if (b->failed)
        return -1;
    for (int i = 0; i < b->nrules; i++)
        if (!strcmp(b->rules[i].name, name))
            return i;
    return rule_add(b, name);
}

int gb_rule_new(gr_builder *b, const char *prefix) {
    if (b->failed)
        return -1;
    char name[96];
    snprintf(name, sizeof name, "%.60s#%d", prefix, b->nrules);
    return rule_add(b, name);
}

void gb_rule_set(gr_builder *b, int rule, int expr) {
    if (rule >= 0 && !b->failed)
        b->rules[rule].expr = expr;
}

int gb_utf8_char(gr_builder *b, const gr_cls *except) {
    gr_cls a = {{0}};
    for (unsigned i = 0; i < 0x80; i++)
        if (!except || !gr_cls_has(except, i))
            gr_cls_set(&a, i);
    int cont = gb_range(b, 0x80, 0xbf);
    int x = gb_cls(b, &a);
    x = gb_alt(b, x, gb_seq(b, gb_range(b, 0xc2, 0xdf), cont));
    x = gb_alt(b, x, gb_seq3(b, gb_byte(b, 0xe0), gb_range(b, 0xa0, 0xbf), cont));
    x = gb_alt(b, x, gb_seq3(b, gb_range(b, 0xe1, 0xec), cont, cont));
    x = gb_alt(b, x, gb_seq3(b, gb_byte(b, 0xed), gb_range(b, 0x80, 0x9f), cont));
    x = gb_alt(b, x, gb_seq3(b, gb_range(b, 0xee, 0xef), cont, cont));
    x = gb_alt(b, x, gb_seq(b, gb_seq3(b, gb_byte(b, 0xf0), gb_range(b, 0x90, 0xbf), cont), cont));
    x = gb_alt(b, x, gb_seq(b, gb_seq3(b, gb_range(b, 0xf1, 0xf3), cont, cont), cont));
    x = gb_alt(b, x, gb_seq(b, gb_seq3(b, gb_byte(b, 0xf4), gb_range(b, 0x80, 0x8f), cont), cont));
    return x;
}
