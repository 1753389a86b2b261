/* assets.h — the dashboard's page, script and style, compiled into the binary from
 * dashboard/assets/ (dashboard/CMakeLists.txt writes the byte arrays), so `medley dashboard`
 * serves them with no source tree, no CDN and no network. */
#ifndef MEDLEY_DASHBOARD_ASSETS_H
#define MEDLEY_DASHBOARD_ASSETS_H

#include <stddef.h>

typedef struct {
    const char *path;         /* "/index.html" */
    const char *content_type; /* "text/html; charset=utf-8" */
    const unsigned char *data;
    size_t len; /* bytes (data is NUL-terminated past len) */
} dash_asset;

/* Terminated by an entry whose path is NULL. Static storage: never freed. */
extern const dash_asset dash_assets[];

#endif
