/* commands.h — the subcommands of the single `medley` binary. Each returns the process
 * exit status (0 ok, 1 runtime error, 2 usage error); argv[0] is the subcommand name. */
#ifndef MEDLEY_CLI_COMMANDS_H
#define MEDLEY_CLI_COMMANDS_H

int cmd_models(int argc, char **argv);    /* cmd_models.c: list | fetch | inspect */
int cmd_tokenize(int argc, char **argv);  /* cmd_tokenize.c */
int cmd_embed(int argc, char **argv);     /* cmd_embed.c */
int cmd_generate(int argc, char **argv);  /* cmd_generate.c */
int cmd_profile(int argc, char **argv);   /* cmd_profile.c */
int cmd_worker(int argc, char **argv);    /* cmd_worker.c */
int cmd_stage(int argc, char **argv);     /* cmd_stage.c */
int cmd_submit(int argc, char **argv);    /* cmd_client.c */
int cmd_status(int argc, char **argv);    /* cmd_client.c */
int cmd_results(int argc, char **argv);   /* cmd_client.c */
int cmd_cancel(int argc, char **argv);    /* cmd_client.c */
int cmd_batches(int argc, char **argv);   /* cmd_client.c */
int cmd_run(int argc, char **argv);       /* cmd_run.c */
int cmd_scheduler(int argc, char **argv); /* cmd_sched.c */
int cmd_plan(int argc, char **argv);      /* cmd_sched.c */
int cmd_simulate(int argc, char **argv);  /* cmd_sched.c */
int cmd_health(int argc, char **argv);    /* cmd_health.c */
int cmd_dashboard(int argc, char **argv); /* cmd_dashboard.c */
int cmd_api(int argc, char **argv);       /* cmd_api.c */

#endif
