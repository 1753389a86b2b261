/* test_engine_cli.c — `medley generate` as a user runs it: streamed text, the --json object,
 * a --batch file with good and bad lines (prompts as text and as token ids), usage errors,
 * and device selection without a GPU.
 * Uses $MEDLEY_BIN (set by ctest). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "e2e/test_engine_util.h"
#ifdef MEDLEY_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

static char out[1 << 16];

/* Run a shell command, capture stdout into out; returns the exit status. */
static int run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void) {
    const char *b = getenv("MEDLEY_BIN");
    return b && *b ? b : NULL;
}

static void test_json_output_has_tokens_text_and_timings(void **state) {
    const char *model = test_model_path();
    if (!model || !bin())
        skip();
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "%s generate -m %s -p 'The capital of France is' -n 8 --ignore-eos -t 2 --json "
             "2>/dev/null",
             bin(), model);
    assert_int_equal(run(cmd), 0);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    assert_non_null(j);
    assert_int_equal(json_array_size(json_object_get(j, "tokens")), 8);
    assert_int_equal(json_integer_value(json_object_get(j, "prompt_tokens")), 5);
    assert_true(strlen(json_string_value(json_object_get(j, "text"))) > 0);
    assert_string_equal(json_string_value(json_object_get(j, "finish_reason")), "length");
    json_t *t = json_object_get(j, "timings");
    assert_true(json_real_value(json_object_get(t, "decode_tokens_per_s")) > 0);
    assert_true(json_real_value(json_object_get(t, "prompt_tokens_per_s")) > 0);
    /* streamed text is the same text (greedy) */
    char text[4096];
    snprintf(text, sizeof text, "%s", json_string_value(json_object_get(j, "text")));
    snprintf(cmd, sizeof cmd,
             "%s generate -m %s -p 'The capital of France is' -n 8 --ignore-eos -t 2 2>/dev/null",
             bin(), model);
    assert_int_equal(run(cmd), 0);
    assert_int_equal(strncmp(out, text, strlen(text)), 0);
    json_decref(j);
}

static void test_batch_file_answers_every_line(void **state) {
    const char *model = test_model_path();
    if (!model || !bin())
        skip();
    char in[] = "/tmp/medley-test-batch-XXXXXX";
    int fd = mkstemp(in);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"custom_id\": \"a\", \"prompt\": \"Once upon a time\", \"max_tokens\": 6}\n");
    fprintf(f, "not json\n\n");
    fprintf(f, "{\"custom_id\": \"b\", \"body\": {\"messages\": [{\"role\": \"user\", \"content\": "
               "\"Hi\"}], \"max_tokens\": 4, \"temperature\": 0.7, \"seed\": 3}}\n");
    fprintf(f, "{\"custom_id\": \"c\", \"prompt\": \"x\", \"temperature\": -1}\n");
    fclose(f);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s generate -m %s --batch %s -t 2 2>/dev/null", bin(), model, in);
    assert_int_equal(run(cmd), 1); /* some lines were rejected */
    unlink(in);
    int ok = 0, bad = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        if (json_object_get(j, "error")) {
            bad++;
            assert_non_null(json_object_get(json_object_get(j, "error"), "message"));
        } else {
            ok++;
            assert_true(json_integer_value(json_object_get(j, "completion_tokens")) > 0);
        }
        json_decref(j);
    }
    assert_int_equal(ok, 2);
    assert_int_equal(bad, 2);
}

/* --batch lines asking for logprobs get the tokens, their logprobs and top logprobs as the
 * --json object of the same prompt has them; lines that do not, none; a contradiction is the
 * line's error. */
