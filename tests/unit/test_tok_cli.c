/* test_tok_cli.c — `medley tokenize` end to end: JSON lines from stdin (one input per line),
 * ids mode, exit statuses for usage and runtime errors. Runs $MEDLEY_BIN (set by ctest) on
 * SmolLM2 (skipped when the model is not fetched). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

static const char *model_path(void) {
    static char path[4096];
    const char *d = getenv("MEDLEY_MODELS"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (d && *d)
        snprintf(path, sizeof path, "%s/%s", d, MODEL_FILE);
    else if (x && *x)
        snprintf(path, sizeof path, "%s/medley/models/%s", x, MODEL_FILE);
    else
        snprintf(path, sizeof path, "%s/.cache/medley/models/%s", h ? h : ".", MODEL_FILE);
    return access(path, R_OK) == 0 ? path : NULL;
}

/* Run a shell command; its stdout (up to cap) in out; returns the exit status. */
static int run(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void) {
    const char *b = getenv("MEDLEY_BIN");
    if (!b || access(b, X_OK))
        skip();
    return b;
}

static void json_lines_from_stdin_one_input_per_line(void **st) {
    const char *m = model_path(), *b = bin();
    if (!m)
        skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd,
             "printf 'Hello world\\r\\n<|im_start|>user\\n' | '%s' tokenize -m '%s' --json -", b,
             m);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_string_equal(out, "{\"ids\":[19556,905],\"pieces\":[\"Hello\",\"\xc4\xa0world\"]}\n"
                             "{\"ids\":[1,4093],\"pieces\":[\"<|im_start|>\",\"user\"]}\n");
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m '%s' --ids --no-special '<|im_end|>'", b, m);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_string_equal(out, "44 108 306 79 486 108 46\n");
}

static void usage_and_runtime_errors_have_their_exit_status(void **st) {
    const char *b = bin();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd, "'%s' tokenize 2>/dev/null", b);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    snprintf(cmd, sizeof cmd, "'%s' tokenize -m /nonexistent/x.gguf hi 2>/dev/null", b);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    snprintf(cmd, sizeof cmd, "'%s' tokenize --bogus 2>/dev/null", b);
    assert_int_equal(run(cmd, out, sizeof out), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_lines_from_stdin_one_input_per_line),
        cmocka_unit_test(usage_and_runtime_errors_have_their_exit_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
