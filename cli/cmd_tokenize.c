/* cmd_tokenize.c — `medley tokenize`: a model's tokenizer on text, printing ids and pieces.
 * See docs/tokenizer.md. */
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "engine/weights/gguf.h"
#include "engine/weights/hf_model.h"
#include "engine/weights/registry.h"
#include "engine/tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: medley tokenize -m MODEL [options] TEXT|-\n"
        "       medley tokenize --tokenizer FILE [options] TEXT|-\n"
        "\n"
        "Tokenize TEXT with MODEL's tokenizer (a registered model name, a GGUF path or a\n"
        "Hugging Face model directory) and print one line per token: ID, a tab, and the\n"
        "token's vocabulary string.\n"
        "\n"
        "  -m, --model MODEL   model name (see `medley models list`), GGUF file or a\n"
        "                      directory with tokenizer.json (+ tokenizer_config.json)\n"
        "      --tokenizer F   a Hugging Face tokenizer.json (or its directory)\n"
        "  -                   read stdin: each line is one input (its \\n or \\r\\n removed)\n"
        "      --whole         with -, all of stdin is a single input\n"
        "      --jsonl         with -, each line is one input written as a JSON string\n"
        "                      (texts with newlines)\n"
        "      --json          one JSON object per input and line:\n"
        "                      {\"ids\": [...], \"pieces\": [...]}\n"
        "      --ids           only the ids, space-separated, one line per input\n"
        "      --no-bos        never prepend BOS (default: when the model asks for it)\n"
        "      --no-special    treat special-token text (<|im_start|>) as plain text\n"
        "  -h, --help          this help\n"
        "\n"
        "Pieces are vocabulary strings as stored (byte-level BPE shows a space as \"\xc4\xa0\",\n"
        "SentencePiece as \"\xe2\x96\x81\"). Invalid UTF-8 in the input is replaced by U+FFFD\n"
        "the way llama.cpp does it; a sequence it cannot represent is refused.\n");
}

typedef enum { OUT_TEXT, OUT_JSON, OUT_IDS } out_mode;

/* A JSON string of bytes that may not be UTF-8 (vocabularies are not checked). */
static json_t *json_bytes(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j)
        return j;
    char *fixed = malloc(n * 3 + 1);
    if (!fixed)
        return NULL;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            fixed[w++] = (char)c;
        } else {
            memcpy(fixed + w, "\xef\xbf\xbd", 3);
            w += 3;
        }
    }
    j = json_stringn(fixed, w);
    free(fixed);
    return j;
}

