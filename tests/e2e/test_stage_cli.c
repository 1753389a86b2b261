/* test_stage_cli.c — `medley stage` as an operator runs it: it prints the port it got for
 * --listen HOST:0, `medley generate --stages` through stage processes gives the tokens of a
 * one-device run (synthetic:tiny with both layers remote; SmolLM2 in three stages, the inner
 * and the last remote, when the model is fetched), SIGTERM stops it with exit 0, and usage
 * errors and a taken port are refused with a sentence. Uses $MEDLEY_BIN (set by ctest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "e2e/stage_proc.h"
#include "e2e/test_engine_util.h"

static char out[1 << 16];

static const char *bin(void) {
    const char *b = getenv("MEDLEY_BIN");
    return b && *b ? b : NULL;
}

/* Run a shell command, stdout into out; its exit status. */
static int run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The "tokens" of `medley generate --json` for model with extra flags, as JSON text. */
static void tokens_of(const char *model, const char *extra, char *tokens, size_t sz) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "%s generate -m %s -p 'Once upon a time' -n 12 --ignore-eos -t 1 --json %s "
             "2>/dev/null",
             bin(), model, extra);
    if (run(cmd))
        fail_msg("failed: %s", cmd);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    assert_non_null(j);
    char *t = json_dumps(json_object_get(j, "tokens"), JSON_COMPACT);
    assert_non_null(t);
    assert_int_equal(json_array_size(json_object_get(j, "tokens")), 12);
    snprintf(tokens, sz, "%s", t);
    free(t);
    json_decref(j);
}

static void test_generate_through_stage_processes_equals_one_device(void **state) {
    if (!bin())
        skip();
    stage_proc a, b;
    assert_int_equal(stage_start(&a, "127.0.0.1:0"), 0);
    assert_int_equal(stage_start(&b, "127.0.0.1:0"), 0);
    char one[512], staged[512], spec[256];
    tokens_of("synthetic:tiny", "", one, sizeof one);
    snprintf(spec, sizeof spec, "--stages tcp://127.0.0.1:%d/cpu:0-0,tcp://127.0.0.1:%d/cpu:1-1",
             a.port, b.port);
    tokens_of("synthetic:tiny", spec, staged, sizeof staged);
    assert_string_equal(one, staged);
    /* a second head finds the stages loaded */
    tokens_of("synthetic:tiny", spec, staged, sizeof staged);
    assert_string_equal(one, staged);
    assert_int_equal(stage_stop(&a), 0);
    assert_int_equal(stage_stop(&b), 0);
    const char *log = slurp(a.log);
    if (!strstr(log, "already loaded") || !strstr(log, "stopping"))
        fail_msg("stage log:\n%s", log);
    unlink(a.log);
    unlink(b.log);
}

static void test_smollm2_in_three_stages_two_remote(void **state) {
    const char *model = test_model_path();
    if (!bin() || !model)
        skip();
    stage_proc a, b;
    assert_int_equal(stage_start(&a, "127.0.0.1:0"), 0);
    assert_int_equal(stage_start(&b, "127.0.0.1:0"), 0);
    char one[512], staged[512], spec[256];
    tokens_of(model, "", one, sizeof one);
    snprintf(spec, sizeof spec,
             "--stages cpu:0-9,tcp://127.0.0.1:%d/cpu:10-19,tcp://127.0.0.1:%d/cpu:20-29", a.port,
             b.port);
    tokens_of(model, spec, staged, sizeof staged);
    assert_string_equal(one, staged);
    assert_int_equal(stage_stop(&a), 0);
    assert_int_equal(stage_stop(&b), 0);
    unlink(a.log);
    unlink(b.log);
}

static void test_usage_errors_and_a_taken_port(void **state) {
    if (!bin())
        skip();
    static const struct {
        const char *args;
        int status;
        const char *says;
    } cases[] = {
        {"", 2, "--listen HOST:PORT is required"},
        {"--listen nohost", 2, "expected HOST:PORT"},
        {"--listen 127.0.0.1:70000", 2, "expected HOST:PORT"},
        {"--listen [::1:7701", 2, "expected HOST:PORT"},
        {"--listen 127.0.0.1:0 --mem-cap lots", 2, "--mem-cap needs a size"},
        {"--listen 127.0.0.1:0 --threads -2", 2, "--threads needs an integer"},
        {"--listen 127.0.0.1:0 --bogus 1", 2, "unknown option --bogus"},
        {"--listen 127.0.0.1:0 --secret-file $S", 2, "--model M is required"},
        {"--listen 127.0.0.1:0 --model m --model ''", 2, "--model needs a name"},
        {"--listen 127.0.0.1:0 --model m", 2,
         "needs the stage secret: a file given by --secret-file"},
        {"--listen 127.0.0.1:0 --model m --secret-file /nonexistent/key", 2,
         "stage secret file /nonexistent/key: No such file"},
        {"--listen 127.0.0.1:0 --model m --secret-file /dev/null", 2, "holds 0 bytes"},
        {"--listen 127.0.0.1:0 --model m --secret-file $S --max-pending 0", 2,
         "--max-pending needs an integer"},
        {"--listen 127.0.0.1:0 --model m --secret-file $S --device gpu0", 2, "--device gpu0: "},
        {"--listen 127.0.0.1:0 --model m --secret-file $S --device cuda:0", 1, "without CUDA"},
    };
    char cmd[1024];
    const char *secret = stage_secret_file();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
#ifdef MEDLEY_HAVE_CUDA
        if (cases[i].status == 1)
            continue;
#endif
        snprintf(cmd, sizeof cmd, "S=%s; env -u MEDLEY_STAGE_SECRET_FILE %s stage %s 2>&1", secret,
                 bin(), cases[i].args);
        int st = run(cmd);
        if (st != cases[i].status || !strstr(out, cases[i].says))
            fail_msg("medley stage %s: exit %d, '%s'", cases[i].args, st, out);
    }
    snprintf(cmd, sizeof cmd, "%s stage --help", bin());
    assert_int_equal(run(cmd), 0);
    assert_non_null(strstr(out, "usage: medley stage --listen HOST:PORT --secret-file FILE"));

    stage_proc a, b;
    assert_int_equal(stage_start(&a, "127.0.0.1:0"), 0);
    char taken[32];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", a.port);
    assert_int_equal(stage_start(&b, taken), 1);
    assert_non_null(strstr(slurp(b.log), "cannot listen on 127.0.0.1"));
    assert_int_equal(stage_stop(&a), 0);
    unlink(a.log);
    unlink(b.log);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_through_stage_processes_equals_one_device),
        cmocka_unit_test(test_smollm2_in_three_stages_two_remote),
        cmocka_unit_test(test_usage_errors_and_a_taken_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
