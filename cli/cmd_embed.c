/* cmd_embed.c — `medley embed`: an embedding model on stdin, one vector per input line, as
 * JSON arrays on stdout (docs/embeddings.md). Inputs are gathered and embedded in packed
 * steps, as the worker does; --stats prints inputs/s and tokens/s to stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "common/util.h"
#include "engine/embedder.h"
#include "engine/weights/registry.h"

static void usage(FILE *f) {
    fprintf(f, "usage: medley embed -m MODEL [options] < INPUTS\n"
               "\n"
               "Embed each line of stdin with MODEL (a registered name, a GGUF file or a\n"
               "sentence-transformers / Hugging Face directory) and print one JSON array of\n"
               "floats per line, in input order.\n"
               "\n"
               "  -m, --model MODEL   the embedding model\n"
               "      --ids           each line is a JSON array of token ids, not text\n"
               "      --jsonl         each line is a JSON string (texts with newlines)\n"
               "      --device D      cpu (default), cpu:N, cpu-exact, cuda:K, cuda-exact:K\n"
               "      --threads N     CPU threads (default: every core)\n"
               "      --step-tokens N tokens per packed forward pass (default 4096)\n"
               "      --truncate      cut inputs longer than the model's max_seq_length\n"
               "      --stats         print inputs/s and tokens/s to stderr\n"
               "      --bf16          an encoder's products in BF16 (AVX512-BF16 CPUs; F32 sums)\n"
               "  -h, --help          this help\n");
}

typedef struct {
    int32_t **ids;
    int *lens;
    int n, cap;
} inputs;

static int push(inputs *in, int32_t *ids, int n) {
    if (in->n == in->cap) {
        int nc = in->cap ? in->cap * 2 : 1024;
        int32_t **a = realloc(in->ids, (size_t)nc * sizeof *a);
        int *l = a ? realloc(in->lens, (size_t)nc * sizeof *l) : NULL;
        if (a)
            in->ids = a;
        if (!a || !l)
            return -1;
        in->lens = l;
        in->cap = nc;
    }
    in->ids[in->n] = ids;
    in->lens[in->n++] = n;
    return 0;
}

/* One line to token ids: a JSON array of ids, a JSON string, or the raw text. */
static int line_ids(md_embedder *m, const char *line, size_t len, int ids_mode, int jsonl,
                    int32_t **ids, int *n, md_err *e) {
    if (!ids_mode && !jsonl)
        return md_embedder_tokenize(m, line, len, ids, n, e);
    json_error_t je;
    json_t *j = json_loadb(line, len, JSON_DECODE_ANY, &je);
    int rc = 0;
    if (!j)
        return md_errf(e, MD_EFORMAT, "not JSON: %s", je.text);
    if (jsonl && json_is_string(j))
        rc = md_embedder_tokenize(m, json_string_value(j), json_string_length(j), ids, n, e);
    else if (ids_mode && json_is_array(j) && json_array_size(j) > 0) {
        *n = (int)json_array_size(j);
        *ids = malloc((size_t)*n * sizeof **ids);
        for (int i = 0; *ids && i < *n; i++) {
            json_t *v = json_array_get(j, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                rc = md_errf(e, MD_EINVAL, "element %d is not a token id", i);
            else
                (*ids)[i] = (int32_t)json_integer_value(v);
        }
        if (!*ids)
            rc = md_errf(e, MD_ENOMEM, "out of memory");
    } else
        rc = md_errf(e, MD_EINVAL, "expected %s", ids_mode ? "an array of token ids" : "a string");
    json_decref(j);
    return rc;
}

static int print_vectors(const float *v, int n, int dim) {
    for (int i = 0; i < n; i++) {
        putchar('[');
        for (int c = 0; c < dim; c++)
            printf(c ? ",%.9g" : "%.9g", v[(size_t)i * dim + c]);
        puts("]");
    }
    return ferror(stdout) ? 1 : 0;
}

int cmd_embed(int argc, char **argv) {
    const char *model = NULL;
    md_embedder_opts o = {0};
    int ids_mode = 0, jsonl = 0, stats = 0, truncate = 0, bf16 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && more)
            model = argv[++i];
        else if (!strcmp(a, "--device") && more)
            o.device = argv[++i];
        else if (!strcmp(a, "--threads") && more)
            o.n_threads = atoi(argv[++i]);
        else if (!strcmp(a, "--step-tokens") && more)
            o.max_tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--ids"))
            ids_mode = 1;
        else if (!strcmp(a, "--jsonl"))
            jsonl = 1;
        else if (!strcmp(a, "--stats"))
            stats = 1;
        else if (!strcmp(a, "--truncate"))
            truncate = 1;
        else if (!strcmp(a, "--bf16"))
            bf16 = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    char path[4096];
    md_err e = {0};
    md_embedder *m = NULL;
    if (md_model_resolve(model, 1, path, sizeof path, &e) || md_embedder_open(path, &o, &m, &e) ||
        (bf16 && md_embedder_set_bf16(m, 1, &e))) {
        md_embedder_close(m);
        fprintf(stderr, "medley embed: %s\n", e.msg);
        return 1;
    }
    inputs in = {0};
    char *line = NULL;
    size_t cap = 0, toks = 0;
    ssize_t len;
    int rc = 0;
    double t0 = md_wall_s() * 1000.0;
    for (int no = 1; rc == 0 && (len = getline(&line, &cap, stdin)) >= 0; no++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        int32_t *ids = NULL;
        int n = 0;
        if (line_ids(m, line, (size_t)len, ids_mode, jsonl, &ids, &n, &e) ||
            (n > md_embedder_max_len(m) && !truncate &&
             md_errf(&e, MD_ERANGE, "%d tokens; the model takes at most %d (--truncate cuts)", n,
                     md_embedder_max_len(m)))) {
            fprintf(stderr, "medley embed: line %d: %s\n", no, e.msg);
            free(ids);
            rc = 1;
        } else if (push(&in, ids, n > md_embedder_max_len(m) ? md_embedder_max_len(m) : n)) {
            free(ids);
            rc = 1;
        } else
            toks += (size_t)in.lens[in.n - 1];
    }
    free(line);
    double t1 = md_wall_s() * 1000.0;
    int dim = md_embedder_dim(m);
    float *out = rc ? NULL : malloc((size_t)(in.n ? in.n : 1) * dim * sizeof *out);
    if (!rc &&
        (!out || md_embedder_run(m, (const int32_t *const *)in.ids, in.lens, in.n, out, &e))) {
        fprintf(stderr, "medley embed: %s\n", out ? e.msg : "out of memory");
        rc = 1;
    }
    double t2 = md_wall_s() * 1000.0;
    if (!rc)
        rc = print_vectors(out, in.n, dim);
    if (!rc && stats)
        fprintf(stderr,
                "embed: %d inputs, %zu tokens; tokenize %.1f ms, forward %.1f ms: %.1f "
                "inputs/s, %.0f tokens/s\n",
                in.n, toks, t1 - t0, t2 - t1, in.n * 1000.0 / (t2 - t0 + 1e-9),
                toks * 1000.0 / (t2 - t0 + 1e-9));
    for (int i = 0; i < in.n; i++)
        free(in.ids[i]);
    free(in.ids);
    free(in.lens);
    free(out);
    md_embedder_close(m);
    return rc;
}