static void test_batch_logprobs_as_json(void **state) {
    const char *model = test_model_path();
    if (!model || !bin())
        skip();
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "%s generate -m %s -p 'The capital of France is' -n 5 --ignore-eos -t 2 --json "
             "--top-logprobs 3 2>/dev/null",
             bin(), model);
    assert_int_equal(run(cmd), 0);
    json_t *single = json_loads(out, 0, NULL);
    assert_non_null(single);
    char in[] = "/tmp/medley-test-batch-XXXXXX";
    int fd = mkstemp(in);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"custom_id\": \"a\", \"body\": {\"prompt\": \"The capital of France is\", "
               "\"max_tokens\": 5, \"logprobs\": true, \"top_logprobs\": 3}}\n");
    fprintf(f, "{\"custom_id\": \"b\", \"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n");
    fprintf(f, "{\"custom_id\": \"c\", \"prompt\": \"Hi\", \"max_tokens\": 3, \"logprobs\": 2}\n");
    fprintf(f, "{\"custom_id\": \"d\", \"prompt\": \"x\", \"logprobs\": false, "
               "\"top_logprobs\": 2}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --batch %s --ignore-eos -t 2 2>/dev/null", bin(),
             model, in);
    assert_int_equal(run(cmd), 1); /* line d was rejected */
    unlink(in);
    int seen = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        const char *cid = json_string_value(json_object_get(j, "custom_id"));
        assert_non_null(cid);
        json_t *lp = json_object_get(j, "logprobs"), *top = json_object_get(j, "top_logprobs");
        if (!strcmp(cid, "a")) {
            assert_true(
                json_equal(json_object_get(j, "tokens"), json_object_get(single, "tokens")));
            json_t *want = json_object_get(single, "logprobs");
            assert_int_equal(json_array_size(lp), 5);
            assert_int_equal(json_array_size(top), 5);
            for (size_t k = 0; k < 5; k++) {
                double a = json_real_value(json_array_get(lp, k));
                double b = json_real_value(json_array_get(want, k));
                assert_true(a <= 0 && fabs(a - b) < 1e-3);
                json_t *alts = json_array_get(top, k);
                assert_int_equal(json_array_size(alts), 3);
                /* the chosen (greedy) token is the most likely */
                assert_int_equal(
                    json_integer_value(json_object_get(json_array_get(alts, 0), "id")),
                    json_integer_value(json_array_get(json_object_get(j, "tokens"), k)));
            }
        } else if (!strcmp(cid, "b")) {
            assert_null(lp);
            assert_null(top);
            assert_null(json_object_get(j, "tokens"));
        } else if (!strcmp(cid, "c")) {
            assert_int_equal(json_array_size(lp), 3);
            assert_int_equal(json_array_size(json_array_get(top, 0)), 2);
        } else {
            assert_string_equal(cid, "d");
            assert_non_null(
                strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                       "top_logprobs needs logprobs"));
        }
        seen++;
        json_decref(j);
    }
    assert_int_equal(seen, 4);
    json_decref(single);
}

/* A --batch prompt given as token ids (what `medley tokenize --ids` prints for a text) runs
 * as that text does: same prompt tokens, same greedy tokens; a bad id array is the line's
 * error (empty, not integers, negative, beyond the vocabulary). */
static void test_batch_prompt_token_ids(void **state) {
    const char *model = test_model_path();
    if (!model || !bin())
        skip();
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s tokenize -m %s --ids 'Once upon a time' 2>/dev/null", bin(),
             model);
    assert_int_equal(run(cmd), 0);
    char ids[1024];
    int n_ids = 1;
    snprintf(ids, sizeof ids, "%s", out);
    ids[strcspn(ids, "\n")] = 0;
    for (char *c = ids; *c; c++)
        if (*c == ' ') {
            *c = ',';
            n_ids++;
        }
    char in[] = "/tmp/medley-test-batch-XXXXXX";
    int fd = mkstemp(in);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"custom_id\": \"text\", \"prompt\": \"Once upon a time\", \"max_tokens\": 6, "
               "\"logprobs\": true}\n");
    fprintf(f,
            "{\"custom_id\": \"ids\", \"prompt\": [%s], \"max_tokens\": 6, "
            "\"logprobs\": true}\n",
            ids);
    fprintf(f, "{\"custom_id\": \"empty\", \"prompt\": []}\n");
    fprintf(f, "{\"custom_id\": \"str\", \"prompt\": [1, \"2\"]}\n");
    fprintf(f, "{\"custom_id\": \"neg\", \"prompt\": [1, -3]}\n");
    fprintf(f, "{\"custom_id\": \"big\", \"prompt\": [1, 99999999]}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate -m %s --batch %s --ignore-eos -t 2 2>/dev/null", bin(),
             model, in);
    assert_int_equal(run(cmd), 1); /* the four bad lines */
    unlink(in);
    json_t *text = NULL, *byid = NULL;
    int bad = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        const char *cid = json_string_value(json_object_get(j, "custom_id"));
        assert_non_null(cid);
        if (!strcmp(cid, "text")) {
            text = j;
        } else if (!strcmp(cid, "ids")) {
            byid = j;
        } else {
            const char *msg =
                json_string_value(json_object_get(json_object_get(j, "error"), "message"));
            assert_non_null(msg);
            if (!strcmp(cid, "empty"))
                assert_non_null(strstr(msg, "needs 1 to"));
            else if (!strcmp(cid, "str"))
                assert_non_null(strstr(msg, "prompt[1] is not a token id"));
            else if (!strcmp(cid, "neg"))
                assert_non_null(strstr(msg, "prompt[1] is not a token id"));
            else
                assert_non_null(strstr(msg, "99999999"));
            bad++;
            json_decref(j);
        }
    }
    assert_int_equal(bad, 4);
    assert_non_null(text);
    assert_non_null(byid);
    assert_int_equal(json_integer_value(json_object_get(byid, "prompt_tokens")), n_ids);
    assert_int_equal(json_integer_value(json_object_get(text, "prompt_tokens")), n_ids);
    assert_int_equal(json_array_size(json_object_get(byid, "tokens")), 6);
    assert_true(json_equal(json_object_get(text, "tokens"), json_object_get(byid, "tokens")));
    json_decref(text);
    json_decref(byid);
}

