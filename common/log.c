/* log.c — see log.h. One write(2)-sized fprintf per line so lines from threads and
 * processes sharing stderr do not interleave. */
#include "common/log.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static md_log_level g_level = MD_LOG_INFO;
static int g_json = 0;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void md_log_set_level(md_log_level lvl) { g_level = lvl; }
void md_log_set_json(int on) { g_json = on; }
int md_log_json(void) { return g_json; }

int md_log_level_parse(const char *name) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

void md_log(md_log_level lvl, const char *component, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (lvl < g_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);

    pthread_mutex_lock(&g_lock);
    if (g_json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "ts", when, "level", names[lvl], "component",
                              component ? component : "medley", "msg", msg);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (s)
            fprintf(stderr, "%s\n", s);
        free(s);
        json_decref(o);
    } else {
        fprintf(stderr, "%s %-5s %s: %s\n", when, names[lvl], component ? component : "medley", msg);
    }
    fflush(stderr);
    pthread_mutex_unlock(&g_lock);
}