static int print_one(const tok_tokenizer *t, const char *text, size_t len, int bos, int special,
                     out_mode mode) {
    int32_t *ids;
    int n;
    md_err e = {0};
    if (tok_encode(t, text, len, bos, special, &ids, &n, &e)) {
        fprintf(stderr, "medley tokenize: %s\n", e.msg);
        return 1;
    }
    if (mode == OUT_JSON) {
        json_t *o = json_object(), *ja = json_array(), *pa = json_array();
        for (int i = 0; i < n; i++) {
            const char *p = tok_token_text(t, ids[i]);
            json_array_append_new(ja, json_integer(ids[i]));
            json_array_append_new(pa, json_bytes(p, strlen(p)));
        }
        json_object_set_new(o, "ids", ja);
        json_object_set_new(o, "pieces", pa);
        char *s = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        if (!s) {
            free(ids);
            fprintf(stderr, "medley tokenize: out of memory\n");
            return 1;
        }
        puts(s);
        free(s);
    } else if (mode == OUT_IDS) {
        for (int i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        putchar('\n');
    } else {
        for (int i = 0; i < n; i++)
            printf("%d\t%s\n", ids[i], tok_token_text(t, ids[i]));
    }
    free(ids);
    return 0;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A Hugging Face directory or tokenizer.json, else a model name or GGUF file. */
static int load_tokenizer(const char *model, const char *tok_file, tok_tokenizer **t) {
    char path[PATH_MAX];
    md_err e = {0};
    gguf_file *f = NULL;
    int rc;
    if (tok_file || is_dir(model)) {
        rc = tok_load_hf(tok_file ? tok_file : model, t, &e);
    } else if ((rc = md_model_resolve(model, 1, path, sizeof path, &e)) == 0) {
        if (is_dir(path)) /* a registered Hugging Face directory */
            rc = tok_load_hf(path, t, &e);
        else
            rc = gguf_open(path, &f, &e) || tok_load(f, t, &e);
    }
    gguf_close(f);
    if (rc)
        fprintf(stderr, "medley tokenize: %s\n", e.msg);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *tok_file = NULL;
    int bos = 1, special = 1, whole = 0, jsonl = 0, have_text = 0;
    out_mode mode = OUT_TEXT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (++i >= argc) {
                fprintf(stderr, "medley tokenize: %s needs a model\n", a);
                return 2;
            }
            model = argv[i];
        } else if (!strcmp(a, "--tokenizer")) {
            if (++i >= argc) {
                fprintf(stderr, "medley tokenize: %s needs a tokenizer.json\n", a);
                return 2;
            }
            tok_file = argv[i];
        } else if (!strcmp(a, "--json")) {
            mode = OUT_JSON;
        } else if (!strcmp(a, "--ids")) {
            mode = OUT_IDS;
        } else if (!strcmp(a, "--no-bos")) {
            bos = 0;
        } else if (!strcmp(a, "--no-special")) {
            special = 0;
        } else if (!strcmp(a, "--whole")) {
            whole = 1;
        } else if (!strcmp(a, "--jsonl")) {
            jsonl = 1;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "medley tokenize: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (have_text) {
            fprintf(stderr, "medley tokenize: one TEXT only (quote it, or use - for stdin)\n");
            return 2;
        } else {
            text = a;
            have_text = 1;
        }
    }
    if (!model == !tok_file || !have_text) {
        fprintf(stderr, "medley tokenize: %s\n",
                model && tok_file ? "-m and --tokenizer exclude each other"
                : !have_text      ? "TEXT or - is required"
                                  : "-m MODEL or --tokenizer FILE is required");
        usage(stderr);
        return 2;
    }
    tok_tokenizer *t = NULL;
    if (load_tokenizer(model, tok_file, &t))
        return 1;
    int rc = 0;
    if (strcmp(text, "-")) {
        rc = print_one(t, text, strlen(text), bos, special, mode);
    } else if (whole) {
        size_t cap = 1 << 16, n = 0, r;
        char *buf = malloc(cap);
        while (buf && (r = fread(buf + n, 1, cap - n, stdin)) > 0) {
            n += r;
            if (n == cap) {
                char *nb = realloc(buf, cap * 2);
                if (!nb) {
                    free(buf);
                    buf = NULL;
                    break;
                }
                buf = nb;
                cap *= 2;
            }
        }
        if (!buf) {
            fprintf(stderr, "medley tokenize: out of memory reading stdin\n");
            rc = 1;
        } else {
            rc = print_one(t, buf, n, bos, special, mode);
        }
        free(buf);
    } else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        long no = 0;
        while ((n = getline(&line, &cap, stdin)) >= 0) {
            no++;
            if (n > 0 && line[n - 1] == '\n')
                n--;
            if (n > 0 && line[n - 1] == '\r') /* CRLF files: the line, not its ending */
                n--;
            if (jsonl) {
                json_error_t je;
                json_t *j = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                if (!json_is_string(j)) {
                    fprintf(stderr, "medley tokenize: stdin line %ld is not a JSON string%s%s\n",
                            no, j ? "" : ": ", j ? "" : je.text);
                    json_decref(j);
                    rc = 1;
                    break;
                }
                rc = print_one(t, json_string_value(j), json_string_length(j), bos, special, mode);
                json_decref(j);
            } else {
                rc = print_one(t, line, (size_t)n, bos, special, mode);
            }
            if (rc)
                break;
        }
        free(line);
    }
    tok_free(t);
    return rc;
}
