/* metrics_process.c — see metrics_process.h. The figures come from /proc/self/stat (fields
 * 14-15 utime and stime in clock ticks, 22 the start in ticks since boot, 23 vsize in bytes,
 * 24 rss in pages), /proc/stat's btime, /proc/self/fd and RLIMIT_NOFILE: what the official
 * Prometheus clients report under the same names. */
#include "common/metrics_process.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef MEDLEY_BUILD_VERSION
#define MEDLEY_BUILD_VERSION "unknown"
#endif
#ifndef MEDLEY_BUILD_REVISION
#define MEDLEY_BUILD_REVISION "unknown"
#endif
#ifndef MEDLEY_BUILD_CUDA
#define MEDLEY_BUILD_CUDA "unknown"
#endif

typedef struct {
    md_series *cpu, *rss, *vsz, *start, *fds, *max_fds;
    double cpu_seen; /* the counter's value so far (it is added to, not set) */
} proc;

static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return 0;
    char line[256];
    double bt = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) {
            bt = atof(line + 6);
            break;
        }
    fclose(f);
    return bt;
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static void refresh(void *arg) {
    proc *p = arg;
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    /* the command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')' */
    const char *s = strrchr(buf, ')');
    unsigned long long utime = 0, stime = 0, start = 0, vsize = 0;
    long long rss = 0;
    if (s && sscanf(s + 2,
                    "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d "
                    "%*d %llu %llu %lld",
                    &utime, &stime, &start, &vsize, &rss) == 5) {
        double hz = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGE_SIZE);
        double cpu = (double)(utime + stime) / hz;
        md_counter_add(p->cpu, cpu - p->cpu_seen);
        if (cpu > p->cpu_seen)
            p->cpu_seen = cpu;
        md_gauge_set(p->rss, (double)rss * page);
        md_gauge_set(p->vsz, (double)vsize);
        md_gauge_set(p->start, boot_time() + (double)start / hz);
    }
    md_gauge_set(p->fds, count_fds());
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl))
        md_gauge_set(p->max_fds, rl.rlim_cur == RLIM_INFINITY ? -1 : (double)rl.rlim_cur);
}

int md_metrics_process_add(md_metrics *reg, md_err *e) {
    static const char *bl[] = {"version", "revision", "cuda"};
    md_metric *cpu, *rss, *vsz, *start, *fds, *max_fds, *info;
    /* clang-format off */
    if (!(cpu = md_metrics_counter(reg, "process_cpu_seconds_total", "User and system CPU time spent, in seconds.", 0, NULL, 1, e)) ||
        !(rss = md_metrics_gauge(reg, "process_resident_memory_bytes", "Resident memory size in bytes.", 0, NULL, 1, e)) ||
        !(vsz = md_metrics_gauge(reg, "process_virtual_memory_bytes", "Virtual memory size in bytes.", 0, NULL, 1, e)) ||
        !(start = md_metrics_gauge(reg, "process_start_time_seconds", "Start time of the process since the Unix epoch, in seconds.", 0, NULL, 1, e)) ||
        !(fds = md_metrics_gauge(reg, "process_open_fds", "Open file descriptors.", 0, NULL, 1, e)) ||
        !(max_fds = md_metrics_gauge(reg, "process_max_fds", "The limit of open file descriptors.", 0, NULL, 1, e)) ||
        !(info = md_metrics_gauge(reg, "medley_build_info", "The medley build (1): version, git revision at configure time, CUDA backend built.", 3, bl, 1, e)))
        return e->code;
    /* clang-format on */
    proc *p = calloc(1, sizeof *p); /* the registry frees it */
    if (!p)
        return md_errf(e, MD_ENOMEM, "out of memory");
    *p = (proc){md_metric_at0(cpu),
                md_metric_at0(rss),
                md_metric_at0(vsz),
                md_metric_at0(start),
                md_metric_at0(fds),
                md_metric_at0(max_fds),
                0};
    const char *v[] = {MEDLEY_BUILD_VERSION, MEDLEY_BUILD_REVISION, MEDLEY_BUILD_CUDA};
    md_gauge_set(md_metric_at(info, v), 1);
    if (md_metrics_on_render(reg, refresh, p, free)) {
        free(p);
        return md_errf(e, MD_EINVAL, "metrics registry: no room for another render hook");
    }
    return 0;
}