static void test_usage_errors_exit_2(void **state) {
    if (!bin())
        skip();
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s generate -p hi 2>/dev/null", bin());
    assert_int_equal(run(cmd), 2); /* no model */
    snprintf(cmd, sizeof cmd, "%s generate -m x -p hi --temp abc 2>/dev/null", bin());
    assert_int_equal(run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s generate -m x -p hi --top-p 3 2>/dev/null", bin());
    assert_int_equal(run(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s generate -m /nonexistent/model.gguf -p hi 2>/dev/null", bin());
    assert_int_equal(run(cmd), 1);
}

/* No GPU: the default device (auto) runs on the CPU and says why in one info line; a named
 * GPU is a clear error (exit 1) for generate, worker and run alike; a worker given several
 * devices checks them all before it starts a child worker for any (worker/supervise.h). */
static void test_device_auto_without_gpu_runs_on_cpu(void **state) {
    const char *model = test_model_path();
    if (!model || !bin())
        skip();
    char cmd[8192];
#ifdef MEDLEY_HAVE_CUDA
    if (md_cuda_device_count(NULL, 0) > 0)
        skip(); /* a GPU is here: auto is cuda:0 (tests/gpu) */
#endif
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Hello' -n 2 -t 2 2>&1 >/dev/null", bin(),
             model);
    assert_int_equal(run(cmd), 0);
    assert_non_null(strstr(out, "auto: cpu: "));
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Hello' -n 2 --device cuda:0 2>&1", bin(),
             model);
    assert_int_equal(run(cmd), 1);
    assert_true(strstr(out, "built without CUDA") || strstr(out, "no CUDA device is usable"));
    /* the worker checks its device before touching Redis (none listens on port 1) */
    snprintf(cmd, sizeof cmd,
             "%s worker --model smollm2 --device cuda:0 --redis redis://127.0.0.1:1/0 "
             "--log-text 2>&1",
             bin());
    assert_int_equal(run(cmd), 1);
    assert_true(strstr(out, "built without CUDA") || strstr(out, "no CUDA device is usable"));
    snprintf(cmd, sizeof cmd,
             "%s worker --model smollm2 --devices cuda:0,cuda:1 --redis redis://127.0.0.1:1/0 "
             "2>&1",
             bin());
    assert_int_equal(run(cmd), 1); /* every device is checked before any child starts */
    assert_non_null(strstr(out, "--devices entry 1 of 2"));
    assert_true(strstr(out, "built without CUDA") || strstr(out, "no CUDA device is usable"));
    assert_non_null(strstr(out, "nothing started"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_output_has_tokens_text_and_timings),
        cmocka_unit_test(test_batch_file_answers_every_line),
        cmocka_unit_test(test_batch_logprobs_as_json),
        cmocka_unit_test(test_batch_prompt_token_ids),
        cmocka_unit_test(test_usage_errors_exit_2),
        cmocka_unit_test(test_device_auto_without_gpu_runs_on_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
