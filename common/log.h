/* log.h — leveled logging to stderr, human text by default or one JSON object per line
 * (`md_log_set_json(1)`, used by daemons). Never call from a hot loop. */
#ifndef MEDLEY_COMMON_LOG_H
#define MEDLEY_COMMON_LOG_H

typedef enum { MD_LOG_DEBUG = 0, MD_LOG_INFO, MD_LOG_WARN, MD_LOG_ERROR } md_log_level;

void md_log_set_level(md_log_level lvl);
/* Level from a name ("debug", "info", "warn", "error"); returns -1 if unknown. */
int md_log_level_parse(const char *name);
void md_log_set_json(int on);
int md_log_json(void); /* 1 when lines are JSON objects (for child processes' flags) */
/* component: short module name ("worker", "gguf"). */
void md_log(md_log_level lvl, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define MD_DEBUG(c, ...) md_log(MD_LOG_DEBUG, c, __VA_ARGS__)
#define MD_INFO(c, ...) md_log(MD_LOG_INFO, c, __VA_ARGS__)
#define MD_WARN(c, ...) md_log(MD_LOG_WARN, c, __VA_ARGS__)
#define MD_ERROR(c, ...) md_log(MD_LOG_ERROR, c, __VA_ARGS__)

#endif
