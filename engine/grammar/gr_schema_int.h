/* gr_schema_int.h — private layout shared by the JSON Schema compiler's files (gr_schema*.c):
 * the compiler state, type bits, the text buffer and the steps each file provides. */
#ifndef MEDLEY_ENGINE_GRAMMAR_SCHEMA_INT_H
#define MEDLEY_ENGINE_GRAMMAR_SCHEMA_INT_H

#include <jansson.h>
#include <stddef.h>

#include "engine/grammar/grammar.h"
#include "engine/grammar/grammar_int.h"

#define SC_MAX_TEXT (4u << 20) /* bytes of schema text */
#define SC_MAX_DEPTH 64        /* nested subschemas */
#define SC_MAX_ENUM 100000
#define SC_MAX_LEN 10000 /* minLength / maxLength / minItems / maxItems we expand */

typedef struct {
    char *ptr;
    int rule;
} sc_refent;

typedef struct {
    gr_builder b;
    json_t *doc;
    int strict;
    char *relaxed;
    size_t relaxedsz, rlen;
    sc_refent *refs;
    int nrefs, crefs;
    sc_refent *strs; /* string constraints (canonical JSON of their keywords) -> rule */
    int nstr, cstr;
    int depth;
    int r_value, r_string, r_number; /* shared rules, -1 until first used */
} sc;

enum {
    T_NULL = 1,
    T_BOOL = 2,
    T_OBJECT = 4,
    T_ARRAY = 8,
    T_NUMBER = 16,
    T_STRING = 32,
    T_INTEGER = 64,
    T_ALL = 127
};

/* growable text ----------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, c;
    int oom;
} sbuf;

/* gr_schema.c */
int sc_fail(sc *c, int code, const char *kw, const char *ptr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int sc_unsupp(sc *c, const char *kw, const char *ptr, const char *why);
char *sc_ptr_join(const char *ptr, const char *key);
char *sc_ptr_idx(const char *ptr, const char *key, size_t i);
int sc_is_annotation(const char *k);
int sc_type_bits_of_value(const json_t *v);
int sc_type_bits(sc *c, json_t *s, const char *ptr);
json_t *sc_deref_shallow(sc *c, json_t *s, const char *ptr);
int sc_schema(sc *c, json_t *s, const char *ptr);

/* gr_schema_merge.c */
int sc_merge_into(sc *c, json_t *dst, json_t *src, const char *ptr);

/* gr_schema_object.c */
int sc_object_part(sc *c, json_t *s, const char *ptr);
int sc_array_part(sc *c, json_t *s, const char *ptr);

/* gr_schema_scalar.c */
int sc_string_expr(sc *c, int lo, int hi);
int sc_value_expr(sc *c);
int sc_get_count(sc *c, json_t *s, const char *kw, const char *ptr, int *out);
int sc_string_part(sc *c, json_t *s, const char *ptr);
int sc_numeric_part(sc *c, json_t *s, const char *ptr, int integer);

/* gr_schema_value.c */
void sb_put(sbuf *s, const char *x, size_t n);
void sb_puts(sbuf *s, const char *x);
void sb_json_str(sbuf *s, const char *x, size_t n);
int sc_enum_part(sc *c, json_t *s, const char *ptr, int types);

#endif
