/* child.c — see child.h. */
#include "cli/child.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *cli_python(void) {
    const char *p = getenv("MEDLEY_PYTHON");
    return p && *p ? p : "python3";
}

int cli_run_child(char *const argv[], char *out, size_t outsz, md_err *e) {
    int fds[2] = {-1, -1};
    if (out && pipe(fds) != 0)
        return md_errf(e, MD_EIO, "pipe: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        if (out) {
            close(fds[0]);
            close(fds[1]);
        }
        return md_errf(e, MD_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        if (out) {
            dup2(fds[1], 1);
            close(fds[0]);
            close(fds[1]);
        }
        execvp(argv[0], argv);
        fprintf(stderr, "medley: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    size_t n = 0;
    if (out) {
        close(fds[1]);
        ssize_t r;
        char sink[4096];
        while ((r = read(fds[0], n + 1 < outsz ? out + n : sink,
                         n + 1 < outsz ? outsz - 1 - n : sizeof sink)) > 0 ||
               (r < 0 && errno == EINTR))
            if (r > 0 && n + 1 < outsz)
                n += (size_t)r;
        out[n] = '\0';
        close(fds[0]);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return md_errf(e, MD_EIO, "waiting for %s: %s", argv[0], strerror(errno));
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    if (WIFEXITED(st))
        return md_errf(e, MD_EIO, "%s exited with status %d", argv[0], WEXITSTATUS(st));
    return md_errf(e, MD_EIO, "%s was killed by signal %d", argv[0], WTERMSIG(st));
}
