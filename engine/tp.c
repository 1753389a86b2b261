/* tp.c — tensor-parallel stages (tp.h). */
#include "engine/tp.h"

int md_tp_open(const md_stage_config *c, const gguf_file *gf, md_tp **out, md_err *e) {
    (void)c;
    (void)gf;
    *out = NULL;
    return md_errf(e, MD_EUNSUPP, "tensor parallelism is not built yet");
}
void md_tp_close(md_tp *t) {
    (void)t;
}
int md_tp_run(md_tp *t, const md_batch *b, const float *in, float *out, md_err *e) {
    (void)t, (void)b, (void)in, (void)out;
    return md_errf(e, MD_EUNSUPP, "tensor parallelism is not built yet");
}
const char *md_tp_describe(md_tp *t) {
    (void)t;
    return "";
}
