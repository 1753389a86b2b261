/* test_engine_util.h — shared by the engine e2e tests: where the test model is, and reading
 * the llama.cpp fixtures in tests/fixtures/engine/. */
#ifndef MEDLEY_TESTS_ENGINE_UTIL_H
#define MEDLEY_TESTS_ENGINE_UTIL_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define TEST_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

/* $MEDLEY_MODELS, else ${XDG_CACHE_HOME:-$HOME/.cache}/medley/models; NULL if absent. */
static inline const char *test_model_path(void) {
    static char path[4096];
    const char *d = getenv("MEDLEY_MODELS");
    if (d && *d) {
        snprintf(path, sizeof path, "%s/%s", d, TEST_MODEL_FILE);
    } else {
        const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
        if (x && *x)
            snprintf(path, sizeof path, "%s/medley/models/%s", x, TEST_MODEL_FILE);
        else
            snprintf(path, sizeof path, "%s/.cache/medley/models/%s", h ? h : ".", TEST_MODEL_FILE);
    }
    return access(path, R_OK) == 0 ? path : NULL;
}

static inline json_t *test_fixture(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/engine/%s", MEDLEY_FIXTURES, name);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j)
        fprintf(stderr, "fixture %s: %s (line %d)\n", path, je.text, je.line);
    return j;
}

/* Copy a JSON array of integers into a malloc'd int32 array. */
static inline int32_t *test_ids(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

#endif
