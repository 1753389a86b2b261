/* online.c — see online.h: the online lane's keys and the streaming cut. */
#include "queue/online.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "queue/queue.h"

void q_key_online(char *out, const char *p, const char *m) {
    snprintf(out, Q_KEY_MAX, "%sonline:{%s}", p, m);
}
void q_key_reply(char *out, const char *p, const char *r) {
    snprintf(out, Q_KEY_MAX, "%sreply:{%s}", p, r);
}
void q_key_cancel(char *out, const char *p, const char *r) {
    snprintf(out, Q_KEY_MAX, "%scancel:{%s}", p, r);
}

int q_online_id_ok(const char *id) {
    size_t n = strlen(id);
    if (!n || n >= Q_ONLINE_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '_' && id[i] != '-')
            return 0;
    return 1;
}

int q_online_model_ok(const char *model) {
    size_t n = strlen(model);
    if (!n || n > 127)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)model[i];
        if (c <= 0x20 || c >= 0x7f || c == '{' || c == '}')
            return 0;
    }
    return 1;
}

size_t q_online_publishable(const char *text, size_t len, const char *const *stop, int n_stop) {
    size_t hold = 0;
    for (int i = 0; i < n_stop; i++) {
        size_t sl = strlen(stop[i]);
        /* the longest k <= min(len, sl) with text ending in stop[i][0..k) */
        for (size_t k = sl < len ? sl : len; k > hold; k--)
            if (!memcmp(text + len - k, stop[i], k)) {
                hold = k;
                break;
            }
    }
    return len - hold;
}
