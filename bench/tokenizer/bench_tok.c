/* bench_tok.c — medley's tokenizer throughput on a text file, for bench/tokenizer/bench.py.
 *
 *   bench_tok MODEL.gguf TEXT_FILE MODE REPEATS [IDS_OUT]
 *   bench_tok MODEL.gguf --pieces      every token's piece (render_special), hex, one a line
 *
 * MODE "whole": the file is one text; "lines": each line (with its \n) is one text, as a
 * batch of many prompts. Prints one JSON line: bytes, tokens, best CPU seconds of this process
 * (CLOCK_PROCESS_CPUTIME_ID: other jobs on a shared machine do not count) and MB/s (10^6 bytes
 * per CPU second), over REPEATS runs; no special-token parsing, no BOS (plain text).
 * IDS_OUT (whole mode): the ids, one per line, for the agreement check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "engine/weights/gguf.h"
#include "engine/tokenizer/tokenizer.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int dump_pieces(const char *model) {
    md_err e = {0};
    gguf_file *f;
    tok_tokenizer *t;
    if (gguf_open(model, &f, &e) || tok_load(f, &t, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    gguf_close(f);
    for (int i = 0; i < tok_n_vocab(t); i++) {
        size_t n;
        const char *p = tok_piece(t, i, 1, &n);
        for (size_t k = 0; k < n; k++)
            printf("%02x", (unsigned char)p[k]);
        putchar('\n');
    }
    tok_free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[2], "--pieces"))
        return dump_pieces(argv[1]);
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL TEXT whole|lines REPEATS [IDS_OUT]\n", argv[0]);
        return 2;
    }
    md_err e = {0};
    gguf_file *f;
    tok_tokenizer *t;
    if (gguf_open(argv[1], &f, &e) || tok_load(f, &t, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    gguf_close(f);
    char *text;
    size_t len;
    if (md_read_file(argv[2], 0, &text, &len, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    int lines = !strcmp(argv[3], "lines"), reps = atoi(argv[4]);
    double best = 1e30;
    long long ntok = 0;
    int32_t *keep = NULL;
    int nkeep = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = cpu_s();
        ntok = 0;
        size_t pos = 0;
        while (pos < len) {
            size_t end = len;
            if (lines) {
                const char *nl = memchr(text + pos, '\n', len - pos);
                end = nl ? (size_t)(nl - text) + 1 : len;
            }
            int32_t *ids;
            int n;
            if (tok_encode(t, text + pos, end - pos, 0, 0, &ids, &n, &e)) {
                fprintf(stderr, "%s\n", e.msg);
                return 1;
            }
            ntok += n;
            if (!lines && r == 0) {
                keep = ids;
                nkeep = n;
            } else {
                free(ids);
            }
            pos = end;
        }
        double s = cpu_s() - t0;
        if (s < best)
            best = s;
    }
    if (argc > 5 && keep) {
        FILE *o = fopen(argv[5], "w");
        if (!o) {
            perror(argv[5]);
            return 1;
        }
        for (int i = 0; i < nkeep; i++)
            fprintf(o, "%d\n", keep[i]);
        fclose(o);
    }
    printf("{\"impl\": \"medley\", \"mode\": \"%s\", \"bytes\": %zu, \"tokens\": %lld, "
           "\"seconds\": %.4f, \"mb_per_s\": %.2f}\n",
           argv[3], len, ntok, best, (double)len / best / 1e6);
    free(keep);
    free(text);
    tok_free(t);
    return 0;
}
