/* link_tcp.c — placeholder until the TCP transport lands. */
#include "engine/link.h"
int md_link_tcp_open(const char *host, int port, const md_stage_config *c, int timeout_ms,
                     md_link **out, md_err *e) {
    (void)c, (void)timeout_ms;
    *out = NULL;
    return md_errf(e, MD_EUNSUPP, "tcp://%s:%d: the TCP transport is not built yet", host, port);
}
