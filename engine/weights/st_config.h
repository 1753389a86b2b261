/* st_config.h — a sentence-transformers model directory's pipeline, as the engine's embedder
 * needs it (docs/embeddings.md): modules.json (Transformer, then Pooling, then optionally
 * Normalize, in that order), the Pooling module's config.json (mean, cls, max,
 * mean-sqrt-len or last-token; exactly one), sentence_bert_config.json (max_seq_length), and
 * whether the model card (README.md front matter) declares Matryoshka training, which makes
 * OpenAI's `dimensions` honoured (truncate, then renormalise).
 *
 * Nothing allocated: st_config is a plain value. */
#ifndef MEDLEY_ENGINE_ST_CONFIG_H
#define MEDLEY_ENGINE_ST_CONFIG_H

#include "common/err.h"

typedef enum {
    ST_POOL_MEAN = 0,  /* mean over every token of the sequence, special tokens included */
    ST_POOL_CLS,       /* the first token's state */
    ST_POOL_MAX,       /* element-wise maximum over the tokens */
    ST_POOL_MEAN_SQRT, /* sum / sqrt(tokens) */
    ST_POOL_LAST,      /* the last token's state (decoder models used as embedders) */
} st_pooling;

typedef struct {
    int found; /* 1: DIR had a modules.json; 0: defaults (mean, no normalize) */
    st_pooling pooling;
    int normalize;      /* a Normalize module follows the pooling: L2 to unit length */
    int max_seq_length; /* tokens, 0 when not given (the model's context applies) */
    int dim;            /* word_embedding_dimension, 0 when not given */
    int matryoshka;     /* README.md front matter lists the tag "matryoshka" */
} st_config;

/* Read DIR's sentence-transformers files into c. A directory without modules.json gives
 * found = 0 and the defaults (0 returned). MD_EFORMAT naming the file and key for a
 * malformed one, MD_EUNSUPP for a module or pooling mode medley does not run. */
int st_config_load(const char *dir, st_config *c, md_err *e);
/* The pooling's name as sentence-transformers writes it ("mean", "cls", "max",
 * "mean_sqrt_len_tokens", "lasttoken"). */
const char *st_pooling_name(st_pooling p);

#endif
