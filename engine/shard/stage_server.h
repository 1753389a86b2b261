/* stage_server.h — the far end of a TCP stage link (engine/shard/link_tcp.c): `medley stage
 * --listen HOST:PORT` serves one pipeline stage (engine/shard/stage.h) to one head at a time over
 * engine/shard/wire.h frames, to heads that hold its secret only, and only the models it was
 * told to serve.
 *
 * One thread, one poll loop over the listening socket, the head being served and every
 * connection still in its handshake (engine/shard/stage_accept.h): no peer is ever waited on
 * while another has something to say, so idle or trickling connections cannot delay a head.
 * A connection gets a CHALLENGE at once and must send a HELLO signed with the secret within
 * opts.handshake_ms, or it is dropped; one whose signature fails is refused ("authentication
 * failed") before any field of its HELLO is read. A signed HELLO must name one of opts.models
 * exactly (a registry name, "synthetic:...", or a path the operator gave): any other name is
 * refused with one fixed sentence, whatever it names, and nothing is opened or looked up for
 * it. Then the server loads the stage — on its own device, threads and memory cap, the
 * HELLO's device being only a hint — and answers a signed READY, or ERROR with the reason
 * and closes. Then every RUN is checked (md_batch_check) and run, and its RESULT sent back;
 * a head silent for opts.io_ms (it PINGs while idle) is dropped. The loaded stage is kept
 * when the connection ends: a head that re-forms its replica with the same model, layers and
 * sizes finds it loaded. Another signed head while one is served gets ERROR "busy serving
 * head H:P" and is closed. Any fault of a head (malformed frame, a layout md_batch_check
 * refuses, silence in mid-frame) closes that head's connection after an ERROR saying why,
 * and the server goes on; a failed md_stage_run also unloads the stage, as the device may be
 * unusable.
 *
 * Ownership: everything the server makes (sockets, the stage, buffers) is released before
 * md_stage_serve returns. Logs go through MD_INFO / MD_WARN, component "stage". */
#ifndef MEDLEY_ENGINE_STAGE_SERVER_H
#define MEDLEY_ENGINE_STAGE_SERVER_H

#include <signal.h>
#include <stddef.h>

#include "common/err.h"
#include "engine/shard/stage_auth.h"

typedef struct {
    const char *device; /* "cpu", "cpu:N", "cuda:K", ...; NULL: the HELLO's */
    int n_threads;      /* CPU threads of the stage (0 = every core), whatever the HELLO says */
    size_t mem_cap;     /* bytes (0 = none); when the HELLO has one too, the smaller holds */
    const md_stage_secret *secret; /* required: heads sign their HELLO with it */
    const char *const *models;     /* required: the model names a HELLO may ask for */
    int n_models;
    int handshake_ms; /* a new connection's signed HELLO must arrive within (0 = 10000) */
    int io_ms;        /* a frame, once begun, must arrive whole within, a RESULT be taken, and a
                         head send something (RUN or PING) at least this often (0 = 60000) */
    int max_pending;  /* connections in their handshake at once; a new one pushes out the
                         oldest (0 = 256) */
    /* Called once the socket listens, with the port it got (port 0 asks the kernel for one);
     * NULL for none. */
    void (*on_listen)(void *arg, int port);
    void *arg;
} md_stage_server_opts;

/* Listen on listen_host:port (NULL or "*": every IPv4 address, "::" every address) and serve
 * heads until *stop (may be NULL: until the process ends) becomes non-zero; checked at least
 * every 100 ms while idle and between steps. Returns 0 when stopped, or the error that kept
 * it from listening (MD_EIO: the address is taken, ...; MD_EINVAL: no secret or no model).
 * Logs "stage: listening on HOST:PORT" once bound. */
int md_stage_serve(const char *listen_host, int port, const md_stage_server_opts *opts,
                   volatile sig_atomic_t *stop, md_err *e);

#endif
