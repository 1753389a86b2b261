/* gr_schema_merge.c — allOf: merge the branches into one schema where the keywords allow it. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar/gr_schema_int.h"

/* Refuses a merge that would change what additionalProperties or items apply to. */
static int check_mergeable(sc *c, json_t *dst, json_t *src, const char *ptr) {
    /* additionalProperties only sees its own schema's properties: merging is exact only
     * when the other side names no property it lacks. */
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? src : dst, *y = side ? dst : src;
        json_t *ap = json_object_get(x, "additionalProperties");
        if (!ap || json_is_true(ap))
            continue;
        json_t *px = json_object_get(x, "properties"), *py = json_object_get(y, "properties");
        const char *pk;
        json_t *pv;
        json_object_foreach(py, pk, pv) {
            if (!json_object_get(px, pk))
                return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                               "cannot merge 'additionalProperties' with properties of another "
                               "subschema ('%s')",
                               pk);
        }
    }
    /* items only applies after its own schema's prefixItems: the same rule. */
    for (int side = 0; side < 2; side++) {
        json_t *x = side ? src : dst, *y = side ? dst : src;
        json_t *it = json_object_get(x, "items");
        json_t *py = json_object_get(y, "prefixItems");
        if (it && !json_is_true(it) && py && !json_equal(py, json_object_get(x, "prefixItems")))
            return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                           "cannot merge 'items' with 'prefixItems' of another subschema");
    }
    return 0;
}

/* Two "type"s merged: the types both allow ("number" with "integer" is "integer"). */
static int merge_types(sc *c, json_t *dst, json_t *old, json_t *v, const char *ptr) {
    json_t *tmp = json_object();
    json_object_set(tmp, "type", old);
    int a = sc_type_bits(c, tmp, ptr);
    json_object_set(tmp, "type", v);
    int bb = sc_type_bits(c, tmp, ptr);
    json_decref(tmp);
    if (a < 0 || bb < 0)
        return -1;
    int m = a & bb;
    if ((a & T_NUMBER) && !(bb & T_NUMBER) && (bb & T_INTEGER))
        m |= T_INTEGER;
    static const char *const names[] = {"null",   "boolean", "object", "array",
                                        "number", "string",  "integer"};
    json_t *arr = json_array();
    for (int i = 0; i < 7; i++)
        if ((m & (1 << i)) && !(i == 6 && (m & T_NUMBER)))
            json_array_append_new(arr, json_string(names[i]));
    json_object_set_new(dst, "type", arr);
    return 0;
}

int sc_merge_into(sc *c, json_t *dst, json_t *src, const char *ptr) {
    src = sc_deref_shallow(c, src, ptr);
    if (!src)
        return -1;
    if (json_is_true(src))
        return 0;
    if (json_is_false(src))
        return json_object_set_new(dst, "not", json_object()) ? -1 : 0;
    if (!json_is_object(src))
        return sc_fail(c, MD_EINVAL, "allOf", ptr, "a subschema must be an object or a boolean");
    if (check_mergeable(c, dst, src, ptr))
        return -1;
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        if (sc_is_annotation(k))
            continue;
        json_t *old = json_object_get(dst, k);
        if (!strcmp(k, "allOf")) {
            for (size_t i = 0; i < json_array_size(v); i++)
                if (sc_merge_into(c, dst, json_array_get(v, i), ptr))
                    return -1;
            continue;
        }
        if (!old) {
            json_object_set(dst, k, v);
            continue;
        }
        if (json_equal(old, v))
            continue;
        if (!strcmp(k, "properties") && json_is_object(old) && json_is_object(v)) {
            json_t *np = json_deep_copy(old);
            const char *pk;
            json_t *pv;
            json_object_foreach(v, pk, pv) {
                json_t *o = json_object_get(np, pk);
                if (!o)
                    json_object_set(np, pk, pv);
                else {
                    json_t *both = json_pack("{s:[OO]}", "allOf", o, pv);
                    json_object_set_new(np, pk, both);
                }
            }
            json_object_set_new(dst, k, np);
        } else if (!strcmp(k, "required") && json_is_array(old) && json_is_array(v)) {
            json_t *nr = json_copy(old);
            for (size_t i = 0; i < json_array_size(v); i++) {
                int have = 0;
                for (size_t j = 0; j < json_array_size(old); j++)
                    have |= json_equal(json_array_get(old, j), json_array_get(v, i));
                if (!have)
                    json_array_append(nr, json_array_get(v, i));
            }
            json_object_set_new(dst, k, nr);
        } else if (!strcmp(k, "minimum") || !strcmp(k, "exclusiveMinimum") ||
                   !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "minProperties")) {
            if (json_is_number(old) && json_is_number(v) &&
                json_number_value(v) > json_number_value(old))
                json_object_set(dst, k, v);
        } else if (!strcmp(k, "maximum") || !strcmp(k, "exclusiveMaximum") ||
                   !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "maxProperties")) {
            if (json_is_number(old) && json_is_number(v) &&
                json_number_value(v) < json_number_value(old))
                json_object_set(dst, k, v);
        } else if (!strcmp(k, "type")) {
            if (merge_types(c, dst, old, v, ptr))
                return -1;
        } else if (!strcmp(k, "additionalProperties") && (json_is_false(old) || json_is_false(v))) {
            /* false with other properties would differ; only when properties agree */
            if (json_object_get(dst, "properties") || json_object_get(src, "properties"))
                return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                               "cannot merge 'additionalProperties' across subschemas");
            json_object_set_new(dst, k, json_false());
        } else
            return sc_fail(c, MD_EUNSUPP, "allOf", ptr,
                           "cannot merge two different '%s' into one schema", k);
    }
    return 0;
}
