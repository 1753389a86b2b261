/* model_check.c — the engine's load-time refusals, without a backend. */
#include "engine/model_check.h"

#include "engine/model/encoder.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"

/* An encoder: its weights bound on a one-thread CPU backend (aliased, nothing copied) and
 * freed. Its tokenizer is not required: token-id inputs work without one. */
static int encoder_loadable(const gguf_file *gf, md_err *e) {
    md_backend *be = NULL;
    md_encoder *m = NULL;
    int rc = md_backend_open("cpu", 1, &be, e);
    if (rc == 0 && (rc = md_encoder_load(gf, be, 1, &m, e)) == 0)
        md_encoder_free(m);
    md_backend_free(be);
    return rc;
}

int md_model_loadable(const gguf_file *gf, md_err *e) {
    if (md_encoder_is(gf))
        return encoder_loadable(gf, e);
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
