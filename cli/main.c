/* main.c — `medley`: dispatch to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "common/log.h"

#include <stdlib.h>

typedef struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} command;

static const command commands[] = {
    {"run", cmd_run, "run a JSONL batch end to end on this machine (embedded Redis)"},
    {"submit", cmd_submit, "submit a JSONL batch to Redis"},
    {"status", cmd_status, "show batch progress"},
    {"results", cmd_results, "write a batch's output lines"},
    {"cancel", cmd_cancel, "cancel a batch"},
    {"batches", cmd_batches, "list batches"},
    {"worker", cmd_worker, "serve models from Redis queues"},
    {"health", cmd_health, "is a worker alive / ready? (its heartbeat; for probes)"},
    {"stage", cmd_stage, "serve one pipeline stage of a sharded model to a head over TCP"},
    {"scheduler", cmd_scheduler, "plan the fleet continuously and publish plans"},
    {"plan", cmd_plan, "plan a fleet offline"},
    {"simulate", cmd_simulate, "simulate a workload through a plan"},
    {"api", cmd_api, "serve the OpenAI Files + Batches HTTP API over the queue"},
    {"dashboard", cmd_dashboard, "serve a live web page of batches, fleet, plan and DLQ"},
    {"generate", cmd_generate, "generate text with a model"},
    {"tokenize", cmd_tokenize, "tokenize text with a model's tokenizer"},
    {"embed", cmd_embed, "embed texts or token ids with an embedding model"},
    {"models", cmd_models, "list, fetch and inspect models"},
    {"profile", cmd_profile, "measure a device's throughput for the scheduler"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: medley COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`medley COMMAND --help` for a command's options.\n");
}

int main(int argc, char **argv) {
    const char *lvl = getenv("MEDLEY_LOG_LEVEL");
    if (lvl && md_log_level_parse(lvl) >= 0)
        md_log_set_level((md_log_level)md_log_level_parse(lvl));
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "medley: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
