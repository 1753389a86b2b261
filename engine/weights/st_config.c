/* st_config.c — sentence-transformers directories (st_config.h): modules.json, the Pooling
 * module's config, sentence_bert_config.json and the model card's Matryoshka tag. */
#include "engine/weights/st_config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* DIR/name parsed; NULL with *missing = 1 when the file is absent, else an error in e. */
static json_t *load_json(const char *dir, const char *name, int *missing, md_err *e) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    *missing = stat(p, &st) != 0;
    if (*missing)
        return NULL;
    if (!S_ISREG(st.st_mode)) {
        md_errf(e, MD_EIO, "%s: not a regular file", p);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        md_errf(e, MD_EFORMAT, "%s: not valid JSON (line %d: %s)", p, je.line, je.text);
    return j;
}

const char *st_pooling_name(st_pooling p) {
    static const char *const names[] = {"mean", "cls", "max", "mean_sqrt_len_tokens", "lasttoken"};
    return (unsigned)p < 5 ? names[p] : "?";
}

/* The Pooling module's config.json at DIR/path: exactly one pooling_mode_* true. */
static int read_pooling(const char *dir, const char *path, st_config *c, md_err *e) {
    static const struct {
        const char *key;
        st_pooling mode;
    } modes[] = {
        {"pooling_mode_mean_tokens", ST_POOL_MEAN},
        {"pooling_mode_cls_token", ST_POOL_CLS},
        {"pooling_mode_max_tokens", ST_POOL_MAX},
        {"pooling_mode_mean_sqrt_len_tokens", ST_POOL_MEAN_SQRT},
        {"pooling_mode_lasttoken", ST_POOL_LAST},
    };
    char name[512];
    int missing, n_on = 0;
    snprintf(name, sizeof name, "%s/config.json", path);
    json_t *j = load_json(dir, name, &missing, e);
    if (!j)
        return missing ? md_errf(e, MD_EFORMAT, "%s/%s: the Pooling module's config is missing",
                                 dir, name)
                       : e->code;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if (!strncmp(k, "pooling_mode_", 13) && json_is_true(v)) {
            size_t i = 0;
            while (i < sizeof modes / sizeof modes[0] && strcmp(k, modes[i].key))
                i++;
            if (i == sizeof modes / sizeof modes[0]) {
                json_decref(j);
                return md_errf(e, MD_EUNSUPP, "%s/%s: %.64s is not supported", dir, name, k);
            }
            c->pooling = modes[i].mode;
            n_on++;
        }
    }
    json_t *d = json_object_get(j, "word_embedding_dimension");
    c->dim = json_is_integer(d) ? (int)json_integer_value(d) : 0;
    json_decref(j);
    if (n_on != 1)
        return md_errf(e, MD_EUNSUPP, "%s/%s: %d pooling modes are on; medley runs exactly one",
                       dir, name, n_on);
    return 0;
}

/* modules.json: [Transformer, Pooling, Normalize?] by type. */
static int read_modules(const char *dir, json_t *mods, st_config *c, md_err *e) {
    size_t n = json_array_size(mods);
    if (!json_is_array(mods) || n < 2 || n > 3)
        return md_errf(e, MD_EUNSUPP,
                       "%s/modules.json: medley runs Transformer, Pooling and an optional "
                       "Normalize (%zu modules given)",
                       dir, n);
    static const char *const want[] = {"sentence_transformers.models.Transformer",
                                       "sentence_transformers.models.Pooling",
                                       "sentence_transformers.models.Normalize"};
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(mods, i);
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *path = json_string_value(json_object_get(m, "path"));
        if (!type || strcmp(type, want[i]) || !path || strstr(path, ".."))
            return md_errf(e, MD_EUNSUPP, "%s/modules.json: module %zu is %.96s, expected %s", dir,
                           i, type ? type : "(no type)", want[i]);
        int rc = i == 1 ? read_pooling(dir, path, c, e) : 0;
        if (rc)
            return rc;
    }
    c->normalize = n == 3;
    return 0;
}

/* The model card's YAML front matter (between the first two "---" lines) names the tag. */
static int card_matryoshka(const char *dir) {
    char p[4096], line[512];
    snprintf(p, sizeof p, "%s/README.md", dir);
    FILE *f = fopen(p, "r");
    int n = 0, found = 0;
    while (f && fgets(line, sizeof line, f) && !found) {
        if (!strncmp(line, "---", 3) && ++n == 2)
            break;
        found = n == 1 && strstr(line, "- matryoshka") != NULL;
    }
    if (f)
        fclose(f);
    return found;
}

int st_config_load(const char *dir, st_config *c, md_err *e) {
    memset(c, 0, sizeof *c);
    int missing, rc;
    json_t *mods = load_json(dir, "modules.json", &missing, e);
    if (!mods)
        return missing ? 0 : e->code;
    rc = read_modules(dir, mods, c, e);
    json_decref(mods);
    if (rc)
        return rc;
    c->found = 1;
    json_t *sb = load_json(dir, "sentence_bert_config.json", &missing, e);
    if (!sb && !missing)
        return e->code;
    json_t *msl = json_object_get(sb, "max_seq_length");
    if (msl && (!json_is_integer(msl) || json_integer_value(msl) < 1 ||
                json_integer_value(msl) > 1 << 20)) {
        json_decref(sb);
        return md_errf(e, MD_EFORMAT,
                       "%s/sentence_bert_config.json: max_seq_length must be a positive integer",
                       dir);
    }
    c->max_seq_length = msl ? (int)json_integer_value(msl) : 0;
    json_decref(sb);
    c->matryoshka = card_matryoshka(dir);
    return 0;
}
