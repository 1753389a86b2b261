/* runner_engine.c — the engine runner (chat template -> tokens -> md_engine_submit -> step
 * loop -> text and usage). This build has no inference engine yet (engine/engine.c has not
 * landed), so opening it fails with a message that says so: a worker asked to serve a
 * real model stops at startup instead of accepting jobs it cannot run. */
#include "common/err.h"
#include "worker/runner_impl.h"

int wk_engine_open(const char *model, const wk_runner_opts *o, void **self, md_err *e) {
    *self = NULL;
    return md_errf(e, MD_EUNSUPP,
                   "this medley build has no inference engine yet; only the 'echo' model can be "
                   "served");
}

static int unavailable(void *self) {
    return 0;
}
static const char *no_device(void *self) {
    return "none";
}
static int no_start(void *self, const wk_request *req, void *tag, md_err *e) {
    return md_errf(e, MD_EUNSUPP, "no inference engine in this build");
}
static int no_poll(void *self, int wait_ms, wk_done_fn done, void *ctx, md_err *e) {
    return 0;
}
static void no_close(void *self) {}

const wk_runner_ops wk_engine_ops = {
    .kind = "engine",
    .capacity = unavailable,
    .live = unavailable,
    .n_ctx = unavailable,
    .device = no_device,
    .start = no_start,
    .poll = no_poll,
    .close = no_close,
};
