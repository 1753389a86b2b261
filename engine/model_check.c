/* model_check.c — the engine's load-time refusals, without a backend. */
#include "engine/model_check.h"

#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"

int md_model_loadable(const gguf_file *gf, md_err *e) {
    md_hparams hp;
    tok_tokenizer *t = NULL;
    int rc = md_model_check(gf, &hp, e);
    if (rc)
        return rc;
    if ((rc = md_model_tokenizer(gf, &t, e)))
        return md_errctx(e, "tokenizer: ");
    int n = tok_n_vocab(t);
    tok_free(t);
    if (n > hp.n_vocab) /* as md_engine_open refuses it */
        return md_errf(e, MD_EFORMAT, "tokenizer has %d tokens, the output head %d", n, hp.n_vocab);
    return 0;
}
